"""Docker backend: each job is a container on one Docker daemon.

A job's container runs the job's command in the configured image (or, from
a process that itself runs in a container, that container's image), on the
configured network (or that container's, or ``bridge``), with the working
directory and the ``volumes`` setting mounted at the same paths, and is
removed by the daemon when it exits (``auto_remove``).

Because exited containers disappear, the daemon's event stream is the
source of truth: one watcher thread per process follows the events of the
containers this process labelled as its own and keeps each job's state and
exit code in memory, so ``status`` costs nothing (the Pool asks it twice a
second for every worker still starting).  ``create_job`` creates the
container (bad images and mounts fail there, at once) and hands the start
to a few starter threads, so starting 256 pool workers does not wait for
256 sequential ``docker start`` calls.

Docker reports a container whose process died of signal N as exit code
128+N; jobs report -N, as ``multiprocessing`` does (137 -> -9, 143 -> -15;
a job that itself exits with 129..159 reads as a signal too).

Jobs reach this process at its address on their network: on the host, the
network's gateway (docker0's 172.17.0.1 for ``bridge``); in a container, its
own address there.  A job that starts processes itself needs the Docker API:
mount the socket with the ``volumes`` setting.  Whoever can use the Docker
API is root on the Docker host, so the run's secret travels in the job's
environment.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import queue
import re
import signal
import socket
import threading
import time
import uuid
from urllib.parse import urlparse

from .base import (NEVER_RAN_EXIT, Backend, Job, JobSpec, JobStatus, decode_text, parse_volumes, remote_env,
                   working_directory)

log = logging.getLogger("fiberrl")

LABEL_RUN = "fiberrl.run"
LABEL_OWNER = "fiberrl.owner"
LABEL_PROCESS = "fiberrl.process"
LABEL_SUBMITTED = "fiberrl.submitted"
DOCKER_SOCKET = "/var/run/docker.sock"
SOCKET_VOLUME = f"{DOCKER_SOCKET}:{DOCKER_SOCKET}"
STARTERS = 8  # containers started at once
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


def exit_code(code: int) -> int:
    """A container's exit code as ``multiprocessing`` shows it: 128+N (the
    container's process died of signal N) becomes -N."""
    if 128 < code < 128 + 32:
        return -(code - 128)
    return code


def docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or f"unix://{DOCKER_SOCKET}"


def in_container() -> bool:
    """Whether this process runs in a Docker container (not /.dockerenv:
    machine images made from Docker images have one too)."""
    return bool(_mounted_ids())


def _mounted_ids() -> list[str]:
    """Docker bind-mounts a container's /etc/hostname, /etc/hosts and
    /etc/resolv.conf from its containers/<id>/ directory on the host."""
    found = []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and fields[4] in ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf"):
                    match = re.search(r"/containers/([0-9a-f]{64})/", fields[3])
                    if match and match.group(1) not in found:
                        found.append(match.group(1))
    except OSError:
        pass
    return found


def own_container_candidates() -> list[str]:
    """Ids this process's container may have: from its mounts, its cgroups
    (cgroup v1, or v2 without a cgroup namespace), its host name."""
    found = _mounted_ids()
    try:
        with open("/proc/self/cgroup") as fh:
            found += [m for m in re.findall(r"docker[/-]([0-9a-f]{64})", fh.read()) if m not in found]
    except OSError:
        pass
    hostname = socket.gethostname()
    if re.fullmatch(r"[0-9a-f]{12}", hostname):
        found.append(hostname)
    return found


class DockerError(RuntimeError):
    """The Docker daemon cannot be used, or refused a request; says what to do."""


class _Tracked:
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


