"""How many CPU-bound chunks a local pool runs at once.

A pool of 1024 local workers on 2 cores that gives each a CPU-bound chunk
has 1024 runnable processes, each core switching among 500 cold ones (bare
forked processes doing the same work took 1.3x as long as 16 of them); and
16 workers on 2 cores are already 8 a core.  So when a local pool's workers outnumber its cores by more than
``local_cpu_bound_per_core``, chunks of a function seen to be CPU-bound go
to at most that many workers per core at once, and the other workers wait
for them, as Ray's CPU accounting would have it; chunks of any other
function (I/O, sleeps, locks: what many workers are for) go to every
worker at once, as in multiprocessing.  Measured, an ES iteration on
BipedalWalker (population 2048, 2 cores): 26.3 s against 29.5 s on 16
workers, 28.6 s against 30.0 s on 1024.

A function is CPU-bound when the worker's thread spent most of its recent
chunks running or waiting for a core (``ChunkClock``); a function not seen
yet is not.  A gate could stall tasks that wait for each other (a barrier
across the pool) if such a function first looked CPU-bound: when no chunk
has come back for ``patience`` while the gate holds some back, the function
is let through on every worker for the rest of the pool's life.
"""
from __future__ import annotations

import logging
import math
import os
import time

log = logging.getLogger("fiberrl.pool")
# a function whose chunks' thread ran or waited for a core this share of their time is CPU-bound, until
# the share falls below the lower figure (a chunk may wait for its GIL now and then, or for the master)
CPU_BOUND_SHARE, NOT_CPU_BOUND_SHARE = 0.75, 0.5
# weight of a chunk's seconds in its function's running sums
SMOOTHING = 0.2
# a gate holding chunks back with none coming back for this many of the function's chunk times
# (and at least MIN_PATIENCE s) is taken to stall tasks that wait for each other
PATIENCE_CHUNKS = 10
MIN_PATIENCE = 2.0


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class FunctionLoad:
    """Running sums of a function's chunks' wall seconds and the seconds their thread wanted a core."""
    __slots__ = ("wall", "busy", "cpu_bound")

    def __init__(self, wall: float, busy: float):
        self.wall, self.busy = wall, busy
        self.cpu_bound = False

    def add(self, wall: float, busy: float) -> None:
        self.wall += SMOOTHING * (wall - self.wall)
        self.busy += SMOOTHING * (busy - self.busy)
        share = self.busy / self.wall if self.wall > 0 else 0.0
        self.cpu_bound = share >= (NOT_CPU_BOUND_SHARE if self.cpu_bound else CPU_BOUND_SHARE)


class CpuGate:
    """``limit`` chunks of CPU-bound functions at once; 0: no limit."""

    def __init__(self, limit: int):
        self.limit = limit
        self._loads: dict[int, FunctionLoad] = {}
        self._released: set[int] = set()
        self._held_since: float | None = None  # when the gate began holding chunks back, while it still does
        self.last_result = time.monotonic()

    def observe(self, func_id: int, wall: float, share: float) -> None:
        """A chunk of ``func_id`` came back: it took ``wall`` s, ``share`` of them wanting a core."""
        self.last_result = time.monotonic()
        if math.isnan(share):
            return
        load = self._loads.get(func_id)
        if load is None:
            self._loads[func_id] = load = FunctionLoad(wall, wall * share)
        load.add(wall, wall * share)

    def gates(self, func_id: int, workers: int) -> bool:
        """Whether chunks of ``func_id`` are limited in a pool of ``workers``."""
        if not self.limit or workers <= self.limit or func_id in self._released:
            return False
        load = self._loads.get(func_id)
        return load is not None and load.cpu_bound

    def holding(self, held: bool) -> bool:
        """A dispatch held chunks back, or not; whether that began a spell of holding them."""
        if not held:
            self._held_since = None
            return False
        if self._held_since is None:
            self._held_since = time.monotonic()
            return True
        return False

    def is_holding(self) -> bool:
        return self._held_since is not None

    def patience(self, func_id: int) -> float:
        load = self._loads.get(func_id)
        return max(MIN_PATIENCE, PATIENCE_CHUNKS * (load.wall if load else 0.0))

    def stalled(self, func_id: int) -> bool:
        """Whether the chunks held back for ``func_id`` have waited past its patience with none
        coming back; if so it is let through from now on."""
        if self._held_since is None:
            return False
        waited = time.monotonic() - max(self.last_result, self._held_since)
        if waited < self.patience(func_id):
            return False
        self._released.add(func_id)
        log.info("no chunk has come back in %.1f s while CPU-bound chunks were held back: their function now "
                 "runs on every worker", waited)
        return True
