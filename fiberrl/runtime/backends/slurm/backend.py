"""SlurmBackend: a job-backed process as one Slurm batch job; create, status,
wait, terminate, cleanup, and the listen host; ``fiberrl submit``'s methods
hand over to SubmittedRuns."""
from __future__ import annotations

import logging
import os
import subprocess
import threading
import time

from ..base import Backend, Job, JobSpec, JobStatus
from .commands import SlurmError, run_command, scancel
from .jobinfo import Accounting
from .network import find_listen_host
from .outcomes import Endings
from .sbatch import sbatch, sbatch_options
from .script import batch_script, job_env, make_slurm_dir
from .state import JobState
from .submit import SubmittedRuns
from .tracker import Tracker

log = logging.getLogger("fiberrl")

OWNER_TAG = "fiberrl-owner="


class SlurmBackend(Backend):
    name = "slurm"

    def __init__(self):
        self._sbatch_lock = threading.Lock()
        accounting = Accounting()
        self._tracker = Tracker(Endings(accounting))
        self._runs = SubmittedRuns(accounting, self._sbatch_lock)
        self._listen_host: str | None = None
        self._submitted = False

    def slurm_dir(self) -> str:
        return make_slurm_dir()

    # --- jobs -----------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> Job:
        from ...config import get_config
        config = get_config()
        slurm_dir = self.slurm_dir()
        run = spec.run or "norun"
        env, _ = job_env(spec, slurm_dir, f"{run}-{spec.owner or 'none'}.secret")
        script = batch_script(spec.command, env, slurm_dir, f"fiberrl process {spec.name!r} of run {run}")
        comment = f"{OWNER_TAG}{spec.owner}" if spec.owner else None
        args = sbatch_options(spec, slurm_dir, f"fiberrl-{run}", comment)
        job_id = sbatch(args, script, f"a job for {spec.name}", self._sbatch_lock)
        now = time.monotonic()
        state = JobState(id=job_id, submitted=now, pending_since=now, schedule_timeout=config.schedule_timeout,
                         exit_path=os.path.join(slurm_dir, f"{job_id}.exit"),
                         log_path=os.path.join(slurm_dir, f"{job_id}.log"))
        job = Job(id=job_id, spec=spec, handle=state)
        self._submitted = True
        self._tracker.add(job)
        return job

    def status(self, job: Job):
        state: JobState = job.handle
        if state.done.is_set():
            return JobStatus.EXITED, state.exit_code
        self._tracker.ensure_running()
        return (JobStatus.RUNNING, None) if state.ran else (JobStatus.PENDING, None)

    def wait(self, job: Job, timeout: float | None = None):
        state: JobState = job.handle
        if not state.done.is_set():
            self._tracker.ensure_running()
        if state.done.wait(timeout):
            return state.exit_code
        return None

    def terminate(self, job: Job, force: bool = False) -> None:
        state: JobState = job.handle
        if state.done.is_set():
            return
        self._tracker.terminating(state, force)
        if force or not state.ran:
            # Slurm makes SIGKILL a cancel (SIGTERM to every process of the
            # job, SIGKILL after KillWait), and a queued job takes no signals:
            # scancel it, which also signals it should it have started since
            scancel([state.id])
            return
        done = run_command(["scancel", "--full", "--signal=TERM", state.id])
        message = (done.stderr or done.stdout).strip()
        if done.returncode != 0 and "completed" not in message and "Invalid job id" not in message:
            scancel([state.id])  # pending after all, or requeued

    # --- network ----------------------------------------------------------------
    def listen_host(self) -> str:
        if self._listen_host is None:
            self._listen_host = find_listen_host()
        return self._listen_host

    # --- cleanup --------------------------------------------------------------
    def needs_reaper(self) -> bool:
        return True

    def cleanup(self, owner: str) -> None:
        from .. import OWNER
        if owner == OWNER:
            # this process is exiting: its monitor stops with it
            self._tracker.stop()
            if not self._submitted:
                return  # this process started no job
        try:
            done = run_command(["squeue", "-h", "-u", str(os.getuid()), "-o", "%i|%k"], timeout=30)
            ids = [line.split("|", 1)[0].strip() for line in done.stdout.splitlines()
                   if line.partition("|")[2].strip() == f"{OWNER_TAG}{owner}"]
            scancel(ids)
        except (subprocess.TimeoutExpired, SlurmError) as exc:
            log.warning("slurm backend: cannot cancel the jobs of %s: %s", owner, exc)
        try:
            slurm_dir = self.slurm_dir()
            for name in os.listdir(slurm_dir):
                if name.endswith(f"-{owner}.secret"):
                    os.unlink(os.path.join(slurm_dir, name))
        except (OSError, SlurmError):
            pass

    # --- `fiberrl submit` -----------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        return self._runs.submit(spec)

    def describe(self, job_id: str) -> dict:
        return self._runs.describe(job_id)

    def logs(self, job_id: str, follow: bool = False):
        return self._runs.logs(job_id, follow)

    def cancel(self, job_id: str) -> None:
        self._runs.cancel(job_id)
