"""The kubernetes backend under test, for the shared backend tests: one
stand-in API server per test session (tests/helpers/k8s_standin/), since no
cluster can run here.  It runs each pod's command as a local process."""
from __future__ import annotations

import atexit
import json
import threading
import time
import urllib.error
import urllib.request

_standin = None
_lock = threading.Lock()


def available() -> str | None:
    """Why the kubernetes backend cannot be tested here, or None."""
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        return "the kubernetes client is not installed (pip install kubernetes)"
    return None


def standin():
    """The session's stand-in API server, started on first use."""
    global _standin
    with _lock:
        if _standin is None:
            from .k8s_standin import StandIn
            _standin = StandIn().start()
            atexit.register(_standin.stop)
        return _standin


def settings() -> dict:
    """Settings for ``fiberrl.runtime.configure`` that aim the kubernetes backend at the stand-in."""
    return {"backend": "kubernetes", "kubernetes_config": standin().kubeconfig, "image": "fiberrl-standin"}


def leftovers(settle: float = 5.0) -> list[str]:
    """fiberrl pods still in the stand-in (any phase) and Secrets of runs
    other than this process's own (which lives as long as this process).
    Pods are deleted in the background once their exit is seen, and
    dependents after their owner, so this waits up to ``settle`` seconds for
    the list to empty."""
    from fiberrl.runtime.net import auth
    keep = (auth.run_id(),)
    deadline = time.monotonic() + settle
    while True:
        found = standin().leftovers(keep_runs=keep)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


def kill_job(process) -> None:
    """Delete the pod of a started fiberrl Process through the API, as
    ``kubectl delete pod`` does (default grace period)."""
    handle = process._job.handle
    server = standin()
    request = urllib.request.Request(
        f"{server.url}/api/v1/namespaces/{handle.namespace}/pods/{handle.name}", method="DELETE",
        data=json.dumps({"kind": "DeleteOptions", "apiVersion": "v1"}).encode(),
        headers={"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        if exc.code != 404:  # already gone
            raise
