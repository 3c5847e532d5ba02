"""The cache the watches keep: what they last saw of the pods of this
process's jobs, so ``status()`` costs no request however often a Pool polls
it.  Every change bumps ``generation`` and wakes whoever waits on ``cond``."""
from __future__ import annotations

import threading
from typing import Protocol

from .pod_state import _PodState, update_state


class AwaitedPod(Protocol):
    """What the cache reads of a job's handle (``jobs._PodJob``)."""

    posted: float | None  # when the API server accepted the pod; None until it has


class PodCache:
    def __init__(self):
        self.cond = threading.Condition()
        self.generation = 0
        self.pods: dict[str, _PodState] = {}
        self.jobs: dict[str, AwaitedPod] = {}  # this process's jobs' handles, by pod name

    def apply(self, kind: str, pod: dict) -> None:
        """A watch event."""
        name = pod["metadata"]["name"]
        with self.cond:
            state = self.pods.get(name)
            if state is None:
                if name not in self.jobs:
                    return  # not (or no longer) a job of this process
                state = self.pods[name] = _PodState()
            update_state(state, pod)
            if kind == "DELETED":
                state.gone = True
            self.generation += 1
            self.cond.notify_all()

    def replace(self, items: list[dict], started: float) -> None:
        """A fresh listing: pods we knew and that are missing from it are gone."""
        with self.cond:
            listed = set()
            for pod in items:
                name = pod["metadata"]["name"]
                listed.add(name)
                if name in self.jobs:
                    update_state(self.pods.setdefault(name, _PodState()), pod)
            for name, handle in self.jobs.items():
                if name not in listed and (name in self.pods or (handle.posted or started) < started):
                    self.pods.setdefault(name, _PodState()).gone = True
            self.generation += 1
            self.cond.notify_all()
