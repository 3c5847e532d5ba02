"""Kubernetes backend: each job is a pod.

One pod per job (``restartPolicy: Never``), in the configured namespace,
from the configured image (else the image of the pod this process runs in).
The run's secret lives in one Kubernetes Secret per run (``fiberrl-<run>``)
and reaches pods as ``FIBERRL_RUN_SECRET`` through a ``secretKeyRef``, never
as a plain value in a pod spec.  Every pod also gets its own name, namespace
and IP through the downward API, so a process in it can find its pod: the
pods it starts then carry an ``ownerReference`` to it, and deleting a pod
deletes every pod below it.  A process outside the cluster has no pod to own
its jobs; a reaper process deletes them by label if it is killed.

Job states come from one list+watch of this process's pods (label selector,
resource versions, a re-list after ``410 Gone``) into a cache, so
``status()`` costs no request however often a Pool polls it.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import queue
import random
import re
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

from .base import (NEVER_RAN_EXIT, Backend, Job, JobSpec, JobStatus, decode_text, parse_volumes, remote_env,
                   working_directory)

log = logging.getLogger("fiberrl")

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
POD_NAME_ENV = "FIBERRL_POD_NAME"
POD_NAMESPACE_ENV = "FIBERRL_POD_NAMESPACE"
POD_IP_ENV = "FIBERRL_POD_IP"
SECRET_ENV = "FIBERRL_RUN_SECRET"
SECRET_FILE_ENV = "FIBERRL_RUN_SECRET_FILE"
# set in every pod by the backend itself, never copied from the parent's environment
POD_SET_ENV = {SECRET_ENV, SECRET_FILE_ENV, POD_NAME_ENV, POD_NAMESPACE_ENV, POD_IP_ENV}
CONFIG_ENV = "FIBERRL_RESOLVED_CONFIG"

RUN_LABEL = "fiberrl.run"
OWNER_LABEL = "fiberrl.owner"
PROCESS_LABEL = "fiberrl/process"
SUBMITTED_LABEL = "fiberrl.submitted"
CONTAINER = "fiberrl"
SECRET_KEY = "secret"
TERMINATE_GRACE = 30
# a pod waiting for one of these will never start by itself
UNRECOVERABLE = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                 "CreateContainerError"}
CREATE_ATTEMPTS = 4
WATCH_SECONDS = 240       # the server ends a watch after this; it is re-opened from the last version
WATCH_READ_TIMEOUT = 90   # no byte for this long (not even a bookmark): re-open the watch


def secret_name(run: str) -> str:
    return f"fiberrl-{run}"


def label_value(text: str) -> str:
    """``text`` as a label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def escape_expansion(text: str) -> str:
    """Kubernetes expands ``$(VAR)`` in commands and env values; ``$$`` is a literal ``$``."""
    return text.replace("$", "$$")


def pod_config(serialized: str) -> str:
    """The parent's resolved settings as a pod should inherit them: a pod
    listens on its own IP, not on the address its parent chose for itself."""
    try:
        values = json.loads(serialized)
    except ValueError:
        return serialized
    if not values.get("host"):
        return serialized
    values["host"] = ""
    return json.dumps(values)


def cpu_quantity(cores: float) -> str:
    return str(int(cores)) if float(cores).is_integer() else f"{int(round(cores * 1000))}m"


def exit_code_of(terminated: dict) -> int:
    """A terminated container's exit code, negative for a signal as in multiprocessing."""
    if terminated.get("signal"):
        return -int(terminated["signal"])
    code = int(terminated.get("exitCode") or 0)
    if terminated.get("reason") == "OOMKilled":
        return -signal.SIGKILL
    # the runtime reports a main process killed by signal N as 128+N
    if code in (128 + signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGSEGV,
                128 + signal.SIGABRT, 128 + signal.SIGHUP):
        return 128 - code
    return code


def api_message(exc) -> str:
    """The message of the Status an API error carries."""
    try:
        return json.loads(exc.body)["message"]
    except Exception:
        return f"{exc.status} {exc.reason}"


def route_source(host: str, port: int) -> str:
    """The local address the route to ``host`` leaves from."""
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)
        address = infos[0][4][0]
    except (OSError, IndexError):
        address = None
    if address is None or address.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, port))  # no packet is sent
            return probe.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


