"""``hydra/launcher=fiberrl`` as users meet it: sweeps of a small Hydra app and of fiberrl's own ES,
runs that raise or are killed, a sweep resumed, bad input, Ctrl-C, one GPU per run."""
import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, wait_until
from helpers.script_runs import run_sweep as sweep

pytestmark = pytest.mark.slow  # the tests here start processes

APP = """
import os, sys, time
from pathlib import Path
import hydra
from hydra.core.hydra_config import HydraConfig

@hydra.main(version_base=None, config_path=None)
def app(cfg):
    out = Path(HydraConfig.get().runtime.output_dir)
    (out / "pid").write_text(str(os.getpid()))
    (out / "gpus").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    if cfg.get("meet"):  # wait (up to 30 s) until this many runs have come here
        here = Path(cfg.meet.folder)
        (here / str(os.getpid())).touch()
        deadline = time.monotonic() + 30
        while len(list(here.iterdir())) < cfg.meet.runs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {cfg.x} met {len(list(here.iterdir()))} of {cfg.meet.runs} runs")
            time.sleep(0.02)
    time.sleep(cfg.get("sleep", 0))
    if cfg.get("fail"):
        raise ValueError(f"run {cfg.x} was told to fail")
    if cfg.get("exit") is not None:
        sys.exit(cfg.exit)
    return cfg.x * 10

if __name__ == "__main__":
    app()
"""


def table(sweep_dir: Path) -> list[dict]:
    with open(sweep_dir / "sweep.csv") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture
def app(tmp_path):
    path = tmp_path / "app.py"
    path.write_text(APP)
    return path


def test_runs_go_at_the_same_time_and_a_failing_run_stops_none_of_the_others(app, tmp_path):
    sweep_dir, meeting = tmp_path / "sweep", tmp_path / "meeting"
    meeting.mkdir()
    # each run waits until all four have started: run one after another, the first would wait in vain
    code, out, err = sweep([str(app), "-m", "hydra/launcher=fiberrl", "hydra.launcher.runs_at_once=4",
                            "+x=1,2,3,4", f"+meet.folder={meeting}", "+meet.runs=4", f"hydra.sweep.dir={sweep_dir}",
                            "+fail=false", "hydra.sweep.subdir=${hydra.job.num}"], tmp_path, timeout=120)
    assert code == 0, err
    assert [row["state"] for row in table(sweep_dir)] == ["done"] * 4

    failing = tmp_path / "failing"
    code, out, err = sweep([str(app), "-m", "hydra/launcher=fiberrl", "+x=1,2,3", "+fail=false,true",
                            f"hydra.sweep.dir={failing}", "hydra.sweep.subdir=${hydra.job.num}"], tmp_path)
    assert code != 0
    rows = table(failing)
    assert [row["state"] for row in rows] == ["done", "failed"] * 3
    assert "1 of 6" not in err and "3 of 6 runs failed" in err, err
    assert "ValueError: run 2 was told to fail" in rows[3]["why"]
    # the traceback is in the run's own log and output
    assert "was told to fail" in (failing / "3" / "app.log").read_text()
    assert "Traceback" in (failing / "3" / "output.log").read_text()

    # a task that exits: with 0 its run is done, otherwise failed
    exiting = tmp_path / "exiting"
    code, out, err = sweep([str(app), "-m", "hydra/launcher=fiberrl", "+x=1", "+exit=0,3",
                            f"hydra.sweep.dir={exiting}", "hydra.sweep.subdir=${hydra.job.num}"], tmp_path)
    assert code != 0
    assert [(row["state"], row["why"]) for row in table(exiting)] == [("done", ""), ("failed", "SystemExit: 3")]


