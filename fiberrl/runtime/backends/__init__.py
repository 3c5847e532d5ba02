"""Backends turn a JobSpec into a running job on a cluster manager."""
from __future__ import annotations

import atexit
import importlib
import os
import subprocess
import sys
import threading
import uuid

from .. import env_names
from .base import NEVER_RAN_EXIT, Backend, Job, JobSpec, JobStatus

BACKENDS = {
    "local": "fiberrl.runtime.backends.local:LocalBackend",
    "docker": "fiberrl.runtime.backends.docker:DockerBackend",
    "kubernetes": "fiberrl.runtime.backends.kubernetes:KubernetesBackend",
    "slurm": "fiberrl.runtime.backends.slurm:SlurmBackend",
}
# jobs this process starts carry it; cleanup and the reaper find them by it
OWNER = uuid.uuid4().hex[:12]

_instances: dict[str, Backend] = {}
_watched: set[str] = set()
_lock = threading.Lock()


def register(name: str, where: str) -> None:
    """Make ``backend=name`` start jobs with a Backend of one's own, ``where`` being
    "module:Class" (a module this process imports; "__main__:Class" for a script's own)."""
    from .. import config
    if name == "auto" or not name.isidentifier():
        raise ValueError(f"{name!r} cannot name a backend: a Python identifier other than auto")
    module, _, cls = where.partition(":")
    if not module or not cls:
        raise ValueError(f"{where!r}: a backend is given as 'module:Class'")
    BACKENDS[name] = where
    if name not in config.BACKEND_NAMES:
        config.BACKEND_NAMES += (name,)


def resolve_name(name: str) -> str:
    """``auto`` is kubernetes inside a pod, else local."""
    if name == "auto":
        return "kubernetes" if os.environ.get("KUBERNETES_SERVICE_HOST") else "local"
    return name


def make_backend(name: str) -> Backend:
    """A new instance of the backend called ``name``, not watched (the reaper's)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)} (or auto)")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def get_backend(name: str | None = None) -> Backend:
    """The backend called ``name``, or the configured one."""
    if name is None:
        from ..config import get_config
        name = get_config().backend
    name = resolve_name(name)
    with _lock:
        if name not in _instances:
            _instances[name] = make_backend(name)
        return _instances[name]


def start_job(spec: JobSpec, name: str | None = None) -> Job:
    """Start ``spec`` on the backend called ``name`` (or the configured one).
    A process that starts its first job on a backend has that backend clean
    up after it: only such processes pay for it (a manager server or a ring
    member that starts nothing runs no reaper)."""
    backend = get_backend(name)
    with _lock:
        if backend.name not in _watched:
            _watched.add(backend.name)
            _watch_owner(backend.name, backend)
    return backend.create_job(spec)


def listen_host() -> str:
    """The address this process listens on: the configured host, else the backend's."""
    from ..config import get_config
    return get_config().host or get_backend().listen_host()


def _watch_owner(name: str, backend: Backend) -> None:
    """Clean up this process's jobs at exit; where jobs could outlive a killed
    process, a reaper process does it when this one dies."""
    atexit.register(backend.cleanup, OWNER)
    if backend.needs_reaper():
        from ..config import get_config, serialize
        env = dict(os.environ, **{env_names.RESOLVED_CONFIG: serialize(get_config())})
        reaper = subprocess.Popen(
            [sys.executable, "-m", "fiberrl.runtime.backends.reaper", str(os.getpid()), name, OWNER],
            env=env, stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        atexit.register(_stop_reaper, reaper)


def _stop_reaper(reaper: subprocess.Popen) -> None:
    reaper.terminate()
    try:
        reaper.wait(5)
    except subprocess.TimeoutExpired:
        reaper.kill()


__all__ = ["BACKENDS", "NEVER_RAN_EXIT", "OWNER", "Backend", "Job", "JobSpec", "JobStatus", "get_backend",
           "listen_host", "make_backend", "register", "resolve_name", "start_job"]
