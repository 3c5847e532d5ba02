"""The backend interface: everything the API layer asks of a cluster
manager.  Docker, Kubernetes and Slurm implement this class and nothing
above it changes."""
from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field


@dataclass
class JobSpec:
    """What to run for one job-backed process, and what it needs."""

    command: list[str]
    name: str
    env: dict[str, str] = field(default_factory=dict)
    cpu: float | None = None
    mem: int | None = None
    """Memory in MiB."""
    gpu: int | None = None
    image: str | None = None
    volumes: dict[str, str] = field(default_factory=dict)
    """Host path or claim name -> mount path inside the job."""
    cwd: str | None = None


class JobStatus(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    EXITED = "exited"


@dataclass
class Job:
    """A backend's handle on one started job."""

    id: str
    spec: JobSpec
    pid: int | None = None
    host: str | None = None
    handle: object = None
    """Backend-private state (a Popen, a container, a pod name...)."""


class Backend(abc.ABC):
    name: str

    @abc.abstractmethod
    def create_job(self, spec: JobSpec) -> Job:
        """Start the job; return as soon as it is submitted."""

    @abc.abstractmethod
    def status(self, job: Job) -> tuple[JobStatus, int | None]:
        """The job's state and, once it has exited, its exit code
        (negative for a signal, as in ``multiprocessing``)."""

    @abc.abstractmethod
    def wait(self, job: Job, timeout: float | None = None) -> int | None:
        """Block until the job exits or ``timeout`` passes; the exit code or None."""

    @abc.abstractmethod
    def terminate(self, job: Job, force: bool = False) -> None:
        """Ask the job to stop (SIGTERM), or kill it (``force``)."""

    @abc.abstractmethod
    def listen_host(self) -> str:
        """The address this process should listen on so its jobs can reach it."""
