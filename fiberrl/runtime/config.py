"""Runtime configuration: defaults < config file < FIBERRL_* environment
variables < code, resolved on first use (never at import).

    import fiberrl.runtime as mp
    mp.configure(backend="local", heartbeat_timeout=5)

The file is TOML, ``./fiberrl.toml`` or the path in ``FIBERRL_CONFIG_FILE``,
with keys at the top level or under ``[runtime]``.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import tomllib
import types
import typing
from dataclasses import dataclass, fields

from . import env_names

ENV_PREFIX = env_names.PREFIX
FILE_ENV = env_names.CONFIG_FILE
DEFAULT_FILE = "fiberrl.toml"
# the backends (runtime.backends.BACKENDS has where each is; the settings come before any of them)
BACKEND_NAMES = ("local", "docker", "kubernetes", "slurm")
# variables the runtime hands to its children; not configuration keys
RESERVED_ENV = env_names.RESERVED


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message says which and why."""


@dataclass
class CommonSettings:
    """What every backend's jobs and this process go by."""
    backend: str = "auto"
    """Where job-backed processes run: local (child OS processes), docker,
    kubernetes or slurm; auto is kubernetes inside a pod, else local."""
    host: str = ""
    """Address this process listens on; empty lets the backend choose one its
    jobs can reach (loopback for local)."""
    heartbeat_interval: float = 0.0
    """Seconds between a child's heartbeats to its parent; one in a quarter of
    ``heartbeat_timeout`` asks for an answer, which tells the child its parent lives.
    0: as often as the parent listens for them, a quarter of ``silence_timeout``
    (2.5 s) where silence is watched, and on the local backend, where it is not, only
    the answered ones."""
    heartbeat_timeout: float = 30.0
    """A child whose parent has not answered for this long exits.  A parent that
    dies is seen at once (its connection closes); this only catches a hung
    parent or a vanished host, and must outlast a loaded machine: 256 busy
    workers on 2 cores left heartbeats unanswered for over 3 s."""
    silence_timeout: float = 10.0
    """A job on another host (any backend but local) that has not been heard for this
    long (it beats four times in it) is counted cut off: its
    host partitioned or stalled.  Its job is killed through the backend, and the
    job, once it can hear, finds itself given up and exits, so it is replaced, never
    back as well: a pool hands its work to other workers and starts its successor,
    RemoteEnvs rebuilds its envs on a new env server and takes their step again, a
    Ring raises RingError naming it, the sweep launcher starts its run again from
    its checkpoint.  A shorter stall costs only its time.  0: wait for ever."""
    preempt_grace: float = 20.0
    """Seconds a process told to stop (SIGTERM: a preempted node, a deleted pod,
    ``docker stop``) has to leave cleanly: a pool worker to finish the chunk it runs
    (what it held goes to others at once, nothing counts as a crash), an env server
    to be asked for its step, a run or a PPO learner to end its iteration and
    checkpoint.  Below Kubernetes' default 30 s, after which the pod is killed."""
    start_timeout: float = 60.0
    """Seconds a child may take to connect back to its parent after launch."""
    max_message_size: int = 1 << 30
    """The largest item (pickled) a queue or pipe carries between processes;
    a larger one is refused at ``put``/``send``, and a peer that sends one is
    hung up on."""
    log_level: str = "WARNING"
    """Level of the ``fiberrl`` logger."""
    log_file: str = ""
    """File every process of the run appends the ``fiberrl`` log to, each record
    naming its process; ``stdout``: standard output; empty: no log file."""
    schedule_timeout: float = 600.0
    """Seconds a job may wait to be scheduled (pending pod, queued Slurm job)
    before it is cancelled and reported as unable to start."""
    cpu_per_job: float = 0.0
    """CPU cores requested for each job whose function has no ``@meta(cpu=)``;
    0: the backend's default (Fiber's ``cpu_per_job``)."""
    mem_per_job: int = 0
    """MiB of memory requested for each job whose function has no ``@meta(mem=)``;
    0: the backend's default (Fiber's ``mem_per_job``)."""


@dataclass
class LocalSettings:
    """The local backend's."""
    local_fork_server: bool = True
    """Start local jobs by forking a process that has already imported the
    runtime (several times faster); false: a fresh interpreter per job."""
    local_cpu_bound_per_core: float = 2.0
    """When a local pool's workers outnumber its cores by more than this, chunks
    of a CPU-bound task (one whose worker ran or waited for a core most of its
    time) run on at most this many workers per core at once, and the others
    wait: more would only share the cores more thinly.  Other tasks run on
    every worker at once.  0: every task on every worker, as multiprocessing."""


@dataclass
class ClusterJobSettings:
    """What the docker, kubernetes and slurm backends give their jobs."""
    image: str = ""
    """Image of docker and kubernetes jobs; empty: the image this process runs in."""
    volumes: str = ""
    """Mounts for docker and kubernetes jobs, ``SRC:DST[:ro]`` comma-separated.
    SRC is a host path (or, on docker, a named volume; on kubernetes, a
    PersistentVolumeClaim name).  The working directory is always mounted."""
    forward_env: str = ""
    """Comma-separated environment variables copied into docker, kubernetes
    and slurm jobs, beyond FIBERRL_* and the Python ones."""


