"""The monitor: one thread per backend that keeps the state of every job it
started, from the jobs' exit files (the source of truth) and one ``squeue``
for all of them per second, and cancels pending jobs that will never start."""
from __future__ import annotations

import logging
import os
import subprocess
import threading
import time

from ..base import NEVER_RAN_EXIT, Job
from .commands import SlurmError, run_command, scancel
from .jobinfo import ACTIVE_STATES, QUEUED_STATES, decode_wait_status
from .outcomes import Endings, never_ran_code, pending_error
from .script import read_exit_file
from .state import JobState

log = logging.getLogger("fiberrl")

POLL_INTERVAL = 1.0
"""Seconds between the monitor's squeue calls."""
EXIT_FILE_INTERVAL = 0.25
"""Seconds between its looks at the exit files of running jobs..."""
QUICK_EXIT_CHECKS = 64
"""...while there are at most this many; else once per squeue."""
EXIT_FILE_GRACE = 3.0
"""Seconds a job Slurm says has ended may take to show its exit file (a
shared file system's caches) before Slurm's own exit code is taken."""


class Tracker:
    """The jobs a backend started that have not ended, and the thread that
    watches them; a job's ``JobState.done`` is set once its end is known."""

    def __init__(self, endings: Endings):
        self._endings = endings
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}  # jobs not yet known to have ended
        self._wake = threading.Condition(self._lock)
        self._monitor: threading.Thread | None = None
        self._stopping = False
        self._squeue_failures = 0

    def add(self, job: Job) -> None:
        with self._lock:
            self._jobs[job.id] = job
            self._ensure_monitor()

    def ensure_running(self) -> None:
        """Start the monitor again if it stopped (``stop()``)."""
        if self._monitor is None:
            with self._lock:
                self._ensure_monitor()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            monitor = self._monitor
            self._wake.notify_all()
        if monitor is not None:
            monitor.join(5)
        with self._lock:
            self._stopping = False  # status() and wait() start it again should they be asked

    def terminating(self, state: JobState, force: bool) -> None:
        """terminate() was asked: how the job's end is to be reported."""
        with self._lock:
            state.killed = state.killed or force
            if not state.ran and state.cancel_code is None:
                state.cancel_code = -9 if force else -15

    def _ensure_monitor(self) -> None:
        """Start the monitor thread if it is not running (called with the lock held)."""
        if self._monitor is None and not self._stopping:
            self._monitor = threading.Thread(target=self._watch, name="fiberrl-slurm-monitor", daemon=True)
            self._monitor.start()

    def _watch(self) -> None:
        """The monitor: runs while there are jobs whose end it has not seen."""
        next_poll = 0.0
        while True:
            with self._lock:
                if not self._jobs or self._stopping:
                    self._monitor = None
                    return
                jobs = list(self._jobs.values())
            if time.monotonic() >= next_poll:
                snapshot_at = time.monotonic()
                queue = self._squeue(jobs)
                next_poll = snapshot_at + POLL_INTERVAL
            else:
                snapshot_at, queue = None, None
            try:
                self._update(jobs, queue, snapshot_at)
            except Exception:  # the monitor must survive anything
                log.exception("slurm backend: updating job states failed")
            with self._lock:
                self._wake.wait(EXIT_FILE_INTERVAL)

    def _squeue(self, jobs: list[Job]) -> dict[str, tuple[str, str, str, str]] | None:
        names = sorted({f"fiberrl-{job.spec.run or 'norun'}" for job in jobs})
        args = ["squeue", "-h", "-t", "all", "-u", str(os.getuid()), f"--name={','.join(names)}",
                "-O", "JobID:|,State:|,Reason:|,NodeList:|,exit_code:|"]
        try:
            done = run_command(args, timeout=30)
        except (subprocess.TimeoutExpired, SlurmError) as exc:
            self._squeue_failed(str(exc))
            return None
        if done.returncode != 0:
            self._squeue_failed(done.stderr.strip() or f"exit status {done.returncode}")
            return None
        self._squeue_failures = 0
        out = {}
        for line in done.stdout.splitlines():
            fields = [f.strip() for f in line.split("|")]
            if len(fields) >= 5 and fields[0]:
                out[fields[0]] = (fields[1], fields[2], fields[3], fields[4])
        return out

    def _squeue_failed(self, message: str) -> None:
        self._squeue_failures += 1
        if self._squeue_failures == 30:
            log.warning("slurm backend: squeue keeps failing (%s); job states come from exit files only "
                        "until it answers, and no pending job times out", message)

    def _update(self, jobs: list[Job], queue, snapshot_at: float | None) -> None:
        now = time.monotonic()
        to_cancel: list[Job] = []
        finished: list[tuple[Job, int, str | None]] = []
        # between squeue calls only the exit files of running jobs are looked
        # at, and only while they are few (each look is a lookup on a shared
        # file system); the rest wait for the next squeue
        quick = sum(1 for job in jobs if job.handle.ran) <= QUICK_EXIT_CHECKS
        for job in jobs:
            state: JobState = job.handle
            if queue is None and not (quick and state.ran):
                continue
            code = read_exit_file(state.exit_path)
            if code is not None:
                finished.append((job, code, None))
                continue
            if queue is None:
                continue
            entry = queue.get(state.id)
            if entry is None:
                # left the queue; a snapshot begun before sbatch returned may not show it yet
                if snapshot_at is None or snapshot_at < state.submitted:
                    continue
                if state.ended_at is None:
                    state.ended_at = now
                if now - state.ended_at >= EXIT_FILE_GRACE:
                    finished.append((job, *self._endings.lost_code(state)))
                continue
            slurm_state, reason, node, raw_code = entry
            slurm_state = slurm_state.split()[0] if slurm_state else ""
            if slurm_state == "PENDING" and state.state != "PENDING":
                state.pending_since = now  # suspended and requeued by an operator, say
            state.state, state.reason = slurm_state, reason
            if node and slurm_state not in QUEUED_STATES:
                state.node = node
                if not state.ran:
                    state.ran = True
                    job.host = node
            if slurm_state in ACTIVE_STATES:
                if slurm_state == "PENDING":
                    error = pending_error(state, reason, now)
                    if error:
                        job.error = error
                        to_cancel.append(job)
                continue
            # Slurm says it ended: the exit file should follow at once
            state.slurm_state = slurm_state
            state.slurm_code = decode_wait_status(raw_code)
            if state.ended_at is None:
                state.ended_at = now
            if not state.ran and slurm_state in ("CANCELLED", "BOOT_FAIL", "DEADLINE", "FAILED"):
                finished.append((job, *never_ran_code(state, slurm_state, reason)))
            elif now - state.ended_at >= EXIT_FILE_GRACE:
                finished.append((job, *self._endings.ended_code(state)))
        if to_cancel:
            scancel([job.id for job in to_cancel])
            finished += [(job, NEVER_RAN_EXIT, job.error) for job in to_cancel]
        for job, code, error in finished:
            self._finish(job, code, error)

    def _finish(self, job: Job, code: int, error: str | None) -> None:
        state: JobState = job.handle
        with self._lock:
            if state.done.is_set():
                return
            if error and not job.error:
                job.error = error
            if state.killed and code < 0:
                code = -9
            state.exit_code = code
            self._jobs.pop(job.id, None)
            state.done.set()
        for path in (state.exit_path,):
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            if os.path.getsize(state.log_path) == 0:
                os.unlink(state.log_path)
        except OSError:
            pass