@dataclass
class _PodState:
    """What the watch last saw of one pod."""

    phase: str = "Pending"
    ran: bool = False               # a container started
    exit_code: int | None = None    # its own exit, seen before any deletion began
    deleting: bool = False
    ended: bool = False             # terminated (or failed) while being deleted
    gone: bool = False
    waiting: str | None = None      # "Reason: message" of a waiting container
    unschedulable: str | None = None
    failed: str | None = None       # a Failed pod without a container exit (evicted...)


@dataclass
class _PodJob:
    """The backend's handle on one pod (``Job.handle``)."""

    name: str
    namespace: str
    connection: "_Connection"
    created: float
    schedule_timeout: float
    posted: float | None = None     # when the API server had accepted it
    watch: "_Watch | None" = None
    requested: int | None = None    # exit code asked for by terminate()
    final: int | None = None


class _Connection:
    """The API client, namespace and this process's own pod, for one kubeconfig."""

    def __init__(self, kubeconfig: str, namespace: str):
        try:
            from kubernetes import client, config as kconfig
        except ImportError as exc:
            raise RuntimeError("the kubernetes backend needs the kubernetes client: pip install kubernetes") from exc
        self.client_module = client
        configuration = client.Configuration()
        in_cluster_env = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        path = os.path.expanduser(kubeconfig) if kubeconfig else ""
        # a kubeconfig named on a workstation does not exist in the pods it starts: they use their own account
        self.in_cluster = in_cluster_env and (not path or not os.path.exists(path))
        context_namespace = None
        if self.in_cluster:
            try:
                kconfig.load_incluster_config(client_configuration=configuration)
            except kconfig.ConfigException as exc:
                raise RuntimeError(f"the kubernetes backend cannot use this pod's service account: {exc}") from None
        else:
            if not path:
                path = (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
            if not os.path.exists(path):
                raise RuntimeError(
                    f"the kubernetes backend found no cluster: no kubeconfig at {path} and not inside a pod; "
                    f"set kubernetes_config (FIBERRL_KUBERNETES_CONFIG) to a kubeconfig file")
            try:
                kconfig.load_kube_config(config_file=path, client_configuration=configuration)
                _, active = kconfig.list_kube_config_contexts(config_file=path)
                context_namespace = (active or {}).get("context", {}).get("namespace")
            except (kconfig.ConfigException, OSError, ValueError, KeyError) as exc:
                raise RuntimeError(f"the kubernetes backend cannot use the kubeconfig {path}: {exc}") from None
        self.host = configuration.host
        self.api = client.CoreV1Api(client.ApiClient(configuration))
        self.namespace = (namespace or os.environ.get(POD_NAMESPACE_ENV)
                          or (self._service_account_namespace() if self.in_cluster else None)
                          or context_namespace or self._service_account_namespace() or "default")
        self._pod: dict | None = None
        self._pod_read = False
        self._lock = threading.Lock()
        self.route_source: str | None = None  # the local address the route to the API server leaves from

    @staticmethod
    def _service_account_namespace() -> str | None:
        try:
            with open(os.path.join(SERVICE_ACCOUNT_DIR, "namespace")) as fh:
                return fh.read().strip() or None
        except OSError:
            return None

    @staticmethod
    def own_pod_name() -> str | None:
        """The pod this process runs in: named by the backend that started it,
        else (a pod someone else started) its hostname."""
        name = os.environ.get(POD_NAME_ENV)
        if not name and os.environ.get("KUBERNETES_SERVICE_HOST"):
            name = os.environ.get("HOSTNAME") or socket.gethostname()
        return name or None

    def own_pod(self) -> dict | None:
        """This process's pod as the API shows it, or None outside a pod."""
        with self._lock:
            if not self._pod_read:
                name = self.own_pod_name()
                if name:
                    namespace = (os.environ.get(POD_NAMESPACE_ENV) or self._service_account_namespace()
                                 or self.namespace)
                    try:
                        self._pod = self.read(self.api.read_namespaced_pod(name, namespace, _preload_content=False))
                    except self.client_module.ApiException as exc:
                        log.warning("kubernetes backend: cannot read this process's pod %s/%s (%s); its jobs will "
                                    "not be owned by it", namespace, name, api_message(exc))
                self._pod_read = True
            return self._pod

    @staticmethod
    def read(response) -> dict:
        try:
            return json.loads(response.data)
        finally:
            response.release_conn()


class _Watch:
    """One list+watch of the pods matching a label selector, into the backend's cache."""

    def __init__(self, backend: "KubernetesBackend", connection: _Connection, selector: str):
        self.backend = backend
        self.connection = connection
        self.selector = selector
        self.stopped = False
        self.error: str | None = None   # why the last list or watch failed, until one works
        self._response = None
        self.thread = threading.Thread(target=self._run, name="fiberrl-k8s-watch", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped = True
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # urllib3 >= 2.3: unblocks the read
            except Exception:
                pass

    def _relist(self) -> str:
        started = time.monotonic()
        api = self.connection.api
        listing = _Connection.read(api.list_namespaced_pod(self.connection.namespace, label_selector=self.selector,
                                                           _preload_content=False, _request_timeout=60))
        self.backend._replace(listing.get("items") or [], started)
        self.error = None
        return listing["metadata"]["resourceVersion"]

    def _run(self) -> None:
        ApiException = self.connection.client_module.ApiException
        version = None
        failures = 0
        while not self.stopped:
            try:
                if version is None:
                    version = self._relist()
                seconds = WATCH_SECONDS + random.randint(0, 60)
                response = self.connection.api.list_namespaced_pod(
                    self.connection.namespace, label_selector=self.selector, watch=True,
                    resource_version=version, allow_watch_bookmarks=True, timeout_seconds=seconds,
                    _preload_content=False, _request_timeout=(30, WATCH_READ_TIMEOUT))
                self._response = response
                try:
                    for line in _lines(response):
                        if self.stopped:
                            return
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            if obj.get("code") == 410:  # the server no longer has our version
                                version = None
                                break
                            raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                        version = obj.get("metadata", {}).get("resourceVersion") or version
                        if kind in ("ADDED", "MODIFIED", "DELETED"):
                            self.backend._apply(kind, obj)
                        failures = 0
                finally:
                    self._response = None
                    _close(response)
            except ApiException as exc:
                if exc.status == 410:
                    version = None
                    continue
                failures += 1
                if exc.status in (401, 403):  # retrying will not help until someone grants access
                    failures = max(failures, 3)
                    why = f"{exc.status} {api_message(exc)}; the service account needs list and watch on pods"
                else:
                    why = f"{exc.status} {api_message(exc)}"
                self._pause(failures, why)
            except Exception as exc:  # connection lost, read timeout, server restarted
                if self.stopped:
                    return
                failures += 1
                self._pause(failures, repr(exc))

    def _pause(self, failures: int, why: str) -> None:
        self.error = why
        if failures >= 3:
            log.warning("kubernetes backend: watching pods failed %d times (%s); retrying", failures, why)
        time.sleep(min(10.0, 0.2 * 2 ** failures))


def _create(connection: _Connection, call, *args) -> None:
    """A create request, retried over transient failures (a lost connection,
    429, 5xx); a retry answered 409 found the object an earlier try made."""
    import urllib3
    ApiException = connection.client_module.ApiException
    for attempt in range(CREATE_ATTEMPTS):
        last = attempt == CREATE_ATTEMPTS - 1
        try:
            _consume(call(*args, _preload_content=False))
            return
        except ApiException as exc:
            if exc.status == 409 and attempt > 0:
                return
            if exc.status not in (429, 500, 502, 503, 504) or last:
                raise
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            if last:
                raise RuntimeError(f"the kubernetes API server at {connection.host} is unreachable: {exc!r}") from None
        time.sleep(0.5 * 2 ** attempt)


def delete_matching(connection: _Connection, kind: str, selector: str) -> None:
    """Delete the pods (at once) or secrets matching a label selector: one
    deletecollection request, or, where the account may not use that verb,
    a list and one delete each."""
    api = connection.api
    namespace = connection.namespace
    pods = kind == "pod"
    grace = {"grace_period_seconds": 0} if pods else {}
    try:
        collection = api.delete_collection_namespaced_pod if pods else api.delete_collection_namespaced_secret
        _consume(collection(namespace, label_selector=selector, _preload_content=False, **grace))
        return
    except connection.client_module.ApiException as exc:
        if exc.status != 403:
            raise
    listing = api.list_namespaced_pod if pods else api.list_namespaced_secret
    delete = api.delete_namespaced_pod if pods else api.delete_namespaced_secret
    for item in _Connection.read(listing(namespace, label_selector=selector, _preload_content=False))["items"]:
        try:
            _consume(delete(item["metadata"]["name"], namespace, _preload_content=False, **grace))
        except connection.client_module.ApiException as exc:
            if exc.status != 404:
                raise


def _consume(response) -> None:
    """Read a response to its end, so its connection can carry the next request."""
    try:
        _ = response.data
    finally:
        response.release_conn()


def _close(response) -> None:
    """Done with a streamed response, read to its end or not."""
    try:
        response.close()
        response.release_conn()
    except Exception:
        pass


def _lines(response):
    """The newline-delimited lines of a streamed response."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line.decode("utf-8", "replace")
    if buffer:
        yield buffer.decode("utf-8", "replace")


class KubernetesBackend(Backend):
    name = "kubernetes"

    def __init__(self):
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._generation = 0
        self._connections: dict[tuple, _Connection] = {}
        self._used: list[_Connection] = []   # where this process created pods
        self._watches: dict[tuple, _Watch] = {}
        self._pods: dict[str, _PodState] = {}
        self._jobs: dict[str, _PodJob] = {}
        self._secrets: set[tuple[str, str]] = set()
        self._doomed: queue.SimpleQueue = queue.SimpleQueue()
        self._deleter: threading.Thread | None = None

    # --- connection ----------------------------------------------------------------
    def _connect(self) -> _Connection:
        """The connection the current settings name (each kept: jobs hold theirs)."""
        from ..config import get_config
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

    def _ensure_secret(self, connection: _Connection, run: str, secret: str, labels: dict,
                       owners: list | None) -> None:
        """The run's Secret, created once; an existing one belongs to whoever made it."""
        key = (connection.namespace, run)
        if key in self._secrets:
            return
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": secret_name(run), "labels": labels},
                "data": {SECRET_KEY: base64.b64encode(secret.encode()).decode()}}
        if owners:
            body["metadata"]["ownerReferences"] = owners
        try:
            _create(connection, connection.api.create_namespaced_secret, connection.namespace, body)
        except connection.client_module.ApiException as exc:
            if exc.status != 409:
                raise RuntimeError(f"the kubernetes backend cannot create the run's Secret {secret_name(run)} in "
                                   f"namespace {connection.namespace}: {api_message(exc)}") from None
        self._secrets.add(key)

    def _pod_body(self, spec: JobSpec, name: str, labels: dict, owners: list | None) -> dict:
        from ..config import get_config
        config = get_config()
        parent = self._parent()
        forwarded = {k: v for k, v in remote_env(spec.env, config.forward_env).items() if k not in POD_SET_ENV}
        if forwarded.get(CONFIG_ENV):
            forwarded[CONFIG_ENV] = pod_config(forwarded[CONFIG_ENV])
        env = [{"name": k, "value": escape_expansion(v)} for k, v in forwarded.items()]
        env += [
            {"name": SECRET_ENV, "valueFrom": {"secretKeyRef": {"name": secret_name(spec.run), "key": SECRET_KEY}}},
            {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": POD_NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ]
        resources: dict = {}
        if spec.cpu:
            resources.setdefault("requests", {})["cpu"] = cpu_quantity(spec.cpu)
            resources.setdefault("limits", {})["cpu"] = cpu_quantity(spec.cpu)
        if spec.mem:
            resources.setdefault("requests", {})["memory"] = f"{int(spec.mem)}Mi"
            resources.setdefault("limits", {})["memory"] = f"{int(spec.mem)}Mi"
        if spec.gpu:
            resources.setdefault("limits", {})["nvidia.com/gpu"] = str(int(spec.gpu))
        mounts = parse_volumes(config.volumes) + [(src, dst, False) for src, dst in spec.volumes.items()]
        volumes, volume_mounts = [], []
        for index, (source, target, read_only) in enumerate(mounts):
            volume = {"name": f"fiberrl-volume-{index}"}
            if source.startswith("/"):
                volume["hostPath"] = {"path": source}
            else:
                volume["persistentVolumeClaim"] = {"claimName": source, "readOnly": read_only}
            volumes.append(volume)
            volume_mounts.append({"name": volume["name"], "mountPath": target, "readOnly": read_only})
        container = {"name": CONTAINER, "image": self._image(spec, config),
                     "command": [escape_expansion(part) for part in spec.command],
                     "workingDir": working_directory(spec), "env": env}
        if resources:
            container["resources"] = resources
        if volume_mounts:
            container["volumeMounts"] = volume_mounts
        pod_spec: dict = {"restartPolicy": "Never", "enableServiceLinks": False,
                          "terminationGracePeriodSeconds": TERMINATE_GRACE, "containers": [container]}
        if volumes:
            pod_spec["volumes"] = volumes
        if parent:
            # the jobs of a pod act with its account and pull with its credentials
            for key in ("serviceAccountName", "imagePullSecrets"):
                if parent["spec"].get(key):
                    pod_spec[key] = parent["spec"][key]
        metadata = {"name": name, "labels": labels, "annotations": {"fiberrl/process-name": spec.name}}
        if owners:
            metadata["ownerReferences"] = owners
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}

    def _owner_references(self) -> list:
        parent = self._parent()
        if not parent:
            return []
        meta = parent["metadata"]
        return [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}]

    # --- jobs -----------------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> Job:
        from ..config import get_config
        config = get_config()
        connection = self._connect()
        owners = self._owner_references()
        secret = spec.env.get(SECRET_ENV)
        if not secret:
            from .. import auth
            secret = auth.run_secret().hex()
        self._ensure_secret(connection, spec.run, secret, {RUN_LABEL: spec.run, OWNER_LABEL: spec.owner}, owners)
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
        with self._cond:
            self._jobs[name] = handle
        try:
            _create(connection, connection.api.create_namespaced_pod, connection.namespace, body)
        except connection.client_module.ApiException as exc:
            message = api_message(exc)
            if exc.status == 403 and "exceeded quota" in message:
                job.error = f"pod {name} was refused by a resource quota: {message}"
                handle.final = NEVER_RAN_EXIT
                with self._cond:
                    self._jobs.pop(name, None)
                return job
            with self._cond:
                self._jobs.pop(name, None)
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
                self._watches[key] = _Watch(self, connection, selector)
            return self._watches[key]

    # --- the cache (fed by the watch) ------------------------------------------------
    def _apply(self, kind: str, pod: dict) -> None:
        name = pod["metadata"]["name"]
        with self._cond:
            state = self._pods.get(name)
            if state is None:
                if name not in self._jobs:
                    return  # not (or no longer) a job of this process
                state = self._pods[name] = _PodState()
            self._update(state, pod)
            if kind == "DELETED":
                state.gone = True
            self._generation += 1
            self._cond.notify_all()

    @staticmethod
    def _update(state: _PodState, pod: dict) -> None:
        status = pod.get("status") or {}
        state.phase = status.get("phase") or state.phase
        if pod["metadata"].get("deletionTimestamp"):
            state.deleting = True
        containers = status.get("containerStatuses") or []
        mine = [c for c in containers if c.get("name") == CONTAINER] or containers
        container = (mine or [{}])[0].get("state") or {}
        if "running" in container:
            state.ran = True
        state.waiting = None
        if "waiting" in container:
            waiting = container["waiting"] or {}
            state.waiting = f"{waiting.get('reason', 'waiting')}: {waiting.get('message', '')}".rstrip(": ")
        if "terminated" in container:
            state.ran = True
            if state.deleting:
                state.ended = True
            elif state.exit_code is None:
                state.exit_code = exit_code_of(container["terminated"])
        elif state.phase == "Failed":
            state.failed = f"{status.get('reason', 'Failed')}: {status.get('message', '')}".rstrip(": ")
            if state.deleting:
                state.ended = True
        state.unschedulable = None
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                state.unschedulable = condition.get("message") or condition.get("reason")

    def _replace(self, items: list[dict], started: float) -> None:
        """A fresh listing: pods we knew and that are missing from it are gone."""
        with self._cond:
            listed = set()
            for pod in items:
                name = pod["metadata"]["name"]
                listed.add(name)
                if name in self._jobs:
                    self._update(self._pods.setdefault(name, _PodState()), pod)
            for name, handle in self._jobs.items():
                if name not in listed and (name in self._pods or (handle.posted or started) < started):
                    self._pods.setdefault(name, _PodState()).gone = True
            self._generation += 1
            self._cond.notify_all()

    def _judge(self, handle: _PodJob, state: _PodState | None) -> tuple[int | None, str | None]:
        """The exit code of a job that has ended (and why it never ran), else (None, None)."""
        if state is not None:
            if state.exit_code is not None:
                return state.exit_code, None
            if state.gone or state.ended:
                if handle.requested is not None:
                    return handle.requested, None
                if not state.ran:
                    return NEVER_RAN_EXIT, f"pod {handle.name} was deleted before it started"
                return -signal.SIGKILL, None  # lost: deleted (or evicted) while it ran
            if state.failed and not state.deleting:
                if state.ran:
                    return -signal.SIGKILL, None
                return NEVER_RAN_EXIT, f"pod {handle.name} failed before it started: {state.failed}"
            if not state.ran and state.waiting and state.waiting.split(":")[0] in UNRECOVERABLE:
                return NEVER_RAN_EXIT, f"pod {handle.name} cannot start: {state.waiting}"
            if state.ran or state.deleting:
                return None, None
        waited = time.monotonic() - handle.created
        if waited > handle.schedule_timeout:
            why = (state.unschedulable or state.waiting) if state else None
            if why is None and handle.watch is not None and handle.watch.error:
                why = f"still pending as far as known: watching its pods fails ({handle.watch.error})"
            return NEVER_RAN_EXIT, (f"pod {handle.name} did not start within schedule_timeout "
                                    f"({handle.schedule_timeout:g} s): {why or 'still pending'}")
        return None, None

    def status(self, job: Job):
        handle: _PodJob = job.handle
        if handle.final is not None:
            return JobStatus.EXITED, handle.final
        with self._cond:
            state = self._pods.get(handle.name)
            code, error = self._judge(handle, state)
            if code is None:
                running = state is not None and state.ran
                return (JobStatus.RUNNING if running else JobStatus.PENDING), None
            if handle.final is not None:  # another thread got here first
                return JobStatus.EXITED, handle.final
            handle.final = code
            job.error = error
            self._jobs.pop(handle.name, None)
            state = self._pods.pop(handle.name, None)
        if state is None or not state.gone:
            # an ended pod is of no further use (its output went to the parent); a pending one must go
            self._delete_later(handle.connection, handle.namespace, handle.name)
        return JobStatus.EXITED, code

    def wait(self, job: Job, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                generation = self._generation
            state, code = self.status(job)
            if state is JobStatus.EXITED:
                return code
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            with self._cond:
                if self._generation == generation:
                    # woken by the watch; the timeout re-checks schedule_timeout
                    self._cond.wait(0.5 if remaining is None else min(remaining, 0.5))

    def terminate(self, job: Job, force: bool = False) -> None:
        handle: _PodJob = job.handle
        if handle.final is not None:
            return
        if force or handle.requested is None:
            handle.requested = -(signal.SIGKILL if force else signal.SIGTERM)
        self._delete(handle.connection, handle.namespace, handle.name, 0 if force else TERMINATE_GRACE)

    def _delete_later(self, connection: _Connection, namespace: str, name: str) -> None:
        """Delete a pod from a thread of its own: status() makes no request."""
        with self._lock:
            self._doomed.put((connection, namespace, name))
            if self._deleter is None:
                self._deleter = threading.Thread(target=self._delete_doomed, name="fiberrl-k8s-delete", daemon=True)
                self._deleter.start()

    def _delete_doomed(self) -> None:
        while True:
            connection, namespace, name = self._doomed.get()
            self._delete(connection, namespace, name, 0)

    @staticmethod
    def _delete(connection: _Connection, namespace: str, name: str, grace: int | None) -> None:
        try:
            _consume(connection.api.delete_namespaced_pod(name, namespace, grace_period_seconds=grace,
                                                 _preload_content=False))
        except connection.client_module.ApiException as exc:
            if exc.status != 404:
                log.warning("kubernetes backend: cannot delete pod %s: %s", name, api_message(exc))
        except Exception as exc:
            log.warning("kubernetes backend: cannot delete pod %s: %r", name, exc)

    def cleanup(self, owner: str) -> None:
        from . import OWNER
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
            self._secrets = {key for key in self._secrets if key[0] != connection.namespace}
            try:
                delete_matching(connection, "pod", selector)
                delete_matching(connection, "secret", selector)
            except Exception as exc:
                log.warning("kubernetes backend: cannot remove the pods of owner %s in namespace %s: %s", owner,
                            connection.namespace, api_message(exc) if hasattr(exc, "status") else repr(exc))

    # --- `fiberrl submit` ------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        connection = self._connect()
        secret = spec.env.get(SECRET_ENV)
        if not secret:
            from .. import auth
            secret = auth.run_secret().hex()
        labels = {RUN_LABEL: spec.run, SUBMITTED_LABEL: "1"}
        self._ensure_secret(connection, spec.run, secret, dict(labels), None)
        process = label_value(spec.name)
        if process:
            labels[PROCESS_LABEL] = process
        name = f"fiberrl-{spec.run}-master-{uuid.uuid4().hex[:6]}"
        body = self._pod_body(spec, name, labels, None)
        try:
            _create(connection, connection.api.create_namespaced_pod, connection.namespace, body)
        except connection.client_module.ApiException as exc:
            raise RuntimeError(f"the kubernetes backend cannot create pod {name} in namespace "
                               f"{connection.namespace}: {api_message(exc)}") from None
        return name

    def _read_pod(self, name: str) -> dict | None:
        connection = self._connect()
        try:
            return _Connection.read(connection.api.read_namespaced_pod(name, connection.namespace,
                                                                       _preload_content=False))
        except connection.client_module.ApiException as exc:
            if exc.status == 404:
                return None
            raise RuntimeError(f"cannot read pod {name}: {api_message(exc)}") from None

    def describe(self, job_id: str) -> dict:
        pod = self._read_pod(job_id)
        namespace = self._connect().namespace
        if pod is None:
            return {"id": job_id, "state": "unknown", "exit_code": None, "where": None}
        status = pod.get("status") or {}
        containers = status.get("containerStatuses") or []
        mine = [c for c in containers if c.get("name") == CONTAINER] or containers
        terminated = ((mine or [{}])[0].get("state") or {}).get("terminated")
        phase = status.get("phase")
        state = {"Pending": "pending", "Running": "running", "Succeeded": "exited", "Failed": "exited"}.get(
            phase, "unknown")
        exit_code = exit_code_of(terminated) if terminated else None
        node = (pod.get("spec") or {}).get("nodeName")
        where = f"pod {namespace}/{job_id}" + (f" on node {node}" if node else "")
        return {"id": job_id, "state": state, "exit_code": exit_code, "where": where}

    def logs(self, job_id: str, follow: bool = False):
        connection = self._connect()
        ApiException = connection.client_module.ApiException

        def missing():
            return LookupError(f"no pod {job_id} in namespace {connection.namespace}")

        def chunks():
            while True:
                try:
                    response = connection.api.read_namespaced_pod_log(
                        job_id, connection.namespace, follow=follow, _preload_content=False)
                    break
                except ApiException as exc:
                    if exc.status == 404:
                        raise missing() from None
                    if exc.status != 400:
                        raise RuntimeError(f"cannot read the log of pod {job_id}: {api_message(exc)}") from None
                    # 400: the container has not started yet
                    if not follow:
                        return
                    pod = self._read_pod(job_id)
                    if pod is None:
                        raise missing() from None
                    state = _PodState()
                    self._update(state, pod)
                    if state.waiting and state.waiting.split(":")[0] in UNRECOVERABLE:
                        raise RuntimeError(f"pod {job_id} cannot start: {state.waiting}") from None
                    time.sleep(1.0)
            try:
                chunks = response.stream(amt=None, decode_content=True) if follow else [response.data]
                yield from decode_text(chunks)
            finally:
                _close(response)

        return chunks()

    def cancel(self, job_id: str) -> None:
        connection = self._connect()
        ApiException = connection.client_module.ApiException
        pod = self._read_pod(job_id)
        if pod is not None:
            run = (pod["metadata"].get("labels") or {}).get(RUN_LABEL)
        else:
            found = re.fullmatch(r"fiberrl-([0-9a-f]+)-master-[0-9a-f]+", job_id)
            run = found.group(1) if found else None
        # the master first, so it starts no more pods, then the rest of its run
        self._delete(connection, connection.namespace, job_id, 0)
        if not run:
            return
        try:
            delete_matching(connection, "pod", f"{RUN_LABEL}={run}")
        except ApiException as exc:
            raise RuntimeError(f"cannot remove the pods of run {run}: {api_message(exc)}") from None
        try:
            _consume(connection.api.delete_namespaced_secret(secret_name(run), connection.namespace,
                                                    _preload_content=False))
        except ApiException as exc:
            if exc.status != 404:
                raise RuntimeError(f"cannot remove the Secret of run {run}: {api_message(exc)}") from None
