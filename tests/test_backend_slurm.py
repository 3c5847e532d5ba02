"""The slurm backend on a real cluster (CI: a single node from .ci/start-slurm).

What Slurm received is read back from ``scontrol show job`` while the job
runs; exit codes, cancellation, unschedulable jobs, cleanup and the reaper,
and ``fiberrl submit``'s submit/describe/logs/cancel.
"""
import glob
import ipaddress
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import ROOT, wait_until
from helpers.pool_workers import worker_running_a_chunk
from helpers.slurm_backend import available, kill_job, leftovers, settings

import fiberrl.runtime as mp
from fiberrl.runtime import config
from fiberrl.runtime.backends import NEVER_RAN_EXIT, OWNER, JobSpec, get_backend
from fiberrl.runtime.backends.slurm import SlurmError
from fiberrl.runtime.net import auth

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


@pytest.fixture(scope="module", autouse=True)
def a_slurm_cluster():
    """Without one, the tests here are skipped.  Asked when they run, not when they are collected:
    where no controller answers, sinfo takes seconds to say so."""
    reason = available()
    if reason is not None:
        pytest.skip(f"no Slurm cluster: {reason}")


@pytest.fixture(autouse=True)
def slurm(request):
    config.reset()
    mp.configure(**settings())
    yield
    config.reset()


def scontrol_job(job_id: str) -> dict:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(m.groups() for m in re.finditer(r"(\w[\w/:]*)=(\S*)", out))


