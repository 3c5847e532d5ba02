"""The list+watch of this process's pods that keeps the cache: a listing,
then a watch from its resource version, re-opened from the last version seen
(and re-listed after ``410 Gone``)."""
from __future__ import annotations

import json
import logging
import random
import threading
import time

from .api import api_message, close_streamed, read_json, streamed_lines
from .cache import PodCache
from .connection import _Connection

log = logging.getLogger("fiberrl")

WATCH_SECONDS = 240       # the server ends a watch after this; it is re-opened from the last version
WATCH_READ_TIMEOUT = 90   # no byte for this long (not even a bookmark): re-open the watch


class _Watch:
    """One list+watch of the pods matching a label selector, into the backend's cache."""

    def __init__(self, cache: PodCache, connection: _Connection, selector: str):
        self.cache = cache
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
        listing = read_json(api.list_namespaced_pod(self.connection.namespace, label_selector=self.selector,
                                                    _preload_content=False, _request_timeout=60))
        self.cache.replace(listing.get("items") or [], started)
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
                    for line in streamed_lines(response):
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
                            self.cache.apply(kind, obj)
                        failures = 0
                finally:
                    self._response = None
                    close_streamed(response)
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
