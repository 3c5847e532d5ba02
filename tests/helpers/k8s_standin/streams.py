"""The streamed answers: watches (newline-delimited WatchEvents from a
resource version, bookmarks, ``410 Gone`` for a version no longer held)
and pod logs (followed until the pod ends)."""
from __future__ import annotations

import bisect
import copy
import json
import os
import time

from .objects import ApiError, status_object
from .plumbing import _Plumbing, _truthy
from .label_selector import parse_selector


class _Streams(_Plumbing):
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