@dataclass
class DockerSettings:
    """The docker backend's."""
    docker_network: str = ""
    """Docker network of the jobs; empty: this container's network, else bridge."""


@dataclass
class KubernetesSettings:
    """The kubernetes backend's."""
    kubernetes_namespace: str = ""
    """Namespace of the pods; empty: this pod's own, else the kubeconfig's, else default."""
    kubernetes_config: str = ""
    """kubeconfig file; empty: in-cluster config inside a pod, else ~/.kube/config."""


@dataclass
class SlurmSettings:
    """The slurm backend's."""
    slurm_partition: str = ""
    slurm_account: str = ""
    slurm_time: str = ""
    """Slurm time limit of each job (``--time``), e.g. 1-00:00:00."""
    slurm_options: str = ""
    """Further sbatch options, as on a command line."""
    slurm_dir: str = ""
    """Directory on a file system every node shares, for the jobs' exit files,
    logs and the run's secret; empty: ~/.fiberrl/slurm."""


@dataclass
class RuntimeConfig(SlurmSettings, KubernetesSettings, DockerSettings, ClusterJobSettings, LocalSettings,
                    CommonSettings):
    """Every setting, as ``configure()``, ``fiberrl.toml`` and ``FIBERRL_<KEY>`` take them (flat: the
    groups above say which backend reads which); the app's ``backend.settings`` is typed from it."""


_KEYS = {f.name: f for f in fields(RuntimeConfig)}


def _seconds(value: float) -> bool:
    return math.isfinite(value) and value > 0


_SECONDS = (_seconds, "a finite number of seconds > 0")
# 0: a job not running at once is given up on (what the backends' tests set); a silent job never is;
# a child beats as often as its parent listens
_SECONDS_OR_NONE = (lambda value: math.isfinite(value) and value >= 0, "a finite number of seconds >= 0")
# what a setting may hold beyond its type, checked wherever it comes from: setting -> (test, what is allowed)
_LIMITS = {
    "backend": (lambda name: name == "auto" or name in BACKEND_NAMES, f"one of auto, {', '.join(BACKEND_NAMES)}"),
    "heartbeat_interval": _SECONDS_OR_NONE,
    "heartbeat_timeout": _SECONDS,
    "start_timeout": _SECONDS,
    "preempt_grace": _SECONDS,
    "silence_timeout": _SECONDS_OR_NONE,
    "schedule_timeout": _SECONDS_OR_NONE,
    "max_message_size": (lambda size: size >= 1, "a number of bytes >= 1"),
    "cpu_per_job": (lambda cpu: math.isfinite(cpu) and cpu >= 0, "a number of cores >= 0"),
    "local_cpu_bound_per_core": (lambda n: math.isfinite(n) and n >= 0, "a number of workers per core >= 0"),
    "mem_per_job": (lambda mem: mem >= 0, "a number of MiB >= 0"),
    # the hub hands it to logging in upper case
    "log_level": (lambda level: level.upper() in logging.getLevelNamesMapping(),
                  "a logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL"),
}

_config: RuntimeConfig | None = None
_code_overrides: dict[str, typing.Any] = {}


def _convert(key: str, value, source: str):
    kind = typing.get_type_hints(RuntimeConfig)[key]
    try:
        if kind is bool:
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered in ("1", "true", "yes", "on"):
                    return True
                if lowered in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            if isinstance(value, bool):
                return value
            raise ValueError(value)
        if kind is float and not isinstance(value, bool):
            return float(value)
        if kind is int and not isinstance(value, bool):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if kind is str:
            if not isinstance(value, str):
                raise ValueError(value)
            return value
    except (TypeError, ValueError):
        pass
    raise ConfigError(f"{source}: {key}={value!r} is not a valid {kind.__name__}")


def _checked(key: str, value, source: str):
    """``value`` of ``key`` converted to the setting's type, if it is within the setting's limits."""
    value = _convert(key, value, source)
    allows, allowed = _LIMITS.get(key, (lambda _: True, ""))
    if not allows(value):
        raise ConfigError(f"{source}: {key}={value!r}: must be {allowed}")
    return value


def _check_key(key: str, source: str) -> None:
    if key not in _KEYS:
        known = ", ".join(sorted(_KEYS))
        raise ConfigError(f"{source}: unknown runtime setting {key!r}; known settings: {known}")


def _from_file() -> dict:
    path = os.environ.get(FILE_ENV) or (DEFAULT_FILE if os.path.exists(DEFAULT_FILE) else None)
    if not path:
        return {}
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{FILE_ENV} names {path}, which does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    data = data.get("runtime", data)
    out = {}
    for key, value in data.items():
        _check_key(key, path)
        out[key] = _checked(key, value, path)
    return out


def _from_env() -> dict:
    out = {}
    for name, value in os.environ.items():
        if not name.startswith(ENV_PREFIX) or name in RESERVED_ENV:
            continue
        key = name[len(ENV_PREFIX):].lower()
        _check_key(key, f"environment variable {name}")
        out[key] = _checked(key, value, f"environment variable {name}")
    return out


