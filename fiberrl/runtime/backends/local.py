"""Local backend: each job is a child OS process on this machine."""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, deque

from .base import CHILD_COMMAND, Backend, Job, JobSpec, JobStatus

# what forks local jobs of CHILD_COMMAND from a process that has the runtime imported: the processes
# layer installs its fork server (runtime/processes/fork_server.py) here, the backend knows only that
# it has start(env, cwd), alive, owner_pid, python_path and close()
_fork_server_type = None
# a fork server's death takes every job it forked with it: one killed this often (a kill storm, an
# out-of-memory killer that keeps picking it) can take a pool's workers each time before they finish
# a task, so past it jobs start as fresh interpreters, which die alone, for as long again
FORK_SERVER_DEATHS, FORK_SERVER_DEATHS_WITHIN_S = 5, 60.0
log = logging.getLogger("fiberrl")


def install_fork_server(server_type) -> None:
    global _fork_server_type
    _fork_server_type = server_type


def visible_gpus() -> list[str]:
    """GPUs this process may hand out: its CUDA_VISIBLE_DEVICES, else nvidia-smi's list."""
    declared = os.environ.get("CUDA_VISIBLE_DEVICES")
    if declared is not None:
        return [d.strip() for d in declared.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
    return []


class LocalBackend(Backend):
    name = "local"
    shares_terminal = True

    def __init__(self):
        self._gpus: list[str] | None = None
        self._gpu_load: Counter = Counter()
        self._lock = threading.Lock()
        self._fork_server = None
        self._fork_server_deaths: deque[float] = deque(maxlen=FORK_SERVER_DEATHS)
        self._fork_server_rests_until = 0.0

    def listen_host(self) -> str:
        return "127.0.0.1"

    def _assign_gpus(self, count: int) -> list[str]:
        with self._lock:
            if self._gpus is None:
                self._gpus = visible_gpus()
            if count > len(self._gpus):
                raise ValueError(
                    f"meta(gpu={count}) asks for more GPUs than this machine shows "
                    f"({len(self._gpus)}: CUDA_VISIBLE_DEVICES or nvidia-smi); lower gpu= or run on a GPU machine")
            chosen = sorted(self._gpus, key=lambda g: self._gpu_load[g])[:count]
            self._gpu_load.update(chosen)
            return chosen

    def _exited(self, job: Job) -> None:
        """What an exited job held goes back; a forked job says whether it died with its server."""
        job.lost = getattr(job.handle, "lost", None)
        with self._lock:
            for gpu in job.handle.gpus:
                self._gpu_load[gpu] -= 1
            job.handle.gpus = []

    def create_job(self, spec: JobSpec) -> Job:
        env = dict(spec.env)
        gpus: list[str] = []
        if spec.gpu:
            gpus = self._assign_gpus(spec.gpu)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        popen = self._fork(spec.command, env, spec.cwd) or \
            subprocess.Popen(spec.command, env=env, cwd=spec.cwd, close_fds=True)
        popen.gpus = gpus
        return Job(id=f"local-{popen.pid}-{uuid.uuid4().hex[:6]}", spec=spec, pid=popen.pid,
                   host="127.0.0.1", handle=popen)

    def _fork(self, command: list[str], env: dict, cwd: str):
        """The job forked from the fork server, or None where it must be a fresh interpreter."""
        from ..config import get_config
        if not get_config().local_fork_server or command != CHILD_COMMAND or sys.platform != "linux" \
                or _fork_server_type is None:
            return None
        with self._lock:
            server = self._fork_server
            if server is not None and not server.alive and server.owner_pid == os.getpid():
                self._fork_server_died()
            if time.monotonic() < self._fork_server_rests_until:
                return None
            if server is None or not server.alive or server.owner_pid != os.getpid():
                try:
                    self._fork_server = _fork_server_type()
                except OSError:  # it died as it started: this job is a fresh interpreter, the next tries again
                    self._fork_server_died()
                    return None
            server = self._fork_server
        if env.get("PYTHONPATH", "") != server.python_path:
            return None  # the server's sys.path would not be the job's
        try:
            return server.start(env, cwd)
        except OSError:
            return None

    def _fork_server_died(self) -> None:
        """Count a death of this process's fork server (the lock held); past the limit, rest it."""
        self._fork_server = None
        now = time.monotonic()
        self._fork_server_deaths.append(now)
        if len(self._fork_server_deaths) == FORK_SERVER_DEATHS \
                and now - self._fork_server_deaths[0] <= FORK_SERVER_DEATHS_WITHIN_S:
            self._fork_server_deaths.clear()
            self._fork_server_rests_until = now + FORK_SERVER_DEATHS_WITHIN_S
            log.warning("the local fork server died %d times within %.0f s, each time with every job it had "
                        "forked: local jobs start as fresh interpreters for the next %.0f s (slower to start, "
                        "but none dies with another)", FORK_SERVER_DEATHS, FORK_SERVER_DEATHS_WITHIN_S,
                        FORK_SERVER_DEATHS_WITHIN_S)

    def cleanup(self, owner: str) -> None:
        # at exit, after this process stopped its children: the fork server goes too
        with self._lock:
            server, self._fork_server = self._fork_server, None
        if server is not None:
            server.close()

    def status(self, job: Job):
        code = job.handle.poll()
        if code is None:
            return JobStatus.RUNNING, None
        self._exited(job)
        return JobStatus.EXITED, code

    def wait(self, job: Job, timeout: float | None = None):
        try:
            code = job.handle.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._exited(job)
        return code

    def terminate(self, job: Job, force: bool = False) -> None:
        if job.handle.poll() is None:
            try:
                job.handle.send_signal(signal.SIGKILL if force else signal.SIGTERM)
            except ProcessLookupError:
                pass