def test_a_killed_run_is_retried_and_a_bad_value_stops_the_sweep_before_it_starts(app, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = sweep([str(app), "-m", "hydra/launcher=fiberrl", "+x=1,2", "+sleep=4", "+fail=false",
                  f"hydra.sweep.dir={sweep_dir}", "hydra.sweep.subdir=${hydra.job.num}", "hydra.launcher.table=plain"],
                 tmp_path, wait=False)
    pid_file = sweep_dir / "0" / "pid"
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text(), 60)  # written, not only created
    first = int(pid_file.read_text())
    os.kill(first, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert int(pid_file.read_text()) != first
    rows = table(sweep_dir)
    assert [(row["state"], row["tries"]) for row in rows] == [("done", "2"), ("done", "1")]
    assert "#0 +x=1: retrying (its job died (killed by SIGKILL)" in out

    # a run whose job keeps dying fails after its retries; the sweep still ends, non-zero
    proc = sweep([str(app), "-m", "hydra/launcher=fiberrl", "hydra.launcher.retries=0", "+x=1", "+sleep=30",
                  f"hydra.sweep.dir={tmp_path / 'lost'}", "hydra.sweep.subdir=${hydra.job.num}"], tmp_path, wait=False)
    pid_file = tmp_path / "lost" / "0" / "pid"
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text(), 60)  # written, not only created
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "1 of 1 runs failed" in err and "killed by SIGKILL" in err and "(1 tries)" in err

    code, out, err = sweep([str(app), "-m", "hydra/launcher=fiberrl", "hydra.launcher.cpu=1000", "+x=1",
                            f"hydra.sweep.dir={tmp_path / 'big'}"], tmp_path)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("error: hydra.launcher.cpu=1000: this machine has")
    assert not list((tmp_path / "big").glob("*/"))


PRELOADING_APP = """
import sys
from pathlib import Path
import hydra
from hydra.core.hydra_config import HydraConfig
from fiberrl.sweepable import sweepable

@sweepable(preload=lambda cfg: [cfg.module])
def app(cfg):
    # what this job had imported before its task ran: the module its run's config names, forked in
    Path(HydraConfig.get().runtime.output_dir, "had").write_text(str(cfg.module in sys.modules))
    __import__(cfg.module)

app = hydra.main(version_base=None, config_path=None)(app)

if __name__ == "__main__":
    app()
"""


def test_each_local_run_job_is_forked_with_the_modules_its_run_imports(tmp_path):
    script = tmp_path / "preloading.py"
    script.write_text(PRELOADING_APP)
    sweep_dir = tmp_path / "sweep"
    # modules nothing of the launcher, Hydra or the runtime imports; each run names its own
    modules = ["xml.dom.minidom", "wave"]
    code, out, err = sweep([str(script), "-m", "hydra/launcher=fiberrl", f"+module={','.join(modules)}",
                            f"hydra.sweep.dir={sweep_dir}", "hydra.sweep.subdir=${hydra.job.num}"], tmp_path)
    assert code == 0, err
    assert [(sweep_dir / str(num) / "had").read_text() for num in range(2)] == ["True", "True"]
    # told not to, each job imports them itself
    code, out, err = sweep([str(script), "-m", "hydra/launcher=fiberrl", "hydra.launcher.preload=false",
                            "+module=wave", f"hydra.sweep.dir={tmp_path / 'not'}"], tmp_path)
    assert code == 0, err
    assert (tmp_path / "not" / "0" / "had").read_text() == "False"
    # the same app run by itself imports them itself
    code, out, err = sweep([str(script), "+module=wave", f"hydra.run.dir={tmp_path / 'alone'}"], tmp_path)
    assert code == 0, err
    assert (tmp_path / "alone" / "had").read_text() == "False"


def test_the_sweep_process_ending_ends_every_run(app, tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = sweep([str(app), "-m", "hydra/launcher=fiberrl", "+x=1,2", "+sleep=60", "+fail=false",
                  f"hydra.sweep.dir={sweep_dir}", "hydra.sweep.subdir=${hydra.job.num}"], tmp_path, wait=False)
    pids = [sweep_dir / str(n) / "pid" for n in (0, 1)]
    assert wait_until(lambda: all(p.exists() for p in pids), 60)
    runs = [int(p.read_text()) for p in pids]
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in runs), 15)

    # killed outright, the sweep's runs end by their lifelines
    proc = sweep([str(app), "-m", "hydra/launcher=fiberrl", "+x=1,2", "+sleep=60", "+fail=false",
                  f"hydra.sweep.dir={tmp_path / 'again'}", "hydra.sweep.subdir=${hydra.job.num}"], tmp_path,
                 wait=False)
    pids = [tmp_path / "again" / str(n) / "pid" for n in (0, 1)]
    assert wait_until(lambda: all(p.exists() for p in pids), 60)
    runs = [int(p.read_text()) for p in pids]
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in runs), 30)


