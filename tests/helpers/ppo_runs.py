"""Whole PPO runs for the tests: started in-process through the app, their metrics and parameters, and
the check that a run crashed after update 4 and resumed ends as the uninterrupted one did."""
import json

import numpy as np
import pytest
import torch

from fiberrl.app import run
from fiberrl.app_config import compose

FAST = ["algo=ppo", "tensorboard=false", "algo.eval_every=0"]
# what depends on the machine's load or clock, not on what the run computes
TIMING = ("time_s", "wall_time", "iteration_s", "rollout_s", "update_s", "rollout_wait_s", "rollout_collect_s",
          "rollout_inference_s", "charts/SPS")


class Interrupted(Exception):
    pass


def train(tmp_path, name, overrides, on_iteration=None):
    return run(compose([*FAST, *overrides]), tmp_path / name, on_iteration=on_iteration)


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def parameters(summary):
    return torch.nn.utils.parameters_to_vector(summary["agent"].parameters()).detach().cpu().numpy()


def crash_after_update_4_and_resume(tmp_path, settings, whole) -> list[dict]:
    """Run ``settings`` into tmp_path/parts, crash it after update 4 (its last checkpoint was after
    update 3, so update 4 is logged and lost), resume it, and check that it ends as ``whole`` (the
    summary of the uninterrupted run in tmp_path/whole) did, metrics included; returns those metrics
    without their timings."""
    def crash_after_update_4(update, _envs):
        if update == 4:
            raise Interrupted
    with pytest.raises(Interrupted):
        train(tmp_path, "parts", settings, on_iteration=crash_after_update_4)
    resumed = train(tmp_path, "parts", [*settings, f"resume={tmp_path / 'parts'}"])
    assert np.array_equal(parameters(whole), parameters(resumed))
    strip = untimed(metrics(tmp_path / "whole"))
    assert strip == untimed(metrics(tmp_path / "parts"))
    return strip
