"""A stand-in Kubernetes API server, for testing the kubernetes backend where
no cluster can run.

It speaks the part of the core/v1 REST API the official ``kubernetes``
client uses for pods, pod logs and secrets -- create, get, list with label
selectors, watch (newline-delimited WatchEvents with resource versions,
bookmarks, and ``410 Gone`` for a version it no longer holds), delete one,
delete a collection -- and it really runs each pod's command as a process on
this machine, as a one-node kubelet would:

* env from the container's ``env`` only (``value``, ``secretKeyRef``,
  ``fieldRef`` of the pod's name, namespace, uid, ``status.podIP`` =
  127.0.0.1), plus ``PATH`` from this server's environment; ``$(VAR)``
  references are expanded and ``$$`` unescaped as Kubernetes does;
* cwd = ``workingDir``; stdout and stderr into the pod's log;
* phases Pending -> Running -> Succeeded/Failed, the container's
  ``terminated.exitCode`` (128+signal when a signal killed it);
* deleting a pod SIGTERMs its process, SIGKILLs the process group after the
  grace period (at once for grace 0), then removes it; deleting an owner
  deletes its dependents (``ownerReferences``), cascading;
* an image named ``missing/...`` never pulls (waiting ErrImagePull, then
  ImagePullBackOff); a pod asking for more than the node has
  (``capacity``) stays Pending, PodScheduled=False Unschedulable;
  ``set_quota(pods=N)`` makes creating a pod past N answer 403 exceeded quota;
  ``inject()`` makes chosen requests fail, or succeed with the answer lost;
  ``force_gone()`` makes watches end with 410 Gone so clients must re-list.

Every request is recorded (method, path, query, parsed body) so tests can
check the exact specs the backend sent.  Mounts are recorded, not made.
"""
from __future__ import annotations

import base64
import bisect
import copy
import ctypes
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

