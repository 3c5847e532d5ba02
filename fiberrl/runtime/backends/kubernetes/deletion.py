"""Deleting pods and Secrets: one pod (now, or from a thread of its own so
``status()`` makes no request), or everything matching a label selector."""
from __future__ import annotations

import logging
import queue
import threading

from .api import api_message, consume, read_json
from .connection import _Connection

log = logging.getLogger("fiberrl")


def delete_pod(connection: _Connection, namespace: str, name: str, grace: int | None) -> None:
    """Delete one pod; a failure is logged, not raised (one already gone is no failure)."""
    try:
        consume(connection.api.delete_namespaced_pod(name, namespace, grace_period_seconds=grace,
                                                      _preload_content=False))
    except connection.client_module.ApiException as exc:
        if exc.status != 404:
            log.warning("kubernetes backend: cannot delete pod %s: %s", name, api_message(exc))
    except Exception as exc:
        log.warning("kubernetes backend: cannot delete pod %s: %r", name, exc)


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
        consume(collection(namespace, label_selector=selector, _preload_content=False, **grace))
        return
    except connection.client_module.ApiException as exc:
        if exc.status != 403:
            raise
    listing = api.list_namespaced_pod if pods else api.list_namespaced_secret
    delete = api.delete_namespaced_pod if pods else api.delete_namespaced_secret
    for item in read_json(listing(namespace, label_selector=selector, _preload_content=False))["items"]:
        try:
            consume(delete(item["metadata"]["name"], namespace, _preload_content=False, **grace))
        except connection.client_module.ApiException as exc:
            if exc.status != 404:
                raise


class _Deleter:
    """The queue of pods to delete, and the thread (started on first use) that deletes them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._doomed: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def later(self, connection: _Connection, namespace: str, name: str) -> None:
        """Delete a pod from a thread of its own: status() makes no request."""
        with self._lock:
            self._doomed.put((connection, namespace, name))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fiberrl-k8s-delete", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            connection, namespace, name = self._doomed.get()
            delete_pod(connection, namespace, name, 0)
