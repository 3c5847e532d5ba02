"""Resuming from a run directory whose files were damaged (a disk that filled up,
a kill mid-write, a copy cut short): a damaged checkpoint is reported and the
newest whole one is used, damaged metrics lines are dropped, a run with nothing
to resume starts clean, and a resume that cannot go on says so in one line and
leaves no noise table behind."""
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from fiberrl.app import run
from fiberrl.app_config import compose
from fiberrl.rl.noise import table_path
from fiberrl.run import CheckpointMismatch, RunDirectory
from helpers.small_runs import SMALL_PPO, small_es

REPO = Path(__file__).resolve().parent.parent
# a noise table no other test uses, so that the /dev/shm checks see only this file's runs
SEED, NOISE_SIZE = 4177, 100_003
ES = small_es(SEED, NOISE_SIZE)
PPO = SMALL_PPO
POET = ["algo=poet", "workers=1", "tensorboard=false", "algo.es.population=4", "algo.episode_steps=40",
        f"algo.es.noise_size={NOISE_SIZE}", f"seed={SEED}", "algo.reproduce_every=2", "algo.children=2",
        "algo.max_admitted=1", "algo.reproduce_threshold=-1000", "algo.mc_low=-1000", "algo.mc_high=1000",
        "algo.checkpoint_every=1"]
TIMING = {"time_s", "wall_time", "iteration_s", "master_s", "rollout_s", "update_s", "rollout_wait_s",
          "rollout_collect_s", "rollout_inference_s", "charts/SPS", "utilisation", "pool_utilisation"}


class Stop(Exception):
    pass


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(random.Random(0).randbytes(len(data)))
    elif how == "bytes flipped":  # still a zip archive, but its members fail their CRC check
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:])
    elif how == "missing array":  # a whole, readable npz without part of the optimiser's state
        with np.load(path) as npz:
            kept = {k: npz[k] for k in npz.files if k != "adam_m"}
        with open(path, "wb") as f:
            np.savez(f, **kept)
    else:
        raise ValueError(how)