def queued(job_id: str) -> str | None:
    """The job's state while Slurm still runs or queues it, else None."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.strip()
    return out if out in ("PENDING", "CONFIGURING", "RUNNING", "SUSPENDED") else None


def wait_running(p, timeout=30.0):
    assert wait_until(lambda: queued(p._job.id) == "RUNNING", timeout), f"job {p._job.id}: {queued(p._job.id)}"


# --- targets (module level: the children import them) ---------------------------
def sleeper(seconds=60):
    time.sleep(seconds)


@mp.meta(cpu=2, mem=300)
def sized_sleeper():
    time.sleep(60)


def exits_with(code):
    sys.exit(code)


def env_is_clean():
    # the secret reaches the child only as a file path
    ok = "FIBERRL_RUN_SECRET" not in os.environ and os.path.isfile(os.environ.get("FIBERRL_RUN_SECRET_FILE", ""))
    sys.exit(0 if ok else 7)


@mp.meta(gpu=1)
def wants_gpu():
    pass


@mp.meta(cpu=4096)
def wants_too_many_cpus():
    pass


def square(x):
    return x * x


# --- what Slurm received ----------------------------------------------------------
def test_job_carries_resources_and_settings(tmp_path, monkeypatch):
    mp.configure(slurm_partition="debug", slurm_time="00:05:00", slurm_options="--nice=5")
    monkeypatch.chdir(tmp_path)
    p = mp.Process(target=sized_sleeper)
    p.start()
    try:
        wait_running(p)
        info = scontrol_job(p._job.id)
        assert info["NumCPUs"] == "2" and info["CPUs/Task"] == "2"
        assert info["MinMemoryNode"] == "300M"
        assert info["Partition"] == "debug"
        assert info["TimeLimit"] == "00:05:00"
        assert info["Nice"] == "5"  # slurm_options reach sbatch
        assert info["JobName"] == f"fiberrl-{auth.run_id()}"
        assert info["Comment"] == f"fiberrl-owner={OWNER}"
        assert info["WorkDir"] == str(tmp_path)
        assert info["StdOut"] == os.path.join(settings()["slurm_dir"], f"{p._job.id}.log")
        assert wait_until(lambda: p._job.host, 5)  # the node, once the monitor saw it running

        # the secret is in neither the script Slurm keeps nor the environment it records
        secret = auth.run_secret().hex()
        script = subprocess.run(["scontrol", "write", "batch_script", p._job.id, "-"],
                                capture_output=True, text=True).stdout
        assert "FIBERRL_RUN_SECRET_FILE=" in script and secret not in script
        assert "FIBERRL_RUN_SECRET=" not in script
        state_dir = re.search(r"StateSaveLocation\s*=\s*(\S+)", subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True).stdout).group(1)
        for path in glob.glob(os.path.join(state_dir, "hash.*", f"job.{p._job.id}", "*")):
            with open(path, "rb") as fh:
                assert secret.encode() not in fh.read(), path
        # nothing of this shell beyond what a job should get
        environment = glob.glob(os.path.join(state_dir, "hash.*", f"job.{p._job.id}", "environment"))
        if environment:
            with open(environment[0], "rb") as fh:
                names = {entry.split(b"=", 1)[0].decode() for entry in fh.read().split(b"\0")[1:] if b"=" in entry}
            assert not names & {"PWD", "SHELL", "OLDPWD", "PYTEST_CURRENT_TEST"}, names
        secret_file = next(line.split("=", 1)[1].strip("'") for line in script.splitlines()
                           if line.startswith("export FIBERRL_RUN_SECRET_FILE="))
        assert os.stat(secret_file).st_mode & 0o777 == 0o600
    finally:
        p.kill()
        p.join(30)
    assert p.exitcode == -9


def test_secret_reaches_the_child_as_a_file_only():
    p = mp.Process(target=env_is_clean)
    p.start()
    p.join(60)
    assert p.exitcode == 0


def test_exit_code_and_signals():
    codes = mp.Process(target=exits_with, args=(3,))
    term = mp.Process(target=sleeper)
    kill = mp.Process(target=sleeper)
    for p in (codes, term, kill):
        p.start()
    wait_running(term)
    wait_running(kill)
    term.terminate()
    kill.kill()
    for p in (codes, term, kill):
        p.join(30)
    assert (codes.exitcode, term.exitcode, kill.exitcode) == (3, -signal.SIGTERM, -signal.SIGKILL)


def test_scancel_of_a_running_job_is_a_lost_process():
    p = mp.Process(target=sleeper)
    p.start()
    wait_running(p)
    kill_job(p)
    p.join(30)
    assert p.exitcode is not None and p.exitcode < 0


# --- jobs that cannot run -----------------------------------------------------------
def test_bad_partition_is_an_immediate_clear_error():
    mp.configure(slurm_partition="no-such-partition")
    started = time.monotonic()
    with pytest.raises(SlurmError, match=r"(?s)[Ii]nvalid partition.*slurm_partition"):
        mp.Process(target=sleeper).start()
    assert time.monotonic() - started < 10


def test_gpu_on_a_gpu_less_cluster_fails_fast():
    mp.configure(schedule_timeout=5)
    started = time.monotonic()
    p = mp.Process(target=wants_gpu)
    try:
        p.start()
    except SlurmError as exc:  # sbatch refuses at once: no GRES of that name
        assert "gpu" in str(exc).lower()
    else:  # or it queues a job no node can run: cancelled, reported
        p.join(30)
        assert p.exitcode == NEVER_RAN_EXIT and p.job_error
    assert time.monotonic() - started < 20


def test_unschedulable_job_is_cancelled_with_slurms_reason():
    started = time.monotonic()
    p = mp.Process(target=wants_too_many_cpus)
    p.start()
    p.join(30)
    assert p.exitcode == NEVER_RAN_EXIT
    assert "can never start" in p.job_error and re.search(r"PartitionConfig|BadConstraints", p.job_error)
    assert time.monotonic() - started < 15
    assert queued(p._job.id) is None


def test_pending_past_schedule_timeout_is_cancelled():
    mp.configure(schedule_timeout=2, slurm_options="--begin=now+600")
    p = mp.Process(target=sleeper)
    p.start()
    p.join(30)
    assert p.exitcode == NEVER_RAN_EXIT
    assert "schedule_timeout=2s" in p.job_error and "BeginTime" in p.job_error
    assert queued(p._job.id) is None


# --- cleanup --------------------------------------------------------------------------
def test_cleanup_cancels_the_owners_jobs():
    mp.configure(slurm_options="--begin=now+600")
    pending = mp.Process(target=sleeper)
    pending.start()
    mp.configure(slurm_options="")
    running = mp.Process(target=sleeper)
    running.start()
    wait_running(running)
    assert queued(pending._job.id) == "PENDING"
    get_backend("slurm").cleanup(OWNER)
    assert wait_until(lambda: not queued(pending._job.id) and not queued(running._job.id), 15)
    pending.join(15)
    running.join(15)
    assert pending.exitcode is not None and running.exitcode is not None
    assert running.exitcode < 0


OWNER_SCRIPT = textwrap.dedent("""
    import sys, time
    import fiberrl.runtime as mp

    def sleeper():
        time.sleep(600)

    if __name__ == "__main__":
        mp.configure(backend="slurm", slurm_dir=sys.argv[1])
        running = mp.Process(target=sleeper)
        running.start()
        mp.configure(slurm_options="--begin=now+600")
        pending = mp.Process(target=sleeper)
        pending.start()
        print(running._job.id, pending._job.id, flush=True)
        time.sleep(600)