def test_each_run_gets_its_own_gpu(app, tmp_path):
    sweep_dir = tmp_path / "sweep"
    code, out, err = sweep([str(app), "-m", "hydra/launcher=fiberrl", "hydra.launcher.gpu=1", "+x=1,2,3,4",
                            "+sleep=2", "+fail=false", f"hydra.sweep.dir={sweep_dir}",
                            "hydra.sweep.subdir=${hydra.job.num}"], tmp_path, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert code == 0, err
    gpus = [(sweep_dir / str(n) / "gpus").read_text() for n in range(4)]
    assert sorted(gpus) == ["0", "0", "1", "1"]
    # two GPUs, one each: two runs at a time, never two on one GPU
    assert gpus[0] != gpus[1]
    code, out, err = sweep([str(app), "-m", "hydra/launcher=fiberrl", "hydra.launcher.gpu=3", "+x=1",
                            f"hydra.sweep.dir={tmp_path / 'more'}"], tmp_path, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert code == 2 and "hydra.launcher.gpu=3: this machine shows 2 GPUs" in err


ES = ["-m", "fiberrl", "-m", "algo=es", "env=cartpole", "workers=1", "algo.population=16", "algo.iterations=8",
      "algo.eval_episodes=1", "tensorboard=false"]
# what the clock decides: the rest of a run's metrics are what it computed
TIMING = {"wall_time", "utilisation", "pool_utilisation"}


def es_metrics(folder: Path) -> list[dict]:
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if k not in TIMING and not k.endswith("_s")} for m in lines]


def run_pid(folder: Path) -> int:
    """The run's own process: the one whose output goes to its output.log and whose parent's does not."""
    log = str(folder / "output.log")

    def writes_log(pid):
        try:
            return os.readlink(f"/proc/{pid}/fd/1") == log
        except OSError:
            return False

    for entry in os.listdir("/proc"):
        if entry.isdigit() and writes_log(entry):
            with open(f"/proc/{entry}/stat") as fh:
                parent = fh.read().rsplit(") ", 1)[1].split()[1]
            if not writes_log(parent):
                return int(entry)
    raise AssertionError(f"no process writes {log}")


