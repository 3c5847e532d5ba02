"""``fiberrl submit`` on Slurm: a run's master as a detached batch job
named ``fiberrl-<run>-master``, its state, its log, and cancelling it with
every job of its run."""
from __future__ import annotations

import os
import threading
import time
import uuid

from ..base import NEVER_RAN_EXIT, JobSpec, decode_text
from .commands import scancel
from .jobinfo import ACTIVE_STATES, QUEUED_STATES, Accounting, decode_wait_status, queue_entry
from .sbatch import sbatch, sbatch_options
from .script import batch_script, job_env, make_slurm_dir, read_exit_file

MASTER_SUFFIX = "-master"


class SubmittedRuns:
    """The backend's submit/describe/logs/cancel."""

    def __init__(self, accounting: Accounting, sbatch_lock: threading.Lock):
        self._accounting = accounting
        self._sbatch_lock = sbatch_lock

    def submit(self, spec: JobSpec) -> str:
        slurm_dir = make_slurm_dir()
        run = spec.run or uuid.uuid4().hex[:12]
        spec_env = dict(spec.env)
        spec_env.setdefault("PYTHONUNBUFFERED", "1")  # its log is followed as it runs
        spec = JobSpec(**{**spec.__dict__, "env": spec_env})
        env, secret_path = job_env(spec, slurm_dir, f"{run}-submit-{uuid.uuid4().hex[:8]}.secret")
        script = batch_script(spec.command, env, slurm_dir, f"fiberrl run {run}: master", remove_after=secret_path)
        args = sbatch_options(spec, slurm_dir, f"fiberrl-{run}{MASTER_SUFFIX}", f"fiberrl-run={run}")
        try:
            job_id = sbatch(args, script, f"the master of run {run}", self._sbatch_lock)
        except BaseException:
            if secret_path:
                os.unlink(secret_path)
            raise
        with open(os.path.join(slurm_dir, f"{job_id}.run"), "w") as fh:
            fh.write(run + "\n")
        return job_id

    def describe(self, job_id: str) -> dict:
        slurm_dir = make_slurm_dir()
        entry = queue_entry(job_id)
        code = read_exit_file(os.path.join(slurm_dir, f"{job_id}.exit"))
        if entry is not None:
            slurm_state, reason, node, raw, _ = entry
            if slurm_state in QUEUED_STATES:
                return {"id": job_id, "state": "pending", "exit_code": None, "where": None,
                        "reason": reason, "slurm_state": slurm_state}
            if slurm_state in ACTIVE_STATES and code is None:
                return {"id": job_id, "state": "running", "exit_code": None, "where": node or None,
                        "slurm_state": slurm_state}
            if code is None:
                code = decode_wait_status(raw) if node else NEVER_RAN_EXIT
            return {"id": job_id, "state": "exited", "exit_code": code, "where": node or None,
                    "slurm_state": slurm_state}
        if code is not None:
            return {"id": job_id, "state": "exited", "exit_code": code, "where": None}
        accounted = self._accounting.lookup(job_id)
        if accounted is not None:
            slurm_state, code, ran = accounted
            return {"id": job_id, "state": "exited", "exit_code": code if ran else NEVER_RAN_EXIT, "where": None,
                    "slurm_state": slurm_state}
        return {"id": job_id, "state": "unknown", "exit_code": None, "where": None}

    def logs(self, job_id: str, follow: bool = False):
        return decode_text(self._log_bytes(os.path.join(make_slurm_dir(), f"{job_id}.log"), job_id, follow))

    def _log_bytes(self, path: str, job_id: str, follow: bool):
        position = 0
        while True:
            # the state first: all the output is in the file once the job has ended
            ended = follow and self.describe(job_id)["state"] in ("exited", "unknown")
            try:
                with open(path, "rb") as fh:
                    fh.seek(position)
                    while data := fh.read(65536):
                        position += len(data)
                        yield data
            except FileNotFoundError:
                pass
            if not follow or ended:
                return
            time.sleep(0.5)

    def cancel(self, job_id: str) -> None:
        slurm_dir = make_slurm_dir()
        run = None
        entry = queue_entry(job_id)
        if entry is not None and entry[4].startswith("fiberrl-") and entry[4].endswith(MASTER_SUFFIX):
            run = entry[4][len("fiberrl-"):-len(MASTER_SUFFIX)]
        if run is None:
            try:
                with open(os.path.join(slurm_dir, f"{job_id}.run")) as fh:
                    run = fh.read().strip() or None
            except OSError:
                pass
        scancel([job_id])
        if run is None:
            return
        user = ["-u", str(os.getuid())]
        scancel([], f"--name=fiberrl-{run}", *user)
        # a master still stopping may submit more: sweep again once it has left
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            entry = queue_entry(job_id)
            if entry is None or entry[0] not in ACTIVE_STATES:
                break
            time.sleep(0.5)
        scancel([], f"--name=fiberrl-{run}", *user)