NODE = "standin-node"
POD_IP = "127.0.0.1"
UNSCHEDULABLE_IMAGE_PREFIX = "missing/"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_object(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


class _NotReady(Exception):
    """A container cannot be created yet (a referenced Secret is missing)."""


def parse_selector(text: str | None):
    """A label selector (``a=b,c!=d,e,!f``) as a predicate on a labels dict."""
    terms = []
    for raw in (text or "").split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append(lambda labels, k=key.strip(), v=value.strip(): labels.get(k) != v)  # noqa: B008 - binds this term
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            terms.append(lambda labels, k=key.strip(), v=value.strip(): labels.get(k) == v)  # noqa: B008
        elif term.startswith("!"):
            terms.append(lambda labels, k=term[1:].strip(): k not in labels)  # noqa: B008
        else:
            terms.append(lambda labels, k=term: k in labels)
    return lambda labels: all(t(labels or {}) for t in terms)


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, ``$$`` is
    a literal ``$``, anything else is left as it is."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i):
            end = text.find(")", i)
            name = text[i + 2:end] if end != -1 else None
            if name is not None and name in env:
                out.append(env[name])
                i = end + 1
            else:
                out.append("$(")
                i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def quantity(value) -> float:
    """A Kubernetes quantity as a number (cpu cores, bytes, devices)."""
    text = str(value)
    suffixes = {"m": 1e-3, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix, factor in sorted(suffixes.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * factor
    return float(text)


try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover
    _libc = None


def _die_with_server() -> None:
    # PR_SET_PDEATHSIG: a pod's process dies with the server that runs it
    if _libc is not None:
        _libc.prctl(1, signal.SIGKILL)


class StandIn:
    """The server.  ``start()`` it, point a client at ``kubeconfig``."""

    def __init__(self, capacity: dict | None = None, namespace: str = "fiberrl-test", echo_logs: bool = False):
        self.token = uuid.uuid4().hex
        self.namespace = namespace
        self.capacity = {"cpu": 64.0, "memory": 256 * 2 ** 30, "nvidia.com/gpu": 8.0, **(capacity or {})}
        self.echo_logs = echo_logs
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = 1
        self.min_rv = 1            # watches from an older version get 410 Gone
        self.epoch = 0             # bumped by force_gone(): open watches end with 410
        self.history: list[tuple[int, str, str, dict]] = []   # (rv, namespace, event type, pod)
        self._history_rvs: list[int] = []
        self.pods: dict[tuple[str, str], dict] = {}
        self.secrets: dict[tuple[str, str], dict] = {}
        self.procs: dict[str, subprocess.Popen] = {}          # pod uid -> its process
        self.requests: list[dict] = []
        self.stats: Counter = Counter()
        self.quota: dict | None = None
        self.faults: list[dict] = []
        self.closed = False
        self.dir = tempfile.mkdtemp(prefix="k8s-standin-")
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------
    def start(self) -> "StandIn":
        standin = self

        class Handler(_Handler):
            server_standin = standin

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="k8s-standin", daemon=True)
        self._thread.start()
        with open(self.kubeconfig, "w") as fh:
            fh.write(f"""apiVersion: v1
kind: Config
clusters:
- name: standin
  cluster:
    server: {self.url}
contexts:
- name: standin
  context:
    cluster: standin
    user: standin
    namespace: {self.namespace}
current-context: standin
users:
- name: standin
  user:
    token: {self.token}
""")
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        with self.lock:
            self.closed = True
            procs = list(self.procs.values())
            self.changed.notify_all()
        for proc in procs:
            _kill_group(proc)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- test controls ---------------------------------------------------------
    def force_gone(self) -> None:
        """Forget the watch history, as an API server's watch cache does when it
        moves on: open watches end with an ERROR 410 Gone event and a watch from
        any version seen so far is refused with 410, so clients must re-list."""
        with self.lock:
            self.rv += 1
            self.min_rv = self.rv
            self.epoch += 1
            self.changed.notify_all()

    def set_quota(self, pods: int | None = None) -> None:
        """At most ``pods`` unfinished pods per namespace (None: no quota)."""
        with self.lock:
            self.quota = None if pods is None else {"pods": pods}

    def inject(self, method: str, path: str, code: int | None = None, times: int = 1) -> None:
        """The next ``times`` requests of ``method`` on a path matching the regex
        ``path`` fail: with ``code`` (a Status) before anything is done, or, with
        no code, done and then the connection dropped without an answer."""
        with self.lock:
            self.faults.append({"method": method, "path": path, "code": code, "times": times})

    def _fault(self, method: str, path: str) -> dict | None:
        with self.lock:
            for fault in self.faults:
                if fault["method"] == method and re.fullmatch(fault["path"], path):
                    fault["times"] -= 1
                    if fault["times"] <= 0:
                        self.faults.remove(fault)
                    return fault
        return None

    def received(self, method: str | None = None, path: str | None = None, since: int = 0) -> list[dict]:
        """Recorded requests, optionally of one method and a path matching a
        regex, from number ``since`` on (``len(received())`` marks a moment)."""
        with self.lock:
            found = self.requests[since:]
        return [r for r in found if (method is None or r["method"] == method)
                and (path is None or re.fullmatch(path, r["path"]))]

    def created_pods(self) -> list[dict]:
        """The bodies of every pod creation received, in order."""
        return [r["body"] for r in self.received("POST", r"/api/v1/namespaces/[^/]+/pods")]

    def pod_names(self, selector: str | None = None) -> list[str]:
        match = parse_selector(selector)
        with self.lock:
            return [name for (_, name), pod in self.pods.items() if match(pod["metadata"].get("labels"))]

    def secret_names(self, selector: str | None = None) -> list[str]:
        match = parse_selector(selector)
        with self.lock:
            return [name for (_, name), s in self.secrets.items() if match(s["metadata"].get("labels"))]

    def pod(self, name: str, namespace: str | None = None) -> dict | None:
        with self.lock:
            pod = self.pods.get((namespace or self.namespace, name))
            return copy.deepcopy(pod) if pod else None

    def process_of(self, name: str, namespace: str | None = None) -> subprocess.Popen | None:
        with self.lock:
            pod = self.pods.get((namespace or self.namespace, name))
            return self.procs.get(pod["metadata"]["uid"]) if pod else None

    # --- events ----------------------------------------------------------------
    def _emit(self, kind: str, pod: dict) -> None:
        """Record a change of ``pod`` (lock held) at a new resource version."""
        self.rv += 1
        pod["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, pod["metadata"]["namespace"], kind, copy.deepcopy(pod)))
        self._history_rvs.append(self.rv)
        self.changed.notify_all()

    # --- pods --------------------------------------------------------------------
    def create_pod(self, namespace: str, body: dict) -> dict:
        pod = copy.deepcopy(body)
        meta = pod.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", "Pod is invalid: metadata.name: Required value")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta["name"]
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name) or len(name) > 253:
            raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: metadata.name: Invalid value: "{name}"')
        containers = pod.get("spec", {}).get("containers") or []
        if not containers or not all(c.get("image") and c.get("name") for c in containers):
            raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: spec.containers: each needs a name and image')
        with self.lock:
            if (namespace, name) in self.pods:
                raise ApiError(409, "AlreadyExists", f'pods "{name}" already exists')
            if self.quota is not None:
                used = sum(1 for (ns, _), p in self.pods.items()
                           if ns == namespace and p["status"]["phase"] in ("Pending", "Running"))
                if used + 1 > self.quota["pods"]:
                    raise ApiError(403, "Forbidden",
                                   f'pods "{name}" is forbidden: exceeded quota: standin-quota, requested: pods=1, '
                                   f'used: pods={used}, limited: pods={self.quota["pods"]}')
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now())
            meta.pop("deletionTimestamp", None)
            pod["status"] = {"phase": "Pending", "conditions": [], "qosClass": "BestEffort"}
            self.pods[(namespace, name)] = pod
            self._emit("ADDED", pod)
            out = copy.deepcopy(pod)
        threading.Thread(target=self._kubelet, args=(namespace, name, meta["uid"]),
                         name=f"standin-kubelet-{name}", daemon=True).start()
        return out

    def _current(self, namespace: str, name: str, uid: str) -> dict | None:
        pod = self.pods.get((namespace, name))
        return pod if pod is not None and pod["metadata"]["uid"] == uid else None

    def _unschedulable(self, pod: dict) -> str | None:
        short = []
        for c in pod["spec"]["containers"]:
            resources = c.get("resources") or {}
            wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            for key, value in wanted.items():
                if key in self.capacity and quantity(value) > self.capacity[key]:
                    short.append(key)
        if short:
            return "0/1 nodes are available: " + ", ".join(f"1 Insufficient {k}" for k in sorted(set(short))) + \
                ". preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
        return None

    def _container_env(self, pod: dict, container: dict) -> dict[str, str]:
        env: dict[str, str] = {}
        namespace = pod["metadata"]["namespace"]
        fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": namespace,
                  "metadata.uid": pod["metadata"]["uid"], "status.podIP": POD_IP, "status.hostIP": POD_IP,
                  "spec.nodeName": NODE, "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default")}
        for item in container.get("env") or []:
            name = item["name"]
            source = item.get("valueFrom")
            if source is None:
                env[name] = expand(item.get("value", ""), env)
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                secret = self.secrets.get((namespace, ref["name"]))
                if secret is None:
                    raise _NotReady(f'secret "{ref["name"]}" not found')
                data = secret.get("data") or {}
                if ref["key"] not in data:
                    raise _NotReady(f'couldn\'t find key {ref["key"]} in Secret {namespace}/{ref["name"]}')
                env[name] = base64.b64decode(data[ref["key"]]).decode()
            elif "fieldRef" in source:
                env[name] = fields.get(source["fieldRef"]["fieldPath"], "")
            else:
                env[name] = ""
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}

    def _set_container(self, pod: dict, state: dict, ready: bool = False) -> None:
        container = pod["spec"]["containers"][0]
        pod["status"]["containerStatuses"] = [{
            "name": container["name"], "image": container["image"], "imageID": "", "ready": ready,
            "restartCount": 0, "started": "running" in state, "state": state, "lastState": {}}]

    def _kubelet(self, namespace: str, name: str, uid: str) -> None:
        time.sleep(0.005)
        with self.lock:
            pod = self._current(namespace, name, uid)
            if pod is None:
                return
            why = self._unschedulable(pod)
            if why:
                pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                "message": why, "lastTransitionTime": _now()}]
                self._emit("MODIFIED", pod)
                return
            pod["spec"]["nodeName"] = NODE
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}]
            self._set_container(pod, {"waiting": {"reason": "ContainerCreating"}})
            self._emit("MODIFIED", pod)
            container = pod["spec"]["containers"][0]
        if container["image"].startswith(UNSCHEDULABLE_IMAGE_PREFIX):
            for reason in ("ErrImagePull", "ImagePullBackOff"):
                time.sleep(0.2)
                with self.lock:
                    pod = self._current(namespace, name, uid)
                    if pod is None:
                        return
                    self._set_container(pod, {"waiting": {"reason": reason, "message": (
                        f'failed to pull and unpack image "{container["image"]}": not found' if reason == "ErrImagePull"
                        else f'Back-off pulling image "{container["image"]}"')}})
                    self._emit("MODIFIED", pod)
            return
        while True:
            with self.lock:
                pod = self._current(namespace, name, uid)
                if pod is None or self.closed:
                    return
                try:
                    env = self._container_env(pod, container)
                    break
                except _NotReady as exc:
                    waiting = pod["status"].get("containerStatuses", [{}])[0].get("state", {}).get("waiting", {})
                    if waiting.get("reason") != "CreateContainerConfigError":
                        self._set_container(pod, {"waiting": {"reason": "CreateContainerConfigError",
                                                              "message": str(exc)}})
                        self._emit("MODIFIED", pod)
            time.sleep(0.1)
        command = [expand(part, env) for part in (container.get("command") or []) + (container.get("args") or [])]
        cwd = container.get("workingDir") or "/"
        log_path = os.path.join(self.dir, f"{uid}.log")
        proc = None
        failure = None
        if not command:
            failure = "no command specified"
        elif not os.path.isdir(cwd):
            failure = f"chdir to cwd (\"{cwd}\") set in config.json failed: no such file or directory"
        else:
            try:
                with open(log_path, "wb") as log:
                    proc = subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                            preexec_fn=_die_with_server)
            except OSError as exc:
                failure = f"exec: {exc}"
        started = _now()
        with self.lock:
            pod = self._current(namespace, name, uid)
            if pod is None or self.closed:
                if proc is not None:
                    _kill_group(proc)
                    proc.wait()
                return
            if proc is None:
                pod["status"]["phase"] = "Failed"
                self._set_container(pod, {"terminated": {"exitCode": 128, "reason": "StartError", "message": failure,
                                                         "startedAt": started, "finishedAt": started}})
                self._emit("MODIFIED", pod)
                return
            self.procs[uid] = proc
            pod["status"].update(phase="Running", podIP=POD_IP, podIPs=[{"ip": POD_IP}], hostIP=POD_IP,
                                 startTime=started)
            pod["status"]["conditions"].append({"type": "Ready", "status": "True", "lastTransitionTime": started})
            self._set_container(pod, {"running": {"startedAt": started}}, ready=True)
            self._emit("MODIFIED", pod)
        if self.echo_logs:
            threading.Thread(target=self._echo, args=(name, log_path, proc), daemon=True).start()
        code = proc.wait()
        _kill_group(proc)  # the container ends with its main process
        exit_code = code if code >= 0 else 128 - code
        with self.lock:
            self.procs.pop(uid, None)
            pod = self._current(namespace, name, uid)
            if pod is None:
                self.changed.notify_all()
                return
            pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            for condition in pod["status"]["conditions"]:
                if condition["type"] == "Ready":
                    condition["status"] = "False"
            self._set_container(pod, {"terminated": {
                "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": started, "finishedAt": _now(), "containerID": f"standin://{uid}"}})
            self._emit("MODIFIED", pod)
            if pod["metadata"].get("deletionTimestamp"):
                self._remove(pod)

    def _echo(self, name: str, path: str, proc: subprocess.Popen) -> None:
        import sys
        with open(path, "rb") as fh:
            while True:
                line = fh.readline()
                if line:
                    sys.stderr.write(f"[{name}] {line.decode(errors='replace')}")
                elif proc.poll() is not None:
                    return
                else:
                    time.sleep(0.05)

    def _remove(self, pod: dict) -> None:
        """Drop ``pod`` (lock held), kill what is left of it, collect its dependents."""
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        del self.pods[key]
        uid = pod["metadata"]["uid"]
        proc = self.procs.get(uid)
        if proc is not None:
            _kill_group(proc)
        self._emit("DELETED", pod)
        threading.Thread(target=self._collect_dependents, args=(key[0], uid), daemon=True).start()

    def _collect_dependents(self, namespace: str, uid: str) -> None:
        """The garbage collector: delete what ``uid`` owned (background propagation)."""
        def owned(obj):
            return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])

        with self.lock:
            pods = [name for (ns, name), p in self.pods.items() if ns == namespace and owned(p)]
            for key in [k for k, s in self.secrets.items() if k[0] == namespace and owned(s)]:
                del self.secrets[key]
        for name in pods:
            try:
                self.delete_pod(namespace, name, None)
            except ApiError:
                pass

    def delete_pod(self, namespace: str, name: str, grace: int | None) -> dict:
        with self.lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            uid = pod["metadata"]["uid"]
            proc = self.procs.get(uid)
            running = proc is not None and proc.poll() is None
            if grace <= 0 or not running:
                self._remove(pod)
                return copy.deepcopy(pod)
            if pod["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(pod)
            pod["metadata"]["deletionTimestamp"] = _now()
            pod["metadata"]["deletionGracePeriodSeconds"] = grace
            self._emit("MODIFIED", pod)
            out = copy.deepcopy(pod)
        threading.Thread(target=self._stop_container, args=(proc, grace), daemon=True).start()
        return out

    @staticmethod
    def _stop_container(proc: subprocess.Popen, grace: float) -> None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(grace)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            _kill_group(proc)

    def list_pods(self, namespace: str, selector: str | None) -> dict:
        match = parse_selector(selector)
        with self.lock:
            items = [copy.deepcopy(p) for (ns, _), p in sorted(self.pods.items())
                     if ns == namespace and match(p["metadata"].get("labels"))]
            rv = self.rv
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}, "items": items}

    # --- secrets -------------------------------------------------------------------
    def create_secret(self, namespace: str, body: dict) -> dict:
        secret = copy.deepcopy(body)
        meta = secret.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", "Secret is invalid: metadata.name: Required value")
        for key, value in (secret.get("stringData") or {}).items():
            secret.setdefault("data", {})[key] = base64.b64encode(value.encode()).decode()
        secret.pop("stringData", None)
        with self.lock:
            if (namespace, name) in self.secrets:
                raise ApiError(409, "AlreadyExists", f'secrets "{name}" already exists')
            self.rv += 1
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now(),
                        resourceVersion=str(self.rv))
            secret.setdefault("type", "Opaque")
            self.secrets[(namespace, name)] = secret
            return copy.deepcopy(secret)

    # --- leftovers -------------------------------------------------------------------
    def leftovers(self, keep_runs: tuple[str, ...] = ()) -> list[str]:
        """Pods and Secrets fiberrl made that are still here (secrets of
        ``keep_runs`` excepted)."""
        with self.lock:
            pods = [f"pod/{name}" for (_, name), p in self.pods.items()
                    if "fiberrl.run" in (p["metadata"].get("labels") or {})]
            secrets = [f"secret/{name}" for (_, name), s in self.secrets.items()
                       if "fiberrl.run" in (s["metadata"].get("labels") or {})
                       and s["metadata"]["labels"]["fiberrl.run"] not in keep_runs]
        return sorted(pods) + sorted(secrets)


