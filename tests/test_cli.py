"""`fiberrl submit/status/logs/cancel/list`: a run's master as a cluster job,
run for real on every cluster backend this machine has."""
import importlib
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # the tests here start processes

MASTER = """
import fiberrl.runtime as mp

def square(x):
    return x * x

if __name__ == "__main__":
    with mp.Pool(2) as pool:
        print("squares", pool.map(square, range(6)), flush=True)
    print("backend", mp.get_config().backend, flush=True)
    raise SystemExit(3)
"""


def fiberrl(args, home, extra_env=None, timeout=240):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIBERRL_")}
    env.update(PYTHONPATH=ROOT, FIBERRL_HOME=str(home), **(extra_env or {}))
    return subprocess.run([sys.executable, "-m", "fiberrl.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def settings_env(name: str) -> dict:
    """The test helper's runtime settings as the FIBERRL_* variables a user would export."""
    helper = importlib.import_module(f"helpers.{name}_backend")
    reason = helper.available()
    if reason:
        pytest.skip(f"{name} backend cannot run here: {reason}")
    return {f"FIBERRL_{k.upper()}": str(v) for k, v in helper.settings().items() if k != "backend"}


@pytest.mark.parametrize("backend", [pytest.param(name, marks=getattr(pytest.mark, name))
                                     for name in ("docker", "slurm", "kubernetes")])
def test_submit_follow_status_logs_cancel(backend, tmp_path):
    env = settings_env(backend)
    script = tmp_path / "master.py"
    script.write_text(MASTER)
    # the script's directory is mounted where the master runs (a container, a pod; Slurm shares /tmp here)
    result = fiberrl(["submit", "--backend", backend, "--name", "master", "-e", f"PYTHONPATH={ROOT}",
                      "-v", f"{tmp_path}:{tmp_path}:ro", "--", sys.executable, str(script)], tmp_path, env)
    # the master's exit code is submit's, and its output was followed
    job_id = result.stderr.split("submitted ", 1)[1].split()[0] if "submitted " in result.stderr else None
    try:
        check_the_submitted_run(backend, result, job_id, tmp_path)
    finally:
        if job_id:  # a failed check leaves no master behind
            fiberrl(["cancel", job_id], tmp_path)


def check_the_submitted_run(backend, result, job_id, tmp_path):
    assert result.returncode == 3, result.stderr
    assert "squares [0, 1, 4, 9, 16, 25]" in result.stdout and f"backend {backend}" in result.stdout

    listed = fiberrl(["list"], tmp_path)
    assert listed.returncode == 0 and listed.stdout.startswith(job_id + "\t" + backend)
    status = fiberrl(["status", job_id], tmp_path)
    info = json.loads(status.stdout)
    assert info["state"] == "exited" and info["exit_code"] == 3 and info["backend"] == backend
    logs = fiberrl(["logs", job_id], tmp_path)
    assert "squares [0, 1, 4, 9, 16, 25]" in logs.stdout
    cancelled = fiberrl(["cancel", job_id], tmp_path)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stderr


def test_detached_submit_then_cancel_stops_the_run(tmp_path):
    env = settings_env("slurm")
    result = fiberrl(["submit", "--backend", "slurm", "-d", "--", "sleep", "600"], tmp_path, env)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    assert json.loads(fiberrl(["status", job_id], tmp_path).stdout)["state"] in ("pending", "running")
    assert fiberrl(["cancel", job_id], tmp_path).returncode == 0
    squeue = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    assert squeue.stdout.strip() in ("", "CANCELLED", "COMPLETING")


@pytest.mark.parametrize("args, message", [
    (["submit", "--backend", "docker"], "error: nothing to run: put the command after --"),
    (["submit", "--backend", "docker", "--push", "--", "true"], "error: --push pushes what --build built"),
    (["submit", "--backend", "docker", "--build", "Dockerfile", "--", "true"], "error: --build needs --image"),
    (["submit", "--backend", "docker", "-e", "NOVALUE", "--", "true"], "error: --env 'NOVALUE': expected NAME=VALUE"),
    (["submit", "--backend", "slurm", "-v", "data:relative", "--", "true"],
     "error: -v 'data:relative': expected SRC, SRC:DST or SRC:DST:ro with DST an absolute path"),
    (["status", "nope"], "error: no run 'nope' was submitted from this machine (known: none)"),
])
def test_bad_input_fails_in_one_line_and_submits_nothing(args, message, tmp_path):
    result = fiberrl(args, tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(message), result.stderr
    assert not (tmp_path / "submitted").exists()
