"""The stand-in's objects: pods and Secrets by (namespace, name), each
change of a pod recorded at a new resource version for the watches, and
deletion as the API server does it (a grace period for a running pod, then
its dependents by ``ownerReferences``, cascading)."""
from __future__ import annotations

import base64
import copy
import re
import subprocess
import tempfile
import threading
import uuid

from .kubelet import kill_group, run_pod, stop_container
from .objects import ApiError, _now
from .scheduling import check_quota
from .label_selector import parse_selector


class Store:
    """The API server's state; ``StandIn`` serves it."""

    def __init__(self, capacity: dict | None, namespace: str, echo_logs: bool):
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
        self.quota: dict | None = None
        self.closed = False
        self.dir = tempfile.mkdtemp(prefix="k8s-standin-")

    def close(self) -> None:
        """Stop every pod's process; kubelets and watches end."""
        with self.lock:
            self.closed = True
            procs = list(self.procs.values())
            self.changed.notify_all()
        for proc in procs:
            kill_group(proc)

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
            check_quota(self.pods, self.quota, namespace, name)
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now())
            meta.pop("deletionTimestamp", None)
            pod["status"] = {"phase": "Pending", "conditions": [], "qosClass": "BestEffort"}
            self.pods[(namespace, name)] = pod
            self._emit("ADDED", pod)
            out = copy.deepcopy(pod)
        threading.Thread(target=run_pod, args=(self, namespace, name, meta["uid"]),
                         name=f"standin-kubelet-{name}", daemon=True).start()
        return out

    def _current(self, namespace: str, name: str, uid: str) -> dict | None:
        pod = self.pods.get((namespace, name))
        return pod if pod is not None and pod["metadata"]["uid"] == uid else None

    def _remove(self, pod: dict) -> None:
        """Drop ``pod`` (lock held), kill what is left of it, collect its dependents."""
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        del self.pods[key]
        uid = pod["metadata"]["uid"]
        proc = self.procs.get(uid)
        if proc is not None:
            kill_group(proc)
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
        threading.Thread(target=stop_container, args=(proc, grace), daemon=True).start()
        return out

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