def _truthy(value: str | None) -> bool:
    """A boolean query parameter as the API server parses it (Go's strconv.ParseBool)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>pods|secrets)(?:/(?P<name>[^/]+)(?:/(?P<sub>log))?)?$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_standin: StandIn

    def log_message(self, format, *args):  # quiet
        pass

    def handle(self):
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):
            pass  # a client closed its connection

    # --- plumbing -----------------------------------------------------------------
    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def _send(self, code: int, obj, content_type: str = "application/json") -> None:
        if getattr(self, "_drop", False):  # an injected fault: done, but no answer
            self.close_connection = True
            return
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def _dispatch(self, method: str) -> None:
        s = self.server_standin
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = self._body()
        with s.lock:
            s.requests.append({"method": method, "path": url.path, "query": query, "body": body, "time": time.time()})
        if self.headers.get("Authorization") != f"Bearer {s.token}":
            self._send(401, status_object(401, "Unauthorized", "Unauthorized"))
            return
        self._drop = False
        fault = s._fault(method, url.path)
        if fault is not None and fault["code"] is not None:
            self._send(fault["code"], status_object(fault["code"], "ServiceUnavailable", "injected fault"))
            return
        self._drop = fault is not None
        try:
            self._route(method, url.path, query, body)
        except ApiError as exc:
            self._send(exc.code, status_object(exc.code, exc.reason, exc.message))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(self, method, path, query, body) -> None:
        s = self.server_standin
        if method == "GET" and path == "/version":
            self._send(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fiberrl-standin",
                             "platform": "linux/amd64"})
            return
        if method == "GET" and path == "/api":
            self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
            return
        if method == "GET" and path == "/api/v1/namespaces":
            with s.lock:
                names = sorted({"default", s.namespace} | {ns for ns, _ in s.pods} | {ns for ns, _ in s.secrets})
            self._send(200, {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {"resourceVersion": str(s.rv)},
                             "items": [{"metadata": {"name": n}, "status": {"phase": "Active"}} for n in names]})
            return
        match = re.fullmatch(r"/api/v1/namespaces/([^/]+)", path)
        if method == "GET" and match:
            self._send(200, {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": match.group(1)},
                             "status": {"phase": "Active"}})
            return
        match = _PATH.match(path)
        if not match:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        ns, kind, name, sub = match.group("ns", "kind", "name", "sub")
        grace = query.get("gracePeriodSeconds")
        if grace is None and isinstance(body, dict):
            grace = body.get("gracePeriodSeconds")
        grace = None if grace is None else int(grace)
        if kind == "pods":
            if sub == "log" and method == "GET":
                self._log(ns, name, _truthy(query.get("follow")))
            elif name is None and method == "GET":
                if _truthy(query.get("watch")):
                    self._watch(ns, query)
                else:
                    s.stats["list"] += 1
                    self._send(200, s.list_pods(ns, query.get("labelSelector")))
            elif name is None and method == "POST":
                self._send(201, s.create_pod(ns, body or {}))
            elif name is None and method == "DELETE":
                deleted = []
                for pod_name in s.pod_names(query.get("labelSelector")):
                    with s.lock:
                        if (ns, pod_name) not in s.pods:
                            continue
                    try:
                        deleted.append(s.delete_pod(ns, pod_name, grace))
                    except ApiError:
                        pass
                self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": deleted})
            elif name is not None and sub is None and method == "GET":
                pod = s.pod(name, ns)
                if pod is None:
                    raise ApiError(404, "NotFound", f'pods "{name}" not found')
                self._send(200, pod)
            elif name is not None and sub is None and method == "DELETE":
                self._send(200, s.delete_pod(ns, name, grace))
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path} by the stand-in")
        else:
            if name is None and method == "POST":
                self._send(201, s.create_secret(ns, body or {}))
            elif name is None and method in ("GET", "DELETE"):
                match_labels = parse_selector(query.get("labelSelector"))
                with s.lock:
                    keys = [k for k, v in s.secrets.items() if k[0] == ns and match_labels(v["metadata"].get("labels"))]
                    items = [copy.deepcopy(s.secrets[k]) for k in keys]
                    if method == "DELETE":
                        for k in keys:
                            del s.secrets[k]
                    rv = s.rv
                self._send(200, {"kind": "SecretList", "apiVersion": "v1",
                                 "metadata": {"resourceVersion": str(rv)}, "items": items})
            elif name is not None and method in ("GET", "DELETE"):
                with s.lock:
                    secret = s.secrets.get((ns, name))
                    if secret is None:
                        raise ApiError(404, "NotFound", f'secrets "{name}" not found')
                    if method == "DELETE":
                        del s.secrets[(ns, name)]
                    secret = copy.deepcopy(secret)
                self._send(200, secret if method == "GET" else status_object(200, "", "") | {"status": "Success"})
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path} by the stand-in")

    # --- watch ----------------------------------------------------------------------
    def _watch(self, namespace: str, query: dict) -> None:
        s = self.server_standin
        match = parse_selector(query.get("labelSelector"))
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        since = query.get("resourceVersion")
        with s.lock:
            s.stats["watch"] += 1
            if since not in (None, "", "0") and int(since) < s.min_rv:
                s.stats["gone"] += 1
                gone = f"too old resource version: {since} ({s.min_rv})"
                initial, index, epoch = None, 0, s.epoch
            else:
                gone = None
                start = s.rv if since in (None, "", "0") else int(since)
                initial = [] if since not in (None, "", "0") else [
                    {"type": "ADDED", "object": copy.deepcopy(p)} for (ns, _), p in sorted(s.pods.items())
                    if ns == namespace and match(p["metadata"].get("labels"))]
                index = bisect.bisect_right(s._history_rvs, start)
                epoch = s.epoch
        self._start_stream("application/json")
        if gone:
            self._event({"type": "ERROR", "object": status_object(410, "Expired", gone)})
            self._end_stream()
            return
        for event in initial:
            self._event(event)
        deadline = time.monotonic() + timeout
        last_sent = time.monotonic()
        while True:
            with s.lock:
                while (index >= len(s.history) and epoch == s.epoch and not s.closed
                       and time.monotonic() < deadline and time.monotonic() - last_sent < 5):
                    s.changed.wait(max(0.01, min(deadline, last_sent + 5) - time.monotonic()))
                batch = s.history[index:]
                index = len(s.history)
                ended = epoch != s.epoch
                closed = s.closed
                rv_now = s.rv
            for _, ns, kind, obj in batch:
                if ns == namespace and match(obj["metadata"].get("labels")):
                    self._event({"type": kind, "object": obj})
                    last_sent = time.monotonic()
            if ended:
                with s.lock:
                    s.stats["gone"] += 1
                self._event({"type": "ERROR", "object": status_object(410, "Expired", "too old resource version")})
                break
            if closed or time.monotonic() >= deadline:
                break
            if time.monotonic() - last_sent >= 5:
                if bookmarks:
                    self._event({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                                                "metadata": {"resourceVersion": str(rv_now)}}})
                else:
                    self._chunk(b"\n")  # keeps finding a closed client
                last_sent = time.monotonic()
        self._end_stream()

    def _event(self, event: dict) -> None:
        self._chunk(json.dumps(event).encode() + b"\n")

    # --- logs -----------------------------------------------------------------------
    def _log(self, namespace: str, name: str, follow: bool) -> None:
        s = self.server_standin
        pod = s.pod(name, namespace)
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        uid = pod["metadata"]["uid"]
        path = os.path.join(s.dir, f"{uid}.log")
        if not os.path.exists(path):
            container = pod["spec"]["containers"][0]["name"]
            raise ApiError(400, "BadRequest",
                           f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating')
        if not follow:
            with open(path, "rb") as fh:
                self._send(200, fh.read(), "text/plain")
            return
        self._start_stream("text/plain")
        with open(path, "rb") as fh:
            while True:
                data = fh.read(65536)
                if data:
                    self._chunk(data)
                    continue
                with s.lock:
                    current = s.pods.get((namespace, name))
                    alive = (current is not None and current["metadata"]["uid"] == uid
                             and current["status"]["phase"] in ("Pending", "Running"))
                if not alive:
                    rest = fh.read()
                    self._chunk(rest)
                    break
                time.sleep(0.05)
        self._end_stream()
