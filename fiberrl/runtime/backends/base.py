"""The backend interface: everything the API layer asks of a cluster
manager.  Docker, Kubernetes and Slurm implement this class and nothing
above it changes."""
from __future__ import annotations

import abc
import codecs
import enum
import os
import socket
import struct
import sys
from dataclasses import dataclass, field

from .. import env_names

# what every job-backed process runs
CHILD_COMMAND = [sys.executable, "-c", "from fiberrl.runtime.processes.child import main; main()"]

# what a job on another machine or in a container inherits from this
# process's environment: its own variables would name paths of this host
FORWARDED_PREFIXES = (env_names.PREFIX,)
FORWARDED_NAMES = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE",
                   "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "HYDRA_FULL_ERROR")
# exit code of a job the cluster never ran (unschedulable, cancelled while pending)
NEVER_RAN_EXIT = 125


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
    run: str = ""
    """The run's public id (``auth.run_id()``), for labels and job names."""
    owner: str = ""
    """Id of the process that started the job; ``Backend.cleanup(owner)`` removes its jobs."""


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
    error: str | None = None
    """Why the job could not run, once a backend knows (image missing, never
    scheduled); its exit code is then ``NEVER_RAN_EXIT``."""
    lost: str | None = None
    """Why the job was ended from outside, with others, through nothing it did
    (its fork server killed), once its backend knows: a pool charges no task
    for such a death."""


class Backend(abc.ABC):
    name: str
    # whether a job writes to this process's terminal; if not, the job forwards its output here
    shares_terminal = False

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

    def get_listen_addr(self) -> tuple[str, int, str]:
        """Fiber's ``(ip, port, interface)``: the address this process listens
        on (the configured host, else ``listen_host()``), 0 for "any port",
        and the network interface that carries the address, which Fiber's
        ring example hands to gloo as GLOO_SOCKET_IFNAME ("" if none does)."""
        from ..config import get_config
        host = get_config().host or self.listen_host()
        return host, 0, interface_of(host)

    def cleanup(self, owner: str) -> None:  # noqa: B027 - most backends' jobs end with their owner
        """Remove every job ``owner`` started that is still there: run at exit,
        and by the reaper when the owner died without exiting."""

    def needs_reaper(self) -> bool:
        """Whether jobs could outlive a killed owner (a pending job has no
        connection to the owner to lose); if so a reaper process calls
        ``cleanup(owner)`` when the owner dies."""
        return False

    # --- `fiberrl submit`: a run's master as a detached job ----------------
    def submit(self, spec: JobSpec) -> str:
        """Start ``spec`` as a run's master job that outlives this process
        (never cleaned up with its owner); return an id for the methods below.
        ``spec.run`` names the run: ``cancel`` removes every job carrying it."""
        raise NotImplementedError(f"the {self.name} backend cannot submit runs; use docker, kubernetes or slurm")

    def describe(self, job_id: str) -> dict:
        """A submitted job's state: ``{"id", "state": pending|running|exited|unknown,
        "exit_code", "where"}`` (node, container or pod)."""
        raise NotImplementedError(f"the {self.name} backend has no submitted runs")

    def logs(self, job_id: str, follow: bool = False):
        """The submitted job's output as an iterator of text chunks; with
        ``follow``, until the job ends."""
        raise NotImplementedError(f"the {self.name} backend has no submitted runs")

    def cancel(self, job_id: str) -> None:
        """Stop a submitted job and every job of its run."""
        raise NotImplementedError(f"the {self.name} backend has no submitted runs")


_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def interface_of(address: str) -> str:
    """The name of the network interface that has ``address`` (IPv4, Linux),
    or "" where none has it or the platform cannot say."""
    try:
        import fcntl
        names = [name for _, name in socket.if_nameindex()]
        packed = socket.inet_aton(address)
    except (ImportError, OSError):
        return ""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            try:
                reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            if reply[20:24] == packed:
                return name
    return ""


def remote_env(env: dict[str, str], forward: str = "") -> dict[str, str]:
    """The part of ``env`` a job elsewhere should get: fiberrl's variables, the
    Python ones, and the comma-separated names in ``forward``."""
    names = set(FORWARDED_NAMES) | {n.strip() for n in forward.split(",") if n.strip()}
    return {k: v for k, v in env.items() if k in names or k.startswith(FORWARDED_PREFIXES)}


def decode_text(chunks):
    """Byte chunks of a job's output as text chunks; a character split across
    two chunks is decoded whole, bytes that are not UTF-8 are replaced."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    for chunk in chunks:
        if text := decoder.decode(chunk):
            yield text
    if tail := decoder.decode(b"", final=True):
        yield tail


def parse_volumes(text: str) -> list[tuple[str, str, bool]]:
    """``SRC:DST[:ro],...`` as (source, destination, read_only) triples."""
    mounts = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        pieces = item.split(":")
        mode = pieces[2] if len(pieces) == 3 else "rw"
        if len(pieces) not in (2, 3) or mode not in ("ro", "rw") or not pieces[0] or not pieces[1].startswith("/"):
            raise ValueError(f"volume {item!r}: expected SRC:DST or SRC:DST:ro with DST an absolute path "
                             f"inside the job, e.g. /data:/data:ro or outputs:/persistent")
        read_only = mode == "ro"
        mounts.append((pieces[0], pieces[1], read_only))
    return mounts


def working_directory(spec: JobSpec) -> str:
    return spec.cwd or os.getcwd()
