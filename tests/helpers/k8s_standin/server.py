"""``StandIn``: the store served over HTTP on a local port, with a kubeconfig
that points at it, every request recorded, and faults to inject."""
from __future__ import annotations

import os
import re
import shutil
import threading
import uuid
from collections import Counter
from http.server import ThreadingHTTPServer

from .handler import _Handler
from .store import Store


class StandIn(Store):
    """The server.  ``start()`` it, point a client at ``kubeconfig``."""

    def __init__(self, capacity: dict | None = None, namespace: str = "fiberrl-test", echo_logs: bool = False):
        self.token = uuid.uuid4().hex
        super().__init__(capacity, namespace, echo_logs)
        self.requests: list[dict] = []
        self.stats: Counter = Counter()
        self.faults: list[dict] = []
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
        self.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- requests ----------------------------------------------------------------
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
