"""The DockerBackend: creating a job's container, its status, waiting for it,
terminating it, and cleaning up after an owner; the other parts of the job's
life come from the mixins it is made of."""
from __future__ import annotations

import os
import queue
import signal
import threading
import time
import uuid

from ..base import Backend, Job, JobSpec, JobStatus, remote_env
from .common import LABEL_OWNER, LABEL_PROCESS, LABEL_RUN
from .containers import ContainerSpecMixin
from .daemon import DaemonMixin
from .events import EventWatcherMixin
from .network import NetworkMixin
from .probes import in_container
from .starting import StarterMixin
from .submit import SubmitMixin
from .tracking import Tracked, TrackingMixin


class DockerBackend(EventWatcherMixin, StarterMixin, TrackingMixin, ContainerSpecMixin, NetworkMixin, SubmitMixin,
                    DaemonMixin, Backend):
    name = "docker"

    def __init__(self):
        self._api = None
        self._version: str | None = None
        self._client_lock = threading.Lock()
        self._cond = threading.Condition()
        self._tracked: dict[str, Tracked] = {}
        self._watchers: dict[str, threading.Thread] = {}
        self._watch_lock = threading.Lock()
        self._streams: dict = {}  # the watchers' event streams, by label
        self._to_start: queue.SimpleQueue = queue.SimpleQueue()
        self._starters = 0
        self._idle_starters = 0
        self._me: dict | None | bool = False  # False: not looked up yet; None: not in a container
        self._hosts: dict[str, str] = {}

    def create_job(self, spec: JobSpec) -> Job:
        from ...config import get_config
        config = get_config()
        self._watch(spec)  # before the container exists: no event of it can be missed
        name = f"fiberrl-{spec.run or 'job'}-{uuid.uuid4().hex[:8]}"
        labels = {LABEL_RUN: spec.run, LABEL_OWNER: spec.owner, LABEL_PROCESS: spec.name}
        # the run's secret travels in the environment, which `docker inspect` shows;
        # access to the Docker API is root on the Docker host anyway
        env = remote_env(spec.env, config.forward_env)
        container_id = self._create(spec, name, env, labels, self._host_config(spec, auto_remove=True))
        tracked = Tracked(container_id, name, time.monotonic() + config.schedule_timeout)
        job = Job(id=name, spec=spec, host=name, handle=tracked)
        tracked.job = job
        with self._cond:
            self._tracked[container_id] = tracked
        self._queue_start(tracked)
        return job

    # --- status, wait, terminate --------------------------------------------------------
    def status(self, job: Job):
        tracked: Tracked = job.handle
        if tracked.state is JobStatus.PENDING:
            self._check_deadline(tracked)
        return tracked.state, tracked.code

    def wait(self, job: Job, timeout: float | None = None):
        tracked: Tracked = job.handle
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                if tracked.state is JobStatus.EXITED:
                    return tracked.code
                now = time.monotonic()
                if end is not None and now >= end:
                    return None
                step = 5.0 if end is None else end - now
                if tracked.state is JobStatus.PENDING and not tracked.started:
                    step = min(step, max(tracked.deadline - now, 0) + 0.01)
                self._cond.wait(step)
            self._check_deadline(tracked)

    def terminate(self, job: Job, force: bool = False) -> None:
        tracked: Tracked = job.handle
        sig = signal.SIGKILL if force else signal.SIGTERM
        with self._cond:
            if tracked.state is JobStatus.EXITED:
                return
            if tracked.cancel != signal.SIGKILL:
                tracked.cancel = int(sig)
            started = tracked.started
        if started:
            self._kill(tracked.id, sig)

    # --- cleanup ------------------------------------------------------------------------
    def cleanup(self, owner: str) -> None:
        from .. import OWNER
        if not owner or (owner == OWNER and self._api is None):
            return  # this process never talked to the daemon: it started nothing
        self._remove_all({"label": f"{LABEL_OWNER}={owner}"})

    def needs_reaper(self) -> bool:
        # a container created but not yet started when its owner was killed stays
        # until removed.  The main process of a container (a job, a submitted
        # master: its parent is the container's init) takes a reaper down with it
        # when it dies, so it needs none; anywhere else one is worth its process
        return not (in_container() and os.getppid() == 1)
