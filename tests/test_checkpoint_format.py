"""Checkpoints written by an older fiberrl resume as today's: a format of an
older number is upgraded in one place (``fiberrl.run.upgrade_checkpoint``), a
setting added since the checkpoint was made is taken to have had its default,
and a checkpoint of a newer format is refused in one line."""
import json
from pathlib import Path

import numpy as np
import pytest

from fiberrl.app import run
from fiberrl.app_config import compose
from fiberrl.run import CHECKPOINT_FORMAT, CheckpointMismatch, NoUsableCheckpoint, load_npz, save_npz
from helpers.small_runs import SMALL_PPO, small_es

# every test here trains a run (pool workers, env servers)
pytestmark = pytest.mark.slow

# a noise table no other test uses
SEED, NOISE_SIZE = 4183, 100_019
ES = small_es(SEED, NOISE_SIZE)
PPO = SMALL_PPO


class Stop(Exception):
    pass


def as_format_1(run_dir: Path, without: tuple = ()) -> None:
    """Rewrite every checkpoint as format 1 wrote it: no format, PPO's env steps as global_step, and
    the settings ``without`` (("algo", "sigma_decay"), ...) not yet in its fingerprint."""
    for path in sorted((run_dir / "checkpoints").glob("*.npz")):
        arrays, values = load_npz(path)
        assert values.pop("format") == CHECKPOINT_FORMAT
        if "env_server_restarts" in values:  # PPO's
            values["global_step"] = values.pop("timesteps")
        for group, name in without:
            del values["fingerprint"][group][name]
        save_npz(path, arrays, values)


def test_an_es_checkpoint_of_format_1_from_before_two_settings_resumes_to_the_uninterrupted_run(tmp_path):
    whole = run(compose([*ES, "algo.iterations=4"]), tmp_path / "whole")
    run(compose([*ES, "algo.iterations=2"]), tmp_path / "parts")
    as_format_1(tmp_path / "parts", without=(("algo", "sigma_decay"), ("env", "engine")))
    resumed = run(compose([*ES, "algo.iterations=4", f"resume={tmp_path / 'parts'}"]), tmp_path / "parts")
    assert resumed["iterations"] == 4 and resumed["timesteps"] == whole["timesteps"]
    assert np.array_equal(resumed["theta"], whole["theta"])


def test_a_setting_missing_from_an_older_checkpoint_is_taken_at_its_default_and_refused_when_not_that_here(tmp_path):
    run(compose([*ES, "algo.iterations=1", "algo.sigma_decay=0.99"]), tmp_path / "decayed")
    as_format_1(tmp_path / "decayed", without=(("algo", "sigma_decay"),))
    with pytest.raises(CheckpointMismatch, match=r"algo\.sigma_decay=1\.0 there, 0\.99 here"):
        run(compose([*ES, "algo.iterations=2", "algo.sigma_decay=0.99", f"resume={tmp_path / 'decayed'}"]),
            tmp_path / "decayed")


def test_an_es_checkpoint_from_before_noise_seed_ran_on_its_own_seeds_table(tmp_path):
    """Runs share one noise table now (algo.noise_seed, 0); before, a run's table was drawn from its seed."""
    run(compose([*ES, "algo.iterations=1"]), tmp_path / "old")
    as_format_1(tmp_path / "old", without=(("algo", "noise_seed"),))
    shared_table = [o for o in ES if not o.startswith("algo.noise_seed=")]
    with pytest.raises(CheckpointMismatch, match=rf"algo\.noise_seed={SEED} there, 0 here"):
        run(compose([*shared_table, "algo.iterations=2", f"resume={tmp_path / 'old'}"]), tmp_path / "old")
    resumed = run(compose([*ES, "algo.iterations=2", f"resume={tmp_path / 'old'}"]), tmp_path / "old")
    assert resumed["iterations"] == 2


def test_a_ppo_checkpoint_of_format_1_goes_on_counting_its_env_steps(tmp_path):
    whole = run(compose([*PPO, "algo.total_timesteps=64"]), tmp_path / "whole")
    def stopped_after_update_1(update, envs):
        if update == 1:
            raise Stop
    with pytest.raises(Stop):
        run(compose([*PPO, "algo.total_timesteps=64"]), tmp_path / "parts", on_iteration=stopped_after_update_1)
    as_format_1(tmp_path / "parts")
    resumed = run(compose([*PPO, "algo.total_timesteps=64", f"resume={tmp_path / 'parts'}"]), tmp_path / "parts")
    assert resumed["iterations"] == whole["iterations"] == 4 and resumed["timesteps"] == whole["timesteps"] == 64
    rows = [json.loads(line) for line in (tmp_path / "parts" / "metrics.jsonl").read_text().splitlines()]
    assert [row["timesteps"] for row in rows] == [16, 32, 48, 64]


def test_a_checkpoint_of_a_newer_format_is_refused_in_one_line(tmp_path):
    run(compose([*ES, "algo.iterations=1"]), tmp_path / "newer")
    for path in (tmp_path / "newer" / "checkpoints").glob("*.npz"):
        arrays, values = load_npz(path)
        save_npz(path, arrays, dict(values, format=CHECKPOINT_FORMAT + 1))
    with pytest.raises(NoUsableCheckpoint, match="written by a newer fiberrl than this one"):
        run(compose([*ES, "algo.iterations=2", f"resume={tmp_path / 'newer'}"]), tmp_path / "newer")
