"""The backend class: jobs as pods (create, status from the watch's cache,
wait, terminate), this process's own pod (owner of the pods it starts, its
image and address), and cleanup of an owner's pods and Secrets."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from urllib.parse import urlparse

from ..base import NEVER_RAN_EXIT, Backend, Job, JobSpec, JobStatus
from .api import api_message
from .cache import PodCache
from .connection import _Connection, route_source
from .deletion import _Deleter, delete_matching, delete_pod
from .jobs import _PodJob, judge
from .names import CONTAINER, OWNER_LABEL, POD_IP_ENV, PROCESS_LABEL, RUN_LABEL, label_value
from .pod_spec import TERMINATE_GRACE, owner_references, pod_body
from .run_secret import RunSecrets, secret_of
from .submitted import _SubmittedRuns
from .watch import _Watch

log = logging.getLogger("fiberrl")


class KubernetesBackend(_SubmittedRuns, Backend):
    name = "kubernetes"

    def __init__(self):
        self._lock = threading.Lock()
        self._cache = PodCache()
        self._connections: dict[tuple, _Connection] = {}
        self._used: list[_Connection] = []   # where this process created pods
        self._watches: dict[tuple, _Watch] = {}
        self._secrets = RunSecrets()
        self._deleter = _Deleter()

    # --- connection ----------------------------------------------------------------
    def _connect(self) -> _Connection:
        """The connection the current settings name (each kept: jobs hold theirs)."""
        from ...config import get_config
        config = get_config()
        key = (config.kubernetes_config, config.kubernetes_namespace)
        with self._lock:
            if key not in self._connections:
                self._connections[key] = _Connection(config.kubernetes_config, config.kubernetes_namespace)
            return self._connections[key]

    def _own_pod(self) -> dict | None:
        """The pod this process runs in, if it runs in one."""
        if _Connection.own_pod_name() is None:
            return None
        return self._connect().own_pod()

    def _parent(self) -> dict | None:
        """This process's pod where it can own the pods it starts (owners are
        in the namespace of what they own)."""
        pod = self._own_pod()
        if pod is None or pod["metadata"].get("namespace") != self._connect().namespace:
            return None
        return pod

    def needs_reaper(self) -> bool:
        # inside a pod, deleting that pod deletes its jobs (ownerReferences)
        return _Connection.own_pod_name() is None or self._parent() is None

    def listen_host(self) -> str:
        address = os.environ.get(POD_IP_ENV)
        if address:
            return address
        if _Connection.own_pod_name() is not None:
            pod = self._own_pod()
            address = (pod or {}).get("status", {}).get("podIP")
            if address:
                return address
        connection = self._connect()
        if connection.route_source is None:  # a name lookup: once per connection
            url = urlparse(connection.host)
            connection.route_source = route_source(url.hostname or "127.0.0.1",
                                                   url.port or (443 if url.scheme == "https" else 80))
        return connection.route_source

    # --- pod specs -----------------------------------------------------------------
    def _image(self, spec: JobSpec, config) -> str:
        image = spec.image or config.image
        if image:
            return image
        pod = self._own_pod()
        if pod:
            containers = pod["spec"]["containers"]
            mine = [c for c in containers if c.get("name") == CONTAINER] or containers
            return mine[0]["image"]
        raise RuntimeError("the kubernetes backend needs an image for its pods: set image (FIBERRL_IMAGE) to an "
                           "image holding this Python environment and code at the same paths")

    def _pod_body(self, spec: JobSpec, name: str, labels: dict, owners: list | None) -> dict:
        from ...config import get_config
        config = get_config()
        return pod_body(spec, name, labels, owners, config, self._parent(), lambda: self._image(spec, config))

    def _owner_references(self) -> list:
        return owner_references(self._parent())

    # --- jobs -----------------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> Job:
        from ...config import get_config
        config = get_config()
        connection = self._connect()
        owners = self._owner_references()
        secret = secret_of(spec)
        self._secrets.ensure(connection, spec.run, secret, {RUN_LABEL: spec.run, OWNER_LABEL: spec.owner}, owners)
        watch = self._ensure_watch(connection, spec)
        name = f"fiberrl-{spec.run}-{uuid.uuid4().hex[:10]}"
        labels = {RUN_LABEL: spec.run, OWNER_LABEL: spec.owner}
        process = label_value(spec.name)
        if process:
            labels[PROCESS_LABEL] = process
        body = self._pod_body(spec, name, labels, owners)
        handle = _PodJob(name=name, namespace=connection.namespace, connection=connection, created=time.monotonic(),
                         schedule_timeout=config.schedule_timeout, watch=watch)
        job = Job(id=name, spec=spec, handle=handle)
        with self._cache.cond:
            self._cache.jobs[name] = handle
        try:
            connection.create(connection.api.create_namespaced_pod, connection.namespace, body)
        except connection.client_module.ApiException as exc:
            message = api_message(exc)
            if exc.status == 403 and "exceeded quota" in message:
                job.error = f"pod {name} was refused by a resource quota: {message}"
                handle.final = NEVER_RAN_EXIT
                with self._cache.cond:
                    self._cache.jobs.pop(name, None)
                return job
            with self._cache.cond:
                self._cache.jobs.pop(name, None)
            hint = (" (the service account needs create/get/list/watch/delete on pods, pods/log and secrets)"
                    if exc.status == 403 else "")
            raise RuntimeError(f"the kubernetes backend cannot create pod {name} in namespace "
                               f"{connection.namespace}: {message}{hint}") from None
        handle.posted = time.monotonic()
        return job

    def _ensure_watch(self, connection: _Connection, spec: JobSpec) -> _Watch:
        selector = f"{RUN_LABEL}={spec.run},{OWNER_LABEL}={spec.owner}"
        key = (id(connection), selector)
        with self._lock:
            if connection not in self._used:
                self._used.append(connection)
            if key not in self._watches:
                self._watches[key] = _Watch(self._cache, connection, selector)
            return self._watches[key]

    def status(self, job: Job):
        handle: _PodJob = job.handle
        if handle.final is not None:
            return JobStatus.EXITED, handle.final
        with self._cache.cond:
            state = self._cache.pods.get(handle.name)
            code, error = judge(handle, state)
            if code is None:
                running = state is not None and state.ran
                return (JobStatus.RUNNING if running else JobStatus.PENDING), None
            if handle.final is not None:  # another thread got here first
                return JobStatus.EXITED, handle.final
            handle.final = code
            job.error = error
            self._cache.jobs.pop(handle.name, None)
            state = self._cache.pods.pop(handle.name, None)
        if state is None or not state.gone:
            # an ended pod is of no further use (its output went to the parent); a pending one must go
            self._deleter.later(handle.connection, handle.namespace, handle.name)
        return JobStatus.EXITED, code

    def wait(self, job: Job, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cache.cond:
                generation = self._cache.generation
            state, code = self.status(job)
            if state is JobStatus.EXITED:
                return code
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            with self._cache.cond:
                if self._cache.generation == generation:
                    # woken by the watch; the timeout re-checks schedule_timeout
                    self._cache.cond.wait(0.5 if remaining is None else min(remaining, 0.5))

    def terminate(self, job: Job, force: bool = False) -> None:
        handle: _PodJob = job.handle
        if handle.final is not None:
            return
        if force or handle.requested is None:
            handle.requested = -(signal.SIGKILL if force else signal.SIGTERM)
        delete_pod(handle.connection, handle.namespace, handle.name, 0 if force else TERMINATE_GRACE)

    def cleanup(self, owner: str) -> None:
        from .. import OWNER
        if owner == OWNER:
            # at exit: nothing waits for a pod of this process any more
            with self._lock:
                watches = list(self._watches.values())
                self._watches.clear()
                connections = list(self._used)
            for watch in watches:
                watch.stop()
        else:  # the reaper, or a test: the owner's pods are where the settings point
            try:
                connections = [self._connect()]
            except RuntimeError as exc:
                log.warning("kubernetes backend: cannot remove the pods of owner %s: %s", owner, exc)
                return
        selector = f"{OWNER_LABEL}={owner}"
        for connection in connections:
            # the Secrets go, so a later pod of this process must create its run's again
            self._secrets.forget(connection.namespace)
            try:
                delete_matching(connection, "pod", selector)
                delete_matching(connection, "secret", selector)
            except Exception as exc:
                log.warning("kubernetes backend: cannot remove the pods of owner %s in namespace %s: %s", owner,
                            connection.namespace, api_message(exc) if hasattr(exc, "status") else repr(exc))
