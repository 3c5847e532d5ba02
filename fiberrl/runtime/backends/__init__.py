"""Backends turn a JobSpec into a running job on a cluster manager."""
from __future__ import annotations

from .base import Backend, Job, JobSpec, JobStatus

_instances: dict[str, Backend] = {}


def get_backend(name: str | None = None) -> Backend:
    """The backend called ``name``, or the configured one."""
    if name is None:
        from ..config import get_config
        name = get_config().backend
    if name not in _instances:
        if name == "local":
            from .local import LocalBackend
            _instances[name] = LocalBackend()
        else:
            raise ValueError(f"unknown backend {name!r}; available: local")
    return _instances[name]


def listen_host() -> str:
    """The address this process listens on: the configured host, else the backend's."""
    from ..config import get_config
    return get_config().host or get_backend().listen_host()


__all__ = ["Backend", "Job", "JobSpec", "JobStatus", "get_backend", "listen_host"]
