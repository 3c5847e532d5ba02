"""What this process knows of each job's container, and the one way a job
ends: ``_exited`` (with ``_never_ran`` for a container that never started,
whether it was refused, removed, or late for its deadline)."""
from __future__ import annotations

import logging
import signal
import time

from ..base import NEVER_RAN_EXIT, Job, JobStatus

log = logging.getLogger("fiberrl")


class Tracked:
    """What this process knows of one job's container, kept by the watcher."""

    __slots__ = ("id", "name", "job", "state", "code", "deadline", "cancel", "starting", "started", "died", "oom")

    def __init__(self, container_id: str, name: str, deadline: float):
        self.id = container_id
        self.name = name
        self.job: Job | None = None
        self.state = JobStatus.PENDING
        self.code: int | None = None
        self.deadline = deadline
        self.cancel: int | None = None  # the signal terminate asked for
        self.starting = False  # a starter is in docker start
        self.started = False  # docker start returned
        self.died: int | None = None  # exit code seen while a start was in progress
        self.oom = False


class TrackingMixin:
    """The DockerBackend's job states; ``_cond`` guards them and ``_tracked``
    holds the jobs not yet exited, by container id."""

    def _timeout_message(self) -> str:
        from ...config import get_config
        return (f"its container was not running after schedule_timeout "
                f"({get_config().schedule_timeout:g} s); the Docker daemon may be overloaded")

    def _never_ran(self, tracked: Tracked, error: str) -> None:
        with self._cond:
            if tracked.state is JobStatus.EXITED:
                return
            if tracked.job is not None:
                tracked.job.error = error
        self._exited(tracked, NEVER_RAN_EXIT)

    def _exited(self, tracked: Tracked, code: int) -> None:
        with self._cond:
            if tracked.state is JobStatus.EXITED:
                return
            if tracked.oom and code == -signal.SIGKILL:  # said before anyone sees the exit
                spec = tracked.job.spec if tracked.job else None
                limit = f" (mem={spec.mem} MiB)" if spec is not None and spec.mem else ""
                log.warning("container %s of %s ran out of memory%s and was killed", tracked.name,
                            spec.name if spec else "?", limit)
            tracked.state, tracked.code = JobStatus.EXITED, code
            self._tracked.pop(tracked.id, None)
            self._cond.notify_all()

    def _check_deadline(self, tracked: Tracked) -> None:
        """A job whose container has not started by its deadline never runs."""
        if tracked.state is JobStatus.PENDING and time.monotonic() > tracked.deadline and not tracked.started:
            self._never_ran(tracked, self._timeout_message())
            self._remove_quietly(tracked.id)
