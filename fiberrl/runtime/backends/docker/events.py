"""The watcher: one thread per owner follows the daemon's events of the
containers this process labelled as its own and moves each job's state along
(started, out of memory, died, removed); when the stream is lost it
reconnects and catches up on what it missed."""
from __future__ import annotations

import logging
import threading
import time

from ..base import NEVER_RAN_EXIT, JobSpec, JobStatus
from .common import LABEL_OWNER, LABEL_RUN, exit_code

log = logging.getLogger("fiberrl")


class EventWatcherMixin:
    """The DockerBackend's event watchers, by label in ``_watchers`` (started
    under ``_watch_lock``), their streams in ``_streams``."""

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