""")


def test_reaper_cancels_a_killed_owners_jobs(tmp_path, script_env):
    script = tmp_path / "owner.py"
    script.write_text(OWNER_SCRIPT)
    owner = subprocess.Popen([sys.executable, str(script), settings()["slurm_dir"]], stdout=subprocess.PIPE,
                             text=True, env=script_env, cwd=tmp_path)
    try:
        ids = owner.stdout.readline().split()
        assert len(ids) == 2, ids
        assert wait_until(lambda: queued(ids[0]) == "RUNNING", 30)
        assert queued(ids[1]) == "PENDING"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert wait_until(lambda: not queued(ids[0]) and not queued(ids[1]), 20), [queued(i) for i in ids]


# --- fiberrl submit ------------------------------------------------------------------
def test_submit_describe_logs_cancel(tmp_path):
    backend = get_backend("slurm")
    run = "feedc0ffee42"
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": ROOT}
    quick = backend.submit(JobSpec(command=[sys.executable, "-c", "print('done here')"], name="quick", env=env,
                                   run="0123456789ab", cwd=str(tmp_path)))
    master = backend.submit(JobSpec(
        command=[sys.executable, "-c", "import time\nprint('master up', flush=True)\ntime.sleep(600)"],
        name="master", env=env, run=run, cwd=str(tmp_path)))
    assert master.isdigit() and queued(master) and scontrol_job(master)["JobName"] == f"fiberrl-{run}-master"
    assert "fiberrl-owner" not in scontrol_job(master)["Comment"]  # nobody's cleanup takes it

    # follow: the whole output, and the iterator ends with the job
    chunks = []
    follower = threading.Thread(target=lambda: chunks.extend(backend.logs(quick, follow=True)))
    follower.start()
    follower.join(30)
    assert not follower.is_alive() and "done here" in "".join(chunks)
    assert wait_until(lambda: backend.describe(quick)["state"] == "exited", 15)
    assert backend.describe(quick)["exit_code"] == 0

    assert wait_until(lambda: backend.describe(master)["state"] == "running", 30)
    described = backend.describe(master)
    assert described["id"] == master and described["where"]
    assert wait_until(lambda: "master up" in "".join(backend.logs(master)), 15)

    # a worker of the run, still queued: cancel sweeps it with the master
    worker = subprocess.run(["sbatch", "--parsable", "--hold", f"--job-name=fiberrl-{run}", "-o", "/dev/null",
                             "--wrap", "true"], capture_output=True, text=True, check=True).stdout.strip()
    backend.cancel(master)
    assert not queued(master) and not queued(worker)
    assert wait_until(lambda: backend.describe(master)["state"] == "exited", 15)
    assert backend.describe(master)["exit_code"] < 0


# --- the rest of the runtime on it -------------------------------------------------------
def test_pool_map_on_slurm():
    pool = mp.Pool(2)
    try:
        assert pool.map(square, range(20)) == [x * x for x in range(20)]
        pool.close()
        pool.join()
    finally:
        pool.terminate()


def slow_square(x):
    time.sleep(1.0)
    return x * x


def test_scancel_signal_term_of_a_pool_worker_loses_and_charges_nothing():
    """``scancel --full --signal=TERM`` (what Slurm's preemption sends before it kills) of a
    worker's job mid-map: it finishes its chunk and leaves, its other chunks run elsewhere,
    nothing counts as a crash (max_task_crashes=1 would fail a charged task), it is replaced."""
    mp.configure(preempt_grace=20)
    pool = mp.Pool(2, max_task_crashes=1)
    try:
        result = pool.map_async(slow_square, range(8), chunksize=1)
        worker = worker_running_a_chunk(pool)
        subprocess.run(["scancel", "--full", "--signal=TERM", worker._job.id], check=True)
        assert result.get(60) == [x * x for x in range(8)]
        assert wait_until(lambda: pool.statistics().workers_preempted == 1, 30)  # its end is handled
        stats = pool.statistics()
        assert (stats.workers_preempted, stats.worker_restarts, stats.tasks_failed) == (1, 0, 0)
        worker.join(30)
        assert pool.map(square, range(6)) == [x * x for x in range(6)]
        pool.close()
        pool.join()
    finally:
        pool.terminate()


def test_a_worker_whose_job_slurm_suspends_past_the_deadline_is_given_up_and_its_tasks_rerun():
    """``scontrol suspend`` (the job's processes stopped: a stalled host) of a worker's job mid-map for
    longer than ``silence_timeout``: it is given up, its chunks rerun elsewhere uncharged, its job
    cancelled (a suspended job too), and it is replaced."""
    mp.configure(silence_timeout=4)
    pool = mp.Pool(2, max_task_crashes=1)
    try:
        result = pool.map_async(slow_square, range(10), chunksize=1)
        job = worker_running_a_chunk(pool)._job.id
        subprocess.run(["scontrol", "suspend", job], check=True, capture_output=True)
        try:
            assert wait_until(lambda: pool.statistics().workers_cut_off == 1, 30)
            assert result.get(60) == [x * x for x in range(10)]
        finally:
            subprocess.run(["scontrol", "resume", job], capture_output=True)  # gone by now, unless that failed
        stats = pool.statistics()
        assert (stats.workers_cut_off, stats.worker_restarts, stats.tasks_failed) == (1, 0, 0)
        assert wait_until(lambda: queued(job) is None, 30), queued(job)
        assert pool.map(square, range(6)) == [x * x for x in range(6)]
        pool.close()
        pool.join()
    finally:
        pool.terminate()


def test_slurm_cannot_requeue_a_job_so_no_process_runs_twice():
    """A process starts once: its job is submitted ``--no-requeue``, so ``scontrol requeue`` (and a
    preemption in REQUEUE mode, which cancels such a job instead) cannot start it a second time
    beside the successor its parent started."""
    pool = mp.Pool(1)
    try:
        result = pool.map_async(slow_square, range(3), chunksize=1)
        job = worker_running_a_chunk(pool)._job.id
        refused = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        assert refused.returncode != 0 and "disabled" in refused.stderr, refused.stderr
        assert result.get(60) == [0, 1, 4]
        assert pool.statistics().worker_restarts == 0
        pool.close()
        pool.join()
    finally:
        pool.terminate()


def test_listen_host_is_an_address_jobs_reach():
    host = get_backend("slurm").listen_host()
    ipaddress.ip_address(host)


def test_nothing_left_behind():
    assert wait_until(lambda: not leftovers(), 15), leftovers()