def test_fiberrl_sweep_killed_run_resumes_from_its_checkpoint_and_a_partial_sweep_resumes(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [*ES, "algo.checkpoint_every=2,3", f"hydra.sweep.dir={sweep_dir}", "hydra.launcher.table=plain",
            "hydra.launcher.retries=0"]
    proc = sweep(args, ROOT, wait=False)
    folders = lambda: sorted(p for p in sweep_dir.glob("*") if p.is_dir())  # noqa: E731
    assert wait_until(lambda: len(folders()) == 2 and any((folders()[0] / "checkpoints").glob("*.npz")), 90)
    killed = folders()[0]
    os.kill(run_pid(killed), signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode != 0 and "1 of 2 runs failed" in err, err
    assert [row["state"] for row in table(sweep_dir)] == ["failed", "done"]
    done_before = (folders()[1] / ".hydra" / "job_return.pickle").stat().st_mtime

    # the same command again: the finished run is kept, the killed one goes on from its checkpoint
    code, out, err = sweep(args, ROOT)
    assert code == 0, err
    # it ends saying where it went and how to look at it
    assert f"sweep: {sweep_dir} (2 runs;" in out and f"plot it: python -m fiberrl.plot {sweep_dir} -o curves.png" in out
    rows = table(sweep_dir)
    assert [row["state"] for row in rows] == ["done", "done"]
    assert (folders()[1] / ".hydra" / "job_return.pickle").stat().st_mtime == done_before
    assert folders() == sorted([killed, folders()[1]]) and len(folders()) == 2
    assert f"resume='{killed}'" in (killed / ".hydra" / "overrides.yaml").read_text()
    # and computes what the run that was never killed computed
    assert es_metrics(killed) == es_metrics(folders()[1])
    assert len(es_metrics(killed)) == 8
    # the plot finds both runs in the sweep's folder (each a config of its own: their cadence differs)
    from fiberrl.plot import group_runs
    assert sorted(len(runs) for runs in group_runs([sweep_dir]).values()) == [1, 1]

    # a sweep of other runs pointed at this folder is refused before it starts
    code, out, err = sweep([*ES, "algo.checkpoint_every=4,5", f"hydra.sweep.dir={sweep_dir}"], ROOT)
    assert code == 2 and f"error: {sweep_dir} holds another sweep (algo=es env=cartpole" in err, err


def test_a_run_told_to_stop_checkpoints_and_goes_on_elsewhere_without_a_try(tmp_path):
    """SIGTERM to a run's job (its host taken back) with no checkpoint due before its last iteration:
    it checkpoints at the end of its iteration and exits; with retries=0 the launcher starts it again
    from that checkpoint, and it computes what the run that was never told computed."""
    sweep_dir = tmp_path / "sweep"
    args = [*ES, "algo.checkpoint_every=100,101", f"hydra.sweep.dir={sweep_dir}", "hydra.launcher.table=plain",
            "hydra.launcher.retries=0"]
    proc = sweep(args, ROOT, wait=False)
    folders = lambda: sorted(p for p in sweep_dir.glob("*") if p.is_dir())  # noqa: E731
    metrics_lines = lambda folder: len((folder / "metrics.jsonl").read_text().splitlines())  # noqa: E731
    assert wait_until(lambda: len(folders()) == 2 and (folders()[0] / "metrics.jsonl").exists()
                      and metrics_lines(folders()[0]) >= 2, 90)
    told = folders()[0]
    os.kill(run_pid(told), signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    rows = table(sweep_dir)
    assert [(row["state"], row["tries"]) for row in rows] == [("done", "1"), ("done", "1")]
    assert "its job was told to stop (exit code 143)" in rows[0]["why"] and "not counted as a try" in out + err
    assert "told to stop (SIGTERM): checkpointed after iteration" in (told / "output.log").read_text()
    assert f"resume='{told}'" in (told / ".hydra" / "overrides.yaml").read_text()
    assert es_metrics(told) == es_metrics(folders()[1]) and len(es_metrics(told)) == 8


def test_a_bad_value_in_any_run_is_reported_before_any_run_starts(tmp_path):
    sweep_dir = tmp_path / "sweep"
    code, out, err = sweep([*ES, "algo.sigma=0.05,-1", f"hydra.sweep.dir={sweep_dir}"], ROOT)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("error: job #1 (algo.sigma=-1): algo.sigma=-1"), err
    assert not [p for p in sweep_dir.glob("*") if p.is_dir()]
    # nor does the folder say it holds that sweep: the corrected command may use it
    assert not (sweep_dir / ".sweep.yaml").exists()


def kill_run_job(backend: str, folder: Path) -> None:
    """End a run's job as its cluster would: the container removed, the Slurm job cancelled, the pod's
    process killed (as the OOM killer does; the stand-in API server runs a pod as a local process)."""
    where = json.loads((folder / ".hydra" / "job_where.json").read_text())
    if backend == "docker":
        subprocess.run(["docker", "rm", "-f", where["host"]], check=True, capture_output=True, timeout=60)
    elif backend == "slurm":
        subprocess.run(["scancel", where["slurm_job_id"]], check=True, capture_output=True, timeout=60)
    else:
        os.kill(where["pid"], signal.SIGKILL)


# kubernetes: against the stand-in API server (tests/helpers/k8s_standin), no cluster being able to run here
@pytest.mark.parametrize("backend", [pytest.param(name, marks=getattr(pytest.mark, name))
                                     for name in ("docker", "slurm", "kubernetes")])
def test_a_sweep_on_a_cluster_backend_retries_the_run_whose_job_it_lost(backend, tmp_path):
    import importlib
    helper = importlib.import_module(f"helpers.{backend}_backend")
    reason = helper.available()
    if reason:
        pytest.skip(reason)
    settings = {k: v for k, v in helper.settings().items() if k != "backend"}
    sweep_dir = Path(ROOT) / "runs" / "test-sweeps" / f"{backend}-{os.getpid()}-{time.monotonic_ns()}"
    args = [*ES, "algo.iterations=12", "algo.checkpoint_every=2", "seed=0,1", f"backend={backend}",
            *[f"backend.settings.{k}={v!r}" for k, v in settings.items()], f"hydra.sweep.dir={sweep_dir}",
            "hydra.sweep.subdir=${hydra.job.num}", "hydra.launcher.table=plain"]
    try:
        proc = sweep(args, ROOT, wait=False)
        first = sweep_dir / "0"
        checkpointed = lambda: any((first / "checkpoints").glob("*.npz"))  # noqa: E731
        assert wait_until(lambda: proc.poll() is not None or checkpointed(), 240) and proc.poll() is None, \
            proc.stderr.read() if proc.poll() is not None else "no checkpoint"
        kill_run_job(backend, first)
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{out}\n{err}"
        # Slurm cancels by SIGTERM first, as it preempts: the run checkpoints, and that is no try
        tries = "1" if backend == "slurm" else "2"
        assert [(row["state"], row["tries"]) for row in table(sweep_dir)] == [("done", tries), ("done", "1")]
        assert len(es_metrics(first)) == 12
        assert wait_until(lambda: not helper.leftovers(), 60), helper.leftovers()
    finally:
        import shutil
        shutil.rmtree(sweep_dir, ignore_errors=True)