def iterations(run_dir: Path) -> list[int]:
    return [json.loads(line)["iteration"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timing(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def noise_tables() -> set[str]:
    folder = Path(table_path(SEED, NOISE_SIZE)).parent
    return {p.name for p in folder.iterdir() if p.name.startswith(f"fiberrl-noise-{SEED}-{NOISE_SIZE}")}


# --- the run directory alone --------------------------------------------------------

def directory(path: Path) -> tuple[RunDirectory, io.StringIO]:
    out = io.StringIO()
    return RunDirectory(path, {"seed": 1}, console=Console(file=out, soft_wrap=True)), out


def with_checkpoints(path: Path, count: int) -> tuple[RunDirectory, io.StringIO]:
    run_dir, out = directory(path)
    for i in range(count):
        run_dir.save_checkpoint(i, dict(theta=np.full(3, i, np.float32)), dict(iteration=i))
    return run_dir, out


@pytest.mark.parametrize("how", ["truncated", "empty", "garbage", "bytes flipped"])
def test_a_damaged_newest_checkpoint_is_reported_and_the_one_before_used(tmp_path, how):
    run_dir, out = with_checkpoints(tmp_path, 3)
    damage(run_dir.checkpoints / "000002.npz", how)
    arrays, values = run_dir.load_checkpoint()
    assert values["iteration"] == 1 and arrays["theta"].tolist() == [1, 1, 1]
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert f"{run_dir.checkpoints / '000002.npz'} is damaged" in lines[0], lines
    assert f"resuming from {run_dir.checkpoints / '000001.npz'}" in lines[1], lines


def test_a_checkpoint_without_what_resuming_reads_is_damaged(tmp_path):
    run_dir, _ = with_checkpoints(tmp_path, 2)

    def needs_adam_m(arrays, values):
        if "adam_m" not in arrays:
            raise KeyError("adam_m")
    with pytest.raises(ValueError, match=r"none of the 2 checkpoints in \S+ can be read \(000001.npz: .*adam_m.*; "
                                         r"000000.npz: .*adam_m.*\); start the run again in another hydra.run.dir"):
        run_dir.load_checkpoint(check=needs_adam_m)


def test_a_garbage_metrics_line_and_a_partial_last_line_are_dropped_and_reported(tmp_path):
    run_dir, out = directory(tmp_path)
    rows = [dict(iteration=i, reward=float(i)) for i in range(4)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    partial = '{"iteration": 4, "rew'
    (tmp_path / "metrics.jsonl").write_text(text.replace(json.dumps(rows[1]), "\x00\x17garbage{") + partial)
    run_dir.truncate_metrics(after_iteration=2)
    assert run_dir.read_metrics() == [rows[0], rows[2]]
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "line 2" in lines[0] and "partial last line" in lines[1], lines


@pytest.mark.slow
def test_a_resume_removes_the_temporary_file_of_a_checkpoint_write_killed_midway(tmp_path):
    run_dir, _ = with_checkpoints(tmp_path, 2)
    # a real write of checkpoint 7, SIGKILLed between its first bytes and its rename
    writer = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from pathlib import Path
from fiberrl.run import atomic_write
def write(f):
    f.write(b"PK half a checkpoint")
    f.flush()
    print("writing", flush=True)
    time.sleep(60)
atomic_write(Path({str(run_dir.checkpoints / '000007.npz')!r}), write)
"""], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "writing\n"
    writer.kill()
    writer.wait()
    left = [p.name for p in run_dir.checkpoints.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and left[0].startswith(".000007.npz."), left
    (tmp_path / "notes.tmp").write_text("the user's own")  # not a write of the run's: kept
    run_dir, out = directory(tmp_path)
    _, values = run_dir.resume()
    assert values["iteration"] == 1
    assert sorted(p.name for p in run_dir.checkpoints.iterdir()) == ["000000.npz", "000001.npz"]
    assert (tmp_path / "notes.tmp").exists()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "removed 1 temporary file(s) left by writes cut short" in lines[0] \
        and f"checkpoints/{left[0]}" in lines[0], lines


# --- ES ---------------------------------------------------------------------------------

def es(tmp_path, name, overrides, on_iteration=None):
    return run(compose([*ES, *overrides]), tmp_path / name, on_iteration=on_iteration)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated", "missing array"])
def test_es_resumes_from_the_newest_whole_checkpoint(tmp_path, capsys, how):
    whole = es(tmp_path, "whole", ["algo.iterations=4"])
    es(tmp_path, "parts", ["algo.iterations=3"])
    damage(tmp_path / "parts" / "checkpoints" / "000002.npz", how)
    capsys.readouterr()
    resumed = es(tmp_path, "parts", ["algo.iterations=4", f"resume={tmp_path / 'parts'}"])
    said = capsys.readouterr().out
    assert "000002.npz is damaged" in said and "resuming from" in said and "000001.npz" in said, said
    assert np.array_equal(whole["theta"], resumed["theta"])
    assert without_timing(tmp_path / "parts") == without_timing(tmp_path / "whole")


@pytest.mark.slow
def test_a_partial_last_metrics_line_is_dropped_and_the_run_resumes(tmp_path, capsys):
    es(tmp_path, "run", ["algo.iterations=2"])
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"iteration": 2, "timesteps": 9')  # killed mid-write
    capsys.readouterr()
    es(tmp_path, "run", ["algo.iterations=3", f"resume={tmp_path / 'run'}"])
    assert "partial last line" in capsys.readouterr().out
    assert iterations(tmp_path / "run") == [0, 1, 2]


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_resumes_from_the_start(tmp_path):
    def killed_after_iteration_0(iteration, pool):
        raise Stop
    with pytest.raises(Stop):
        es(tmp_path, "run", ["algo.iterations=3", "algo.checkpoint_every=5"], on_iteration=killed_after_iteration_0)
    assert iterations(tmp_path / "run") == [0] and not list((tmp_path / "run" / "checkpoints").iterdir())
    es(tmp_path, "run", ["algo.iterations=2", f"resume={tmp_path / 'run'}"])
    assert iterations(tmp_path / "run") == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["every checkpoint damaged", "other settings"])
def test_a_failed_resume_leaves_no_noise_table(tmp_path, failure):
    es(tmp_path, "run", ["algo.iterations=2"])
    before = noise_tables()
    assert not before  # the run removed its table
    if failure == "every checkpoint damaged":
        for path in (tmp_path / "run" / "checkpoints").iterdir():
            damage(path, "truncated")
        with pytest.raises(ValueError, match="none of the 2 checkpoints"):
            es(tmp_path, "run", ["algo.iterations=3", f"resume={tmp_path / 'run'}"])
    else:
        with pytest.raises(CheckpointMismatch):
            es(tmp_path, "run", ["algo.iterations=3", "algo.weight_decay=0.5", f"resume={tmp_path / 'run'}"])
    assert noise_tables() == before


def fiberrl_cli(args, cwd, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "fiberrl", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_every_checkpoint_damaged_stops_the_resume_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    first = fiberrl_cli([*ES, "algo.iterations=2", f"hydra.run.dir={run_dir}"], tmp_path)
    assert first.returncode == 0, first.stderr
    metrics = (run_dir / "metrics.jsonl").read_text()
    damage(run_dir / "checkpoints" / "000001.npz", "garbage")
    damage(run_dir / "checkpoints" / "000000.npz", "empty")
    resumed = fiberrl_cli([*ES, "algo.iterations=3", f"resume={run_dir}"], tmp_path)
    assert resumed.returncode == 2, resumed.stderr
    assert "Traceback" not in resumed.stderr and len(resumed.stderr.splitlines()) == 1, resumed.stderr
    assert resumed.stderr.startswith(f"error: none of the 2 checkpoints in {run_dir / 'checkpoints'} can be read "
                                     f"(000001.npz: "), resumed.stderr
    assert "000000.npz: empty file" in resumed.stderr, resumed.stderr
    assert (run_dir / "metrics.jsonl").read_text() == metrics  # the run is left as it was
    assert not noise_tables()


# --- PPO and POET -------------------------------------------------------------------------

@pytest.mark.slow
def test_ppo_resumes_from_the_newest_whole_checkpoint(tmp_path, capsys):
    whole = run(compose([*PPO, "algo.total_timesteps=64"]), tmp_path / "whole")

    def killed_after_update_2(update, envs):  # total_timesteps is a setting of the run: it sets the lr schedule
        if update == 2:
            raise Stop
    with pytest.raises(Stop):
        run(compose([*PPO, "algo.total_timesteps=64"]), tmp_path / "parts", on_iteration=killed_after_update_2)
    damage(tmp_path / "parts" / "checkpoints" / "000002.npz", "truncated")
    capsys.readouterr()
    resumed = run(compose([*PPO, "algo.total_timesteps=64", f"resume={tmp_path / 'parts'}"]), tmp_path / "parts")
    said = capsys.readouterr().out
    assert "000002.npz is damaged" in said and "000001.npz" in said, said
    assert resumed["iterations"] == whole["iterations"] == 4
    assert without_timing(tmp_path / "parts") == without_timing(tmp_path / "whole")


@pytest.mark.slow
def test_poet_resumes_from_the_newest_whole_checkpoint(tmp_path, capsys):
    run(compose([*POET, "algo.iterations=3"]), tmp_path / "whole")
    run(compose([*POET, "algo.iterations=2"]), tmp_path / "parts")
    damage(tmp_path / "parts" / "checkpoints" / "000001.npz", "garbage")
    capsys.readouterr()
    run(compose([*POET, "algo.iterations=3", f"resume={tmp_path / 'parts'}"]), tmp_path / "parts")
    said = capsys.readouterr().out
    assert "000001.npz is damaged" in said and "000000.npz" in said, said
    assert without_timing(tmp_path / "parts") == without_timing(tmp_path / "whole")
    assert not noise_tables()
