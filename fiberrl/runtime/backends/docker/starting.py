"""Starting created containers: a few starter threads take them from a queue
(``create_job`` does not wait for ``docker start``); a job terminated, late or
dead while its start was in progress is settled once ``docker start`` answers."""
from __future__ import annotations

import logging
import threading
import time

from ..base import JobStatus
from .common import STARTERS
from .containers import start_hint
from .tracking import Tracked

log = logging.getLogger("fiberrl")


class StarterMixin:
    """The DockerBackend's starters; uses its ``_to_start`` queue and counts
    them in ``_starters`` and ``_idle_starters``."""

    def _queue_start(self, tracked: Tracked) -> None:
        with self._cond:
            spawn = self._idle_starters == 0 and self._starters < STARTERS
            if spawn:
                self._starters += 1
            else:
                self._idle_starters -= 1  # claimed by this item
        self._to_start.put(tracked)
        if spawn:
            threading.Thread(target=self._starter, name="fiberrl-docker-start", daemon=True).start()

    def _starter(self) -> None:
        while True:
            tracked = self._to_start.get()
            try:
                self._start(tracked)
            except Exception:  # a starter must survive to start the others
                log.exception("starting container %s failed", tracked.name)
                self._never_ran(tracked, "starting its container failed (see the log)")
            with self._cond:
                self._idle_starters += 1

    def _start(self, tracked: Tracked) -> None:
        import docker
        with self._cond:
            if tracked.state is JobStatus.EXITED:
                return
            cancel, late = tracked.cancel, time.monotonic() > tracked.deadline
            tracked.starting = cancel is None and not late
        if cancel is not None:  # terminated before it started
            self._exited(tracked, -cancel)
        elif late:
            self._never_ran(tracked, self._timeout_message())
        if not tracked.starting:
            self._remove_quietly(tracked.id)
            return
        error = None
        try:
            self._client().start(tracked.id)
        except docker.errors.NotFound:
            error = "its container was removed before it started"
        except docker.errors.APIError as exc:
            error = f"Docker could not start its container: {exc.explanation or exc}{start_hint(exc)}"
        with self._cond:
            tracked.starting = False
            tracked.started = error is None
            cancel, died = tracked.cancel, tracked.died
            abandoned = tracked.state is JobStatus.EXITED  # schedule_timeout passed during the start
            if error is None and tracked.state is JobStatus.PENDING:
                tracked.state = JobStatus.RUNNING
                self._cond.notify_all()
        if error is not None:
            if cancel is not None:
                self._exited(tracked, -cancel)
            else:
                self._never_ran(tracked, error)
            self._remove_quietly(tracked.id)
        elif abandoned:
            self._remove_quietly(tracked.id)
        elif died is not None:
            self._exited(tracked, died)
        elif cancel is not None:
            self._kill(tracked.id, cancel)