def get_config() -> RuntimeConfig:
    """The resolved configuration of this process (resolved once, then cached)."""
    global _config
    if _config is None:
        inherited = os.environ.get("FIBERRL_RESOLVED_CONFIG")
        if inherited:
            # a child takes its parent's resolved settings as they are
            values = json.loads(inherited)
        else:
            values = {**_from_file(), **_from_env()}
        values.update(_code_overrides)
        _config = RuntimeConfig(**values)
        _apply_log_file(_config.log_file)
    return _config


_LOG_FORMAT = "%(asctime)s %(processName)s[%(process)d] %(levelname)s %(name)s: %(message)s"


def _apply_log_file(log_file: str) -> None:
    """Send the ``fiberrl`` log to ``log_file`` (replacing an earlier one); children
    resolve the same setting, so each process appends its own records."""
    logger = logging.getLogger("fiberrl")
    for handler in [h for h in logger.handlers if getattr(h, "_fiberrl_log_file", None) is not None]:
        if handler._fiberrl_log_file == log_file:
            return
        logger.removeHandler(handler)
        handler.close()
    if not log_file:
        return
    handler = logging.StreamHandler(sys.stdout) if log_file == "stdout" else logging.FileHandler(log_file)
    handler._fiberrl_log_file = log_file
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    logger.addHandler(handler)


def configure(**settings) -> RuntimeConfig:
    """Override settings from code (highest precedence).  Settings apply to
    what is started afterwards."""
    global _config
    for key, value in settings.items():
        _check_key(key, "configure()")
        _code_overrides[key] = _checked(key, value, "configure()")
    _config = None
    return get_config()


def reset() -> None:
    """Forget code overrides and re-resolve on next use (for tests)."""
    global _config
    _code_overrides.clear()
    _config = None


def serialize(config: RuntimeConfig) -> str:
    return json.dumps(dataclasses.asdict(config))


# --- Fiber's names: ``fiber.init(**settings)`` and ``fiber.config.<key>`` --------------------------
# Fiber settings that mean the same here under the same name: backend, image, log_level, log_file,
# cpu_per_job, mem_per_job, kubernetes_namespace; these others are about Fiber's own machinery
_FIBER_ONLY = {"merge_output", "use_bash", "ipc_active", "ipc_admin_master_port", "ipc_admin_worker_port",
               "use_push_queue"}


def _fiber_log_level(level):
    # Fiber takes logging's numbers (logging.DEBUG) as well as names
    return logging.getLevelName(level) if isinstance(level, int) and not isinstance(level, bool) else level


def _from_fiber(settings: dict) -> dict:
    """Fiber's ``init`` settings as runtime settings."""
    current = get_config()
    out = {}
    for key, value in settings.items():
        if key in _FIBER_ONLY:
            raise ConfigError(f"init(): Fiber's setting {key!r} has no meaning in fiberrl; remove it")
        if key == "debug":
            if value:
                out["log_level"] = "DEBUG"
        elif key == "default_backend":
            # Fiber uses it only where no backend is set
            if "backend" not in settings and current.backend == "auto":
                out["backend"] = value
        elif key == "default_image":
            if not settings.get("image") and not current.image:
                out["image"] = value
        elif key == "log_level":
            out["log_level"] = _fiber_log_level(value)
        elif key in ("backend", "image") and value is None:
            out[key] = "auto" if key == "backend" else ""  # Fiber's None: its default
        else:
            out[key] = value
    return out


def init(**settings) -> list[str]:
    """Fiber's ``fiber.init``: set runtime settings, Fiber's names included (``debug``,
    ``default_backend``, ``default_image``); returns the settings whose value changed."""
    before = dataclasses.asdict(get_config())
    runtime = _from_fiber(settings)
    after = dataclasses.asdict(configure(**runtime))
    if "log_level" in runtime:
        # the hub sets the level once, when it starts; init may come later
        logging.getLogger("fiberrl").setLevel(after["log_level"].upper())
    return [key for key in after if after[key] != before[key]]


def _fiber_reading(name: str):
    config = get_config()
    if name == "debug":
        return config.log_level.upper() == "DEBUG"
    if name == "default_backend":
        return config.backend
    if name == "default_image":
        return config.image
    raise KeyError(name)


def __getattr__(name: str):
    """``fiberrl.runtime.config.<key>``: the current value of a setting, as Fiber's ``fiber.config.<key>``."""
    if name in _KEYS:
        return getattr(get_config(), name)
    if name in ("debug", "default_backend", "default_image"):
        return _fiber_reading(name)
    if name in _FIBER_ONLY:
        raise AttributeError(f"Fiber's setting {name!r} has no meaning in fiberrl")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _ConfigModule(types.ModuleType):
    """Assigning ``fiberrl.runtime.config.<key> = value`` sets the setting, as
    Fiber's ``fiber.config.<key> = value`` did (it was a module of globals)."""

    def __setattr__(self, name: str, value) -> None:
        if name in _KEYS or name in _FIBER_ONLY or name in ("debug", "default_backend", "default_image"):
            init(**{name: value})
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _ConfigModule
