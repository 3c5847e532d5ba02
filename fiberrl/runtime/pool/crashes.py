"""What a worker's death costs: which of its chunks are charged with it,
which fail for good, and when deaths before any work mean the pool cannot
start.  Part of the dispatch policy; no locks and no I/O.

- Only the chunk the worker said it was running (W_START, or in its request
  for more) is charged, and not at all when the backend says it was killed
  with others (``lost``: its fork server killed); chunks it merely held are
  rerun free.  A chunk charged ``max_crashes`` times fails.
- A death while loading a function (W_LOAD) that no worker has loaded yet
  is the function's: its chunks, waiting or held, fail once ``max_crashes``
  x the pool's size of workers died loading it.
- A worker that dies before asking for work is a startup death; workers
  dying together (started before the last one counted) count once, and
  ``MAX_STARTUP_DEATHS`` in a row break the pool, as does a backend's
  ``job_error`` while no worker is connected.
"""
from __future__ import annotations

import math
from collections import deque

# generations of workers in a row dying before asking for work, after which the pool gives up
MAX_STARTUP_DEATHS = 3


class Loss:
    """What a worker's loss cost: chunks ``resubmitted`` (to run elsewhere), ``failed`` ones
    with why, whether it was ``expected`` (a retiring worker's clean exit) and whether the
    worker was ``preempted`` (told to stop: no crash)."""
    __slots__ = ("resubmitted", "failed", "expected", "preempted")

    def __init__(self, resubmitted: list, failed: list, expected: bool, preempted: bool = False):
        self.resubmitted, self.failed, self.expected, self.preempted = resubmitted, failed, expected, preempted


class CrashAccount:
    def __init__(self, max_crashes: int):
        self.max_crashes = max_crashes
        self.startup_deaths = 0  # in a row: a worker asking for work sets it back to 0
        self._startup_death_at = -math.inf  # when the last one counted was handled
        self.load_deaths: dict[int, int] = {}  # by function: workers that died loading it
        self.loaded: set[int] = set()  # functions some worker has loaded: loading them kills nobody

    def charge(self, worker, inflight: list, pending: deque, lost: str | None,
               size: int) -> tuple[list, list, deque]:
        """A lost ``worker`` held ``inflight`` (in the order it runs them): those of them to
        rerun, (chunk, why) of those that fail, and what is left of ``pending``."""
        failed = []
        # only the chunk it was running is charged, and not when the worker was killed with
        # others from outside (its fork server killed): chunks it merely held (the rest of its
        # batch, or one sent as it died) are rerun free
        suspect = inflight[0] if inflight[0].id == worker.running and not lost else None
        if suspect is not None:
            suspect.crashes += 1
            if suspect.crashes >= self.max_crashes:
                failed.append((suspect, f"was running each of the {suspect.crashes} times a worker died"))
                inflight = inflight[1:]
        elif worker.loading is not None and worker.loading not in self.loaded and not lost:
            # dying while loading a function no worker has loaded yet is the function's.  Every
            # worker may be loading it at once, and a storm of kills takes loaders before any is
            # done (seen: 3 in a row on a loaded 2-core host): its chunks fail once max_task_crashes
            # times as many workers as the pool has died loading it, as many as the chunks of a
            # function that kills whoever runs it may cost
            func = worker.loading
            deaths = self.load_deaths[func] = self.load_deaths.get(func, 0) + 1
            if deaths >= self.max_crashes * max(1, size):
                why = f"needs a function that {deaths} workers died loading, and none has loaded"
                failed += [(c, why) for c in (*inflight, *pending) if c.func_id == func]
                inflight = [c for c in inflight if c.func_id != func]
                pending = deque(c for c in pending if c.func_id != func)
        return inflight, failed, pending

    def startup_death(self, worker, exitcode: int | None, job_error: str | None, connected: bool,
                      now: float) -> str | None:
        """``worker`` died before asking for work; why the pool is broken, if it now is
        (``connected``: whether any other worker is)."""
        if worker.started_at > self._startup_death_at:
            # workers dying together (their host lost, the local fork server killed) count
            # once: only one started after the last counted death shows the start failing again
            self.startup_deaths += 1
            self._startup_death_at = now
        if job_error and not connected:
            # the cluster will not run the job (no such image, never scheduled) and no worker
            # runs: waiting for a retry would only hang the caller as long again
            return f"pool workers cannot start: {job_error}"
        if self.startup_deaths >= MAX_STARTUP_DEATHS:
            return (f"pool workers keep dying before taking any task (last exit code "
                    f"{exitcode}); is the initializer failing? See the log above")
        return None