class DockerBackend(Backend):
    name = "docker"

    def __init__(self):
        self._api = None
        self._version: str | None = None
        self._client_lock = threading.Lock()
        self._cond = threading.Condition()
        self._tracked: dict[str, _Tracked] = {}
        self._watchers: dict[str, threading.Thread] = {}
        self._watch_lock = threading.Lock()
        self._streams: dict = {}  # the watchers' event streams, by label
        self._to_start: queue.SimpleQueue = queue.SimpleQueue()
        self._starters = 0
        self._idle_starters = 0
        self._me: dict | None | bool = False  # False: not looked up yet; None: not in a container
        self._hosts: dict[str, str] = {}

    # --- the daemon -------------------------------------------------------------
    def _client(self, fresh: bool = False):
        """The low-level API client (``fresh``: a new one, e.g. for the event stream)."""
        if self._api is not None and not fresh:
            return self._api
        with self._client_lock:
            if self._api is not None and not fresh:
                return self._api
            try:
                import docker
            except ImportError:
                raise DockerError("the docker backend needs the docker Python package: pip install docker") from None
            try:
                api = docker.APIClient(**docker.utils.kwargs_from_env(), version=self._version or "auto",
                                       timeout=120, max_pool_size=4 * STARTERS)
            except docker.errors.DockerException as exc:
                raise DockerError(self._unreachable(exc)) from None
            if fresh:
                return api
            self._version = api.api_version
            self._api = api
            return api

    @staticmethod
    def _unreachable(exc) -> str:
        message = f"cannot reach the Docker daemon at {docker_host()} (DOCKER_HOST): {exc}. "
        if in_container():
            return message + (f"This process runs in a container: to start jobs from it, mount the Docker socket "
                              f"into it, e.g. add {SOCKET_VOLUME} to the `volumes` setting (FIBERRL_VOLUMES or "
                              f"configure(volumes=...)) of the jobs that start processes")
        return message + "Start the daemon (`dockerd &`, or `systemctl start docker`) or point DOCKER_HOST at it"

    def _me_container(self) -> dict | None:
        """``docker inspect`` of the container this process runs in, or None on a host."""
        if self._me is False:
            api = self._client()
            import docker
            me = None
            for candidate in own_container_candidates():
                try:
                    info = api.inspect_container(candidate)
                except docker.errors.APIError:
                    continue
                if info["Id"].startswith(candidate) and (
                        CONTAINER_ID.fullmatch(candidate) or info["Config"].get("Hostname") == socket.gethostname()):
                    me = info
                    break
            self._me = me
        return self._me

    def _image(self, spec: JobSpec) -> str:
        from ..config import get_config
        image = spec.image or get_config().image
        if image:
            return image
        me = self._me_container()
        if me is None:
            raise ValueError("the docker backend needs an image for its jobs: set `image` (FIBERRL_IMAGE=..., "
                             "configure(image=...) or image = \"...\" in fiberrl.toml), e.g. one built with "
                             "`docker build -t myproject .`; only a process that itself runs in a container "
                             "defaults to that container's image")
        return me["Image"]

    def _network(self) -> str:
        from ..config import get_config
        configured = get_config().docker_network
        if configured:
            return configured
        me = self._me_container()
        if me is None:
            return "bridge"
        mode = me["HostConfig"].get("NetworkMode") or "default"
        networks = list(me["NetworkSettings"].get("Networks") or {})
        if mode == "host":
            return "host"
        if mode in networks:
            return mode
        return networks[0] if networks else "bridge"

    # --- where the jobs reach this process ------------------------------------------
    def listen_host(self) -> str:
        from ..config import get_config
        key = get_config().docker_network
        host = self._hosts.get(key)
        if host is None:
            host = self._hosts[key] = self._find_listen_host()
        return host

    def _find_listen_host(self) -> str:
        parent = os.environ.get("FIBERRL_PARENT_ADDRESS")
        if parent:
            # a job: its jobs share its network, and its address there is the one
            # it reaches its own parent from (no Docker API needed to find it)
            address = route_source(urlparse(parent).hostname or "")
            if address:
                return address
        network = self._network()
        if network == "host":
            return "127.0.0.1"
        me = self._me_container()
        if me is not None:
            networks = me["NetworkSettings"].get("Networks") or {}
            address = (networks.get(network) or {}).get("IPAddress")
            if not address:
                name = me["Name"].lstrip("/")
                raise DockerError(f"this container ({name}) is not on the Docker network {network!r} of its jobs: "
                                  f"connect it (`docker network connect {network} {name}`) or set docker_network "
                                  f"to one of its networks ({', '.join(networks) or 'none'})")
            return address
        return self._gateway(network)

    def _gateway(self, network: str) -> str:
        """This host's address on a Docker network (docker0 for bridge)."""
        import docker
        try:
            info = self._client().inspect_network(network)
        except docker.errors.NotFound:
            raise DockerError(f"no Docker network {network!r}: create it (`docker network create {network}`) or "
                              f"fix the docker_network setting") from None
        configs = (info.get("IPAM") or {}).get("Config") or []
        candidates = [c["Gateway"].split("/")[0] for c in configs if c.get("Gateway")]
        # the default bridge often names no gateway: its interface (docker0) has it
        bridge = (info.get("Options") or {}).get("com.docker.network.bridge.name")
        if info.get("Driver") == "bridge":
            candidates.append(interface_address(bridge or f"br-{info['Id'][:12]}"))
        for config in configs:
            try:
                subnet = ipaddress.ip_network(config.get("Subnet", ""), strict=False)
            except ValueError:
                continue
            # the address this machine sends from into the subnet, if it lies in it
            source = route_source(str(subnet.network_address + 2))
            if source and ipaddress.ip_address(source) in subnet:
                candidates.append(source)
        candidates = sorted((c for c in candidates if c), key=lambda c: ":" in c)  # IPv4 first
        for address in candidates:
            if can_bind(address):
                return address
        raise DockerError(f"this machine has no address on the Docker network {network!r} "
                          f"(is DOCKER_HOST a remote daemon?): set `host` to an "
                          f"address of this machine that containers on {network!r} can reach")

    # --- creating jobs ------------------------------------------------------------------
    def _mounts(self, spec: JobSpec, extra: list[tuple[str, str, bool]] = ()):
        """The job's mounts: the working directory, ``spec.volumes``, then the
        ``volumes`` setting (a later one on the same path wins)."""
        from docker.types import Mount

        from ..config import get_config
        by_target: dict[str, Mount] = {}
        cwd = working_directory(spec)
        me = self._me_container()
        if me is None:
            if cwd != "/":
                by_target[cwd] = Mount(cwd, cwd, type="bind")
        else:
            # paths here are this container's: the job gets the mount that holds
            # the working directory, from the same source (else the image has it)
            holder = None
            for mount in me.get("Mounts") or []:
                dest = mount.get("Destination", "")
                holds = cwd == dest or cwd.startswith(dest.rstrip("/") + "/")
                if holds and mount.get("Type") in ("bind", "volume") and (
                        holder is None or len(dest) > len(holder["Destination"])):
                    holder = mount
            if holder is not None:
                source = holder["Source"] if holder["Type"] == "bind" else holder["Name"]
                by_target[holder["Destination"]] = Mount(holder["Destination"], source, type=holder["Type"],
                                                         read_only=not holder.get("RW", True))
        volumes = [(src, *dst.rsplit(":", 1)) if dst.endswith((":ro", ":rw")) else (src, dst, "rw")
                   for src, dst in (spec.volumes or {}).items()]
        mounts = [(src, dst, mode == "ro") for src, dst, mode in volumes]
        mounts += list(extra) + parse_volumes(get_config().volumes)
        for source, target, read_only in mounts:
            kind = "bind" if source.startswith("/") else "volume"
            by_target[target] = Mount(target, source, type=kind, read_only=read_only)
        return list(by_target.values())

    def _host_config(self, spec: JobSpec, auto_remove: bool, extra_mounts=()):
        from docker.types import DeviceRequest
        kwargs = dict(auto_remove=auto_remove, init=True, network_mode=self._network(),
                      mounts=self._mounts(spec, extra_mounts))
        if spec.cpu:
            kwargs["nano_cpus"] = int(round(spec.cpu * 1e9))
        if spec.mem:
            # no swap beyond the limit (Docker's default allows as much again)
            kwargs["mem_limit"] = kwargs["memswap_limit"] = int(spec.mem * 1024 * 1024)
        if spec.gpu:
            kwargs["device_requests"] = [DeviceRequest(count=int(spec.gpu), capabilities=[["gpu"]])]
        return self._client().create_host_config(**kwargs)

    def _create(self, spec: JobSpec, name: str, env: dict, labels: dict, host_config) -> str:
        import docker
        image = self._image(spec)
        try:
            created = self._client().create_container(
                image, command=list(spec.command), environment=env, labels=labels, name=name, detach=True,
                working_dir=working_directory(spec), host_config=host_config)
        except docker.errors.ImageNotFound:
            raise DockerError(
                f"the Docker image {image!r} is not on the Docker daemon at {docker_host()}: build it "
                f"(`docker build -t {image} .`) or pull it (`docker pull {image}`), or set `image` "
                f"(FIBERRL_IMAGE=... or configure(image=...)) to an image the daemon has") from None
        except docker.errors.APIError as exc:
            raise DockerError(f"the Docker daemon would not create a container for {spec.name}: "
                              f"{exc.explanation or exc}{_create_hint(exc)}") from None
        return created["Id"]

    def create_job(self, spec: JobSpec) -> Job:
        from ..config import get_config
        config = get_config()
        self._watch(spec)  # before the container exists: no event of it can be missed
        name = f"fiberrl-{spec.run or 'job'}-{uuid.uuid4().hex[:8]}"
        labels = {LABEL_RUN: spec.run, LABEL_OWNER: spec.owner, LABEL_PROCESS: spec.name}
        # the run's secret travels in the environment, which `docker inspect` shows;
        # access to the Docker API is root on the Docker host anyway
        env = remote_env(spec.env, config.forward_env)
        container_id = self._create(spec, name, env, labels, self._host_config(spec, auto_remove=True))
        tracked = _Tracked(container_id, name, time.monotonic() + config.schedule_timeout)
        job = Job(id=name, spec=spec, host=name, handle=tracked)
        tracked.job = job
        with self._cond:
            self._tracked[container_id] = tracked
        self._queue_start(tracked)
        return job

    # --- starting -------------------------------------------------------------------------
    def _queue_start(self, tracked: _Tracked) -> None:
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

    def _start(self, tracked: _Tracked) -> None:
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
            error = f"Docker could not start its container: {exc.explanation or exc}{_start_hint(exc)}"
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

    def _timeout_message(self) -> str:
        from ..config import get_config
        return (f"its container was not running after schedule_timeout "
                f"({get_config().schedule_timeout:g} s); the Docker daemon may be overloaded")

    def _never_ran(self, tracked: _Tracked, error: str) -> None:
        with self._cond:
            if tracked.state is JobStatus.EXITED:
                return
            if tracked.job is not None:
                tracked.job.error = error
        self._exited(tracked, NEVER_RAN_EXIT)

    def _exited(self, tracked: _Tracked, code: int) -> None:
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

    def _check_deadline(self, tracked: _Tracked) -> None:
        """A job whose container has not started by its deadline never runs."""
        if tracked.state is JobStatus.PENDING and time.monotonic() > tracked.deadline and not tracked.started:
            self._never_ran(tracked, self._timeout_message())
            self._remove_quietly(tracked.id)

    # --- the event stream -------------------------------------------------------------
    def _watch(self, spec: JobSpec) -> None:
        """Follow the events of this process's containers (one thread per owner)."""
        label = f"{LABEL_OWNER}={spec.owner}" if spec.owner else f"{LABEL_RUN}={spec.run}"
        if label in self._watchers:
            return
        with self._watch_lock:
            if label in self._watchers:
                return
            since = time.time() - 1.0
            stream = self._streams[label] = self._events(label, since)
            thread = threading.Thread(target=self._follow, args=(label, stream, since),
                                      name="fiberrl-docker-events", daemon=True)
            thread.start()
            self._watchers[label] = thread

    def _events(self, label: str, since: float):
        # since: events between subscribing and the first create are replayed
        self._client()  # learns the API version, or says clearly that there is no daemon
        return self._client(fresh=True).events(since=f"{since:.9f}", decode=True,
                                               filters={"type": "container", "label": label})

    def _follow(self, label: str, stream, since: float) -> None:
        while True:
            try:
                for event in stream:
                    since = max(since, event.get("timeNano", 0) / 1e9)
                    self._on_event(event)
            except Exception as exc:  # the daemon went away; reconnect below
                log.debug("docker event stream ended: %s", exc)
            warned = False
            while True:
                time.sleep(1.0)
                try:
                    stream = self._streams[label] = self._events(label, since)
                    break
                except Exception as exc:
                    if not warned:
                        log.warning("lost the Docker event stream (%s); retrying", exc)
                        warned = True
            self._catch_up(label, since)

    def _on_event(self, event: dict) -> None:
        action = event.get("Action") or event.get("status") or ""
        container_id = (event.get("Actor") or {}).get("ID") or event.get("id")
        with self._cond:
            tracked = self._tracked.get(container_id)
            if tracked is None:
                return
            if action == "start":
                if tracked.state is JobStatus.PENDING:
                    tracked.state = JobStatus.RUNNING
                    self._cond.notify_all()
                return
            if action == "oom":
                tracked.oom = True
                return
            if action not in ("die", "destroy"):
                return
            if action == "die":
                try:
                    code = exit_code(int(event["Actor"]["Attributes"]["exitCode"]))
                except (KeyError, TypeError, ValueError):
                    code = 255
            else:  # removed without dying: it never ran
                code = -tracked.cancel if tracked.cancel is not None else NEVER_RAN_EXIT
            if tracked.starting:
                tracked.died = code  # the starter decides, once docker start answers
                return
        if action == "destroy" and code == NEVER_RAN_EXIT:
            self._never_ran(tracked, "its container was removed before it started")
        else:
            self._exited(tracked, code)

    def _catch_up(self, label: str, since: float) -> None:
        """After the event stream was down: the events missed (the new stream
        replays them too, but later), then the daemon's word on each job."""
        try:
            missed = self._client().events(since=f"{since:.9f}", until=f"{time.time():.9f}", decode=True,
                                           filters={"type": "container", "label": label})
            for event in missed:
                self._on_event(event)
        except Exception as exc:  # the live stream still has them
            log.debug("could not replay docker events: %s", exc)
        import docker
        with self._cond:
            tracked = [t for t in self._tracked.values() if t.started]
        for t in tracked:
            try:
                state = self._client().inspect_container(t.id)["State"]
            except docker.errors.NotFound:
                log.warning("container %s vanished while the Docker event stream was down; exit code unknown", t.name)
                self._exited(t, 255)
                continue
            except docker.errors.APIError:
                continue
            if state.get("Status") in ("exited", "dead"):
                self._exited(t, exit_code(int(state.get("ExitCode", 255))))

    # --- status, wait, terminate --------------------------------------------------------
    def status(self, job: Job):
        tracked: _Tracked = job.handle
        if tracked.state is JobStatus.PENDING:
            self._check_deadline(tracked)
        return tracked.state, tracked.code

    def wait(self, job: Job, timeout: float | None = None):
        tracked: _Tracked = job.handle
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
        tracked: _Tracked = job.handle
        sig = signal.SIGKILL if force else signal.SIGTERM
        with self._cond:
            if tracked.state is JobStatus.EXITED:
                return
            if tracked.cancel != signal.SIGKILL:
                tracked.cancel = int(sig)
            started = tracked.started
        if started:
            self._kill(tracked.id, sig)

    def _kill(self, container_id: str, sig) -> None:
        import docker
        try:
            self._client().kill(container_id, signal=int(sig))
        except docker.errors.NotFound:
            pass  # gone already
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: not running (any more)
                raise

    def _remove_quietly(self, container_id: str) -> None:
        import docker
        try:
            self._client().remove_container(container_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                log.warning("could not remove container %s: %s", container_id[:12], exc)

    # --- cleanup ------------------------------------------------------------------------
    def cleanup(self, owner: str) -> None:
        from . import OWNER
        if not owner or (owner == OWNER and self._api is None):
            return  # this process never talked to the daemon: it started nothing
        self._remove_all({"label": f"{LABEL_OWNER}={owner}"})

    def needs_reaper(self) -> bool:
        # a container created but not yet started when its owner was killed stays
        # until removed.  The main process of a container (a job, a submitted
        # master: its parent is the container's init) takes a reaper down with it
        # when it dies, so it needs none; anywhere else one is worth its process
        return not (in_container() and os.getppid() == 1)

    def _remove_all(self, filters: dict) -> list[str]:
        """Force-remove every container matching ``filters`` (in parallel)."""
        try:
            containers = self._client().containers(all=True, filters=filters)
        except Exception as exc:  # at exit: say it, do not raise
            log.warning("could not list containers to remove (%s): %s", filters, exc)
            return []
        ids = [c["Id"] for c in containers]
        threads = []
        for container_id in ids[1:]:
            thread = threading.Thread(target=self._remove_quietly, args=(container_id,), daemon=True)
            try:
                thread.start()
            except RuntimeError:  # interpreter shutting down: one at a time
                self._remove_quietly(container_id)
                continue
            threads.append(thread)
        if ids:
            self._remove_quietly(ids[0])
        for thread in threads:
            thread.join(60)
        return ids

    # --- `fiberrl submit` -----------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        """The run's master as a detached container that stays (with its logs
        and exit code) until ``cancel``; it gets the Docker socket to start its
        jobs, which default to its image."""
        import docker
        if not spec.run:
            raise ValueError("a submitted job needs spec.run, the run id its jobs are labelled with")
        name = f"fiberrl-{spec.run}-{_slug(spec.name) or 'master'}"
        labels = {LABEL_RUN: spec.run, LABEL_SUBMITTED: "1", LABEL_PROCESS: spec.name}
        env = dict(spec.env)  # what the submitting command chose to pass
        extra = []
        host = docker_host()
        if host.startswith("unix://"):
            extra.append((host[len("unix://"):], DOCKER_SOCKET, False))
        else:
            env.setdefault("DOCKER_HOST", host)
        container_id = self._create(spec, name, env, labels, self._host_config(spec, auto_remove=False,
                                                                            extra_mounts=extra))
        try:
            self._client().start(container_id)
        except docker.errors.APIError as exc:
            self._remove_quietly(container_id)
            raise DockerError(f"Docker could not start the master container {name}: "
                              f"{exc.explanation or exc}{_start_hint(exc)}") from None
        return name

    def describe(self, job_id: str) -> dict:
        import docker
        try:
            info = self._client().inspect_container(job_id)
        except docker.errors.NotFound:
            return {"id": job_id, "state": "unknown", "exit_code": None, "where": None}
        state = info["State"]
        status = state.get("Status", "")
        kind = {"created": "pending", "running": "running", "paused": "running", "restarting": "running",
                "exited": "exited", "dead": "exited", "removing": "exited"}.get(status, "unknown")
        code = exit_code(int(state.get("ExitCode", 0))) if kind == "exited" else None
        return {"id": job_id, "state": kind, "exit_code": code,
                "where": f"container {info['Name'].lstrip('/')} ({info['Id'][:12]}) on {docker_host()}"}

    def logs(self, job_id: str, follow: bool = False):
        import docker
        try:
            stream = self._client().logs(job_id, stdout=True, stderr=True, stream=True, follow=follow)
        except docker.errors.NotFound:
            raise DockerError(f"no container {job_id} on the Docker daemon at {docker_host()} "
                              f"(cancelled, or removed by hand)") from None
        yield from decode_text(stream)

    def cancel(self, job_id: str) -> None:
        import docker
        run = None
        try:
            run = (self._client().inspect_container(job_id)["Config"].get("Labels") or {}).get(LABEL_RUN)
        except docker.errors.NotFound:
            match = re.match(r"fiberrl-([0-9a-f]{12})-", job_id)
            run = match.group(1) if match else None
        self._remove_quietly(job_id)  # first, so it starts no more jobs
        if run:
            # jobs being started while the sweep runs show up in the next one
            for _ in range(3):
                if not self._remove_all({"label": f"{LABEL_RUN}={run}"}):
                    break


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text or "").strip("-.")[:40]


def _create_hint(exc) -> str:
    text = str(exc.explanation or exc)
    if "mount" in text or "bind source" in text or "volume" in text:
        return (" (the working directory and each SRC path of the `volumes` setting must exist on the "
                "Docker host)")
    if "network" in text:
        return " (check the docker_network setting: `docker network ls`)"
    return ""


def _start_hint(exc) -> str:
    text = str(exc.explanation or exc)
    if "device driver" in text or "gpu" in text.lower() or "nvidia" in text.lower():
        return (" (meta(gpu=...) needs GPUs on the Docker host and the NVIDIA Container Toolkit configured for "
                "Docker: `nvidia-ctk runtime configure --runtime=docker` then restart dockerd)")
    return ""


def route_source(host: str) -> str | None:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    try:
        if not host or ipaddress.ip_address(host).is_loopback:
            return None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0]
    except (OSError, ValueError):
        return None


def interface_address(name: str) -> str | None:
    """The IPv4 address of network interface ``name`` (Linux), or None."""
    try:
        import fcntl
        import struct
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        return socket.inet_ntoa(packed[20:24])
    except (OSError, ImportError):
        return None


def can_bind(address: str) -> bool:
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False
