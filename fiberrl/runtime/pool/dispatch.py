"""The pool's dispatch policy: which waiting worker gets which chunk, when a
worker retires, and what a worker's loss costs.  No locks and no I/O: the
scheduler calls it under its lock, one event at a time, and sends the
replies it returns -- (request, status, parts) -- once the lock is released.

- Workers ask for work (their request is parked until there is some).
  Chunks go in order, to idle workers first, up to ``prefetch`` each; a
  worker gets a second chunk only while more chunks wait than workers
  without one (starting ones included), so that no task waits behind a
  blocked one while a worker is free.  A CPU gate (cpu_gate.py) may hold
  back chunks of a CPU-bound function on a crowded host.
- Lazy (imap) input is pulled while fewer chunks wait than the watermark.
- A worker retires (its request is answered CLOSED once it holds nothing)
  after ``maxtasks`` tasks, when the pool shrinks, and once a closed pool
  is done.
- A lost worker's chunks are rerun first, elsewhere, less those that its
  death fails (what a death costs: crashes.py).
- A worker unheard for ``silence_timeout`` is given up (lifecycle.py): a
  lost worker whose chunks are rerun, none of them charged.
- With ``backups`` (the pool's ``backup_tasks``: MapReduce's backup tasks,
  Spark's speculation), a worker that asks for work when none is waiting
  gets a copy of a chunk another worker holds, the one running longest
  first, each chunk copied once; the first result is delivered and the
  other dropped, and a lost copy's chunk is rerun only if no copy is left.
- A worker told to stop (preemption.py) retires at once: what it holds but
  has not started is rerun first, elsewhere, its successor starts, and
  nothing it gives back then or at its end is charged.
"""
from __future__ import annotations

from collections import deque

from ..processes.stop_signal import told_to_stop
from .cpu_gate import CpuGate
from .crashes import CrashAccount, Loss
from .protocol import CLOSED, OK
from .tasks import Chunk, LazyInput, batch_frames

RUN, CLOSE, TERMINATE = "run", "close", "terminate"


class Worker:
    """What the policy knows of one worker; ``process`` is its owner's and never touched here."""
    __slots__ = ("id", "process", "stream_id", "parked", "inflight", "running", "loading", "funcs", "tasks_done",
                 "retiring", "asked", "started_at", "preempted", "cut_off")

    def __init__(self, worker_id: int, process, started_at: float):
        self.id, self.process, self.started_at = worker_id, process, started_at
        self.stream_id: int | None = None
        self.parked = None  # its request for work, while it waits for an answer
        self.inflight: deque[Chunk] = deque()
        self.running: int | None = None  # the id of the chunk it last said it started
        self.loading: int | None = None  # the id of the function it said it is loading
        self.funcs: set[int] = set()
        self.tasks_done = 0
        self.retiring = False
        self.asked = False
        self.preempted = False
        self.cut_off = False  # given up for lost after long silence (lifecycle.py)


def _nothing() -> None:
    pass


class DispatchPolicy:
    """``blobs``: the functions' pickles by id; ``wake``: tells the manager thread to look now
    (a successor to start, input to pull, a gate to watch, a loss to handle)."""

    def __init__(self, size: int, prefetch: int, maxtasks: int | None, max_crashes: int, gate: CpuGate,
                 blobs: dict, wake=_nothing, backups: bool = False):
        self.target_size = size
        self.backups = backups
        self.state = RUN  # set by the scheduler
        self.broken: str | None = None  # why the pool cannot go on
        self.gate = gate
        self._prefetch, self._maxtasks = prefetch, maxtasks
        self.crashes = CrashAccount(max_crashes)
        self._blobs, self._wake = blobs, wake
        self.pending: deque[Chunk] = deque()
        self.workers: dict[int, Worker] = {}
        # the workers started and not connected yet, kept apart: the manager looks at them at every
        # wake, and a pass over all workers a wake made closing a pool of 10,000 O(W^2)
        self._starting: dict[int, Worker] = {}
        self._retired_all = False  # a closed pool's workers were all told to retire (retire_all_if_done)
        self.by_stream: dict[int, Worker] = {}
        self.idle: dict[Worker, None] = {}  # parked, nothing in flight
        self.busy: dict[Worker, None] = {}  # parked, room for more
        self.working = 0  # workers with chunks in flight
        self.lost: deque[Worker] = deque()
        self.lazy: list[LazyInput] = []
        self.counts = dict(done=0, failed=0, resubmitted=0, restarts=0, preempted=0, cut_off=0, in_flight=0,
                           backups=0, backups_first=0)

    # --- workers coming and going --------------------------------------------
    def wants_worker(self) -> bool:
        return self.missing_workers() > 0

    def missing_workers(self) -> int:
        """How many workers the pool should start now."""
        if not self.may_start_workers():
            return 0
        return max(0, self.target_size - sum(1 for w in self.workers.values() if not w.retiring))

    def may_start_workers(self) -> bool:
        return self.state == RUN and not self.broken

    def add_worker(self, worker: Worker) -> None:
        self.workers[worker.id] = worker
        self._starting[worker.id] = worker

    def forget_worker(self, worker_id: int) -> None:
        """A worker whose job could not be started."""
        self.workers.pop(worker_id, None)
        self._starting.pop(worker_id, None)

    def starting(self) -> list[Worker]:
        """Workers started and not connected yet."""
        return list(self._starting.values())

    def hello(self, stream_id: int, worker_id: int) -> bool:
        """A worker connected on ``stream_id``; whether the pool still wants it."""
        worker = self.workers.get(worker_id)
        if worker is None:
            return False
        worker.stream_id = stream_id
        self._starting.pop(worker_id, None)
        self.by_stream[stream_id] = worker
        return True

    def stream_ended(self, stream_id: int) -> None:
        """A worker's stream ended: the worker is lost."""
        worker = self.by_stream.pop(stream_id, None)
        if worker is not None:
            self.lost.append(worker)
            self._wake()

    def take_lost(self) -> list[Worker]:
        lost, self.lost = list(self.lost), deque()
        return lost

    def startup_overdue(self, starting: list[Worker], limit: float, now: float) -> bool:
        """Whether no worker runs and none of those started has connected within ``limit`` s:
        the pool is then broken, not slow."""
        if self.broken or not starting or len(starting) < len(self.workers):
            return False
        return now - min(w.started_at for w in starting) >= limit

    # --- what workers say -----------------------------------------------------
    def started(self, stream_id: int, chunk_id: int) -> None:
        worker = self.by_stream.get(stream_id)
        if worker is not None:
            worker.running = chunk_id
            if worker.loading is not None:
                self.crashes.loaded.add(worker.loading)
                worker.loading = None

    def loading(self, stream_id: int) -> None:
        worker = self.by_stream.get(stream_id)
        if worker is not None and worker.inflight:  # its head: chunks run in order
            worker.loading = worker.inflight[0].func_id

    def leave(self, stream_id: int) -> list:
        """A worker was told to stop: it keeps the chunk it runs, if it can finish it in time;
        the rest goes to others first, and its successor starts."""
        worker = self.by_stream.get(stream_id)
        if worker is None:
            return []
        worker.preempted = True
        worker.retiring = True
        self._wake()  # start its successor
        inflight = worker.inflight
        running = inflight[0] if inflight and inflight[0].id == worker.running else None
        handed = [c for c in inflight if c is not running]
        if handed:
            inflight.clear()
            if running is None:
                self.working -= 1
            else:
                inflight.append(running)
            handed = self._uncovered(handed)
            self.pending.extendleft(reversed(handed))
            moved = sum(c.count for c in handed)
            self.counts["in_flight"] -= moved
            self.counts["resubmitted"] += moved
        self.classify(worker)
        return self.dispatch() + self.retire_if_done(worker)

    def park(self, request) -> list:
        """A worker asks for work: answer now if there is some, else later."""
        worker = self.by_stream.get(request.stream_id)
        if worker is None or self.state == TERMINATE:
            return [(request, CLOSED, [])]
        worker.parked, worker.asked = request, True
        self.crashes.startup_deaths = 0
        self.classify(worker)
        return self.dispatch() + self.retire_if_done(worker)

    def results(self, request, reports, blobs, delivered: list, ask: bool) -> list:
        """A worker sent results (and, if ``ask``, asks for work): the chunks they complete go
        to ``delivered`` as (chunk, ok, blob), each once."""
        worker = self.by_stream.get(request.stream_id)
        if worker is None:
            return [(request, CLOSED, [])]  # from a worker already given up for lost: its chunks went elsewhere
        for (chunk_id, ok, wall, share), blob in zip(reports, blobs, strict=True):
            chunk = _pop_chunk(worker.inflight, chunk_id)
            if chunk is None:
                continue
            self.gate.observe(chunk.func_id, wall, share)
            if not worker.inflight:
                self.working -= 1
            if chunk.done:
                continue  # a copy's result came first (backups)
            chunk.done = True
            if chunk.backup is worker:
                self.counts["backups_first"] += chunk.count
            worker.tasks_done += chunk.count
            self.counts["in_flight"] -= chunk.count
            self.counts["done" if ok else "failed"] += chunk.count
            delivered.append((chunk, ok, blob))
        if self._maxtasks and worker.tasks_done >= self._maxtasks and not worker.retiring:
            worker.retiring = True
            self._wake()  # start its successor
        if ask:
            replies = self.park(request)
        else:
            # the worker may have asked for more already: it gets it, or is retired, now
            self.classify(worker)
            replies = self.dispatch() + self.retire_if_done(worker)
        if (self.lazy and len(self.pending) < self.watermark()) or \
                (self.state == CLOSE and not self.pending and not self.lazy):
            self._wake()  # more input to pull, or the close may be complete
        return replies

    # --- work coming in ---------------------------------------------------------
    def add_chunks(self, chunks: list[Chunk]) -> list:
        self.pending.extend(chunks)
        return self.dispatch()

    def watermark(self) -> int:
        """Chunks waiting below which lazy input is pulled."""
        return 2 * self._prefetch * max(1, self.target_size)

    def wants_input(self, lazy: LazyInput) -> bool:
        return lazy.submission.wants_more and len(self.pending) < self.watermark()

    def fed(self, lazy: LazyInput, chunks: list[Chunk], exhausted: bool) -> list:
        """``lazy`` gave ``chunks`` (pulled by the caller, this lock not held); ``exhausted``: its last."""
        self.pending.extend(chunks)
        replies = self.dispatch()
        if exhausted:
            self.lazy.remove(lazy)
        return replies

    # --- dispatching --------------------------------------------------------------
    def classify(self, worker: Worker) -> None:
        self.idle.pop(worker, None)
        self.busy.pop(worker, None)
        if worker.parked is not None and not worker.retiring and len(worker.inflight) < self._prefetch:
            (self.busy if worker.inflight else self.idle)[worker] = None

    def dispatch(self) -> list:
        batches: dict[Worker, list[Chunk]] = {}
        held = False
        while self.pending and (self.idle or self.busy):
            gated = bool(self.idle) and self.gate.gates(self.pending[0].func_id, self.target_size)
            if gated and self.working >= self.gate.limit:
                # one more CPU-bound chunk running would only share the cores more thinly; nor is it
                # queued behind a running one, which it would wait for if the gate lets go (below)
                held = True
                break
            if not self.idle and len(self.pending) <= self.target_size - self.working:
                # the workers that have none (starting, or about to ask) take these: a second chunk
                # held behind a running one would wait for it, and a task that blocks until the
                # others start would wait for ever
                break
            if gated:
                worker = next(reversed(self.idle))  # the one idle for the shortest time: its memory is warm
            else:
                worker = next(iter(self.idle or self.busy))  # idle workers first
            chunk = self.pending.popleft()
            if not worker.inflight:
                self.working += 1
            worker.inflight.append(chunk)
            self.counts["in_flight"] += chunk.count
            batches.setdefault(worker, []).append(chunk)
            self.classify(worker)
        if self.gate.holding(held):
            self._wake()  # the manager watches for a stall
        if self.backups and self.idle and not self.pending and not self.lazy:
            self._back_up(batches)
        replies = []
        backlog = bytes((bool(self.pending or self.lazy),))  # the worker asks again before it runs out
        for worker, chunks in batches.items():
            request, worker.parked = worker.parked, None
            self.classify(worker)
            replies.append((request, OK, batch_frames(backlog, chunks, worker.funcs, self._blobs)))
        return replies

    def _back_up(self, batches: dict) -> None:
        """Idle workers take copies of chunks others hold, those running longest first."""
        held = [(w.running != c.id, c.id, c) for w in self.workers.values() for c in w.inflight
                if c.backup is None and not c.done]
        for _, _, chunk in sorted(held, key=lambda entry: entry[:2]):
            if not self.idle:
                return
            worker = next(iter(self.idle))
            chunk.backup = worker
            self.working += 1
            worker.inflight.append(chunk)
            self.counts["backups"] += chunk.count
            batches.setdefault(worker, []).append(chunk)
            self.classify(worker)

    def _uncovered(self, chunks: list[Chunk]) -> list[Chunk]:
        """Of the chunks a lost worker held, those to run again: not delivered, and with no copy
        left on another worker (backups)."""
        return [c for c in chunks if not c.done and not (c.backup is not None and any(
            c in w.inflight for w in self.workers.values()))]

    def release_stalled(self) -> list:
        """Chunks the gate held back past its patience go now."""
        return self.dispatch() if self.pending and self.gate.stalled(self.pending[0].func_id) else []

    def retire_if_done(self, worker: Worker) -> list:
        if worker.retiring and not worker.inflight and worker.parked is not None:
            request, worker.parked = worker.parked, None
            self.classify(worker)
            return [(request, CLOSED, [])]
        return []

    # --- the pool's course ----------------------------------------------------------
    def all_done(self) -> bool:
        return not self.pending and not self.lazy and not any(w.inflight for w in self.workers.values())

    def needs_attention(self) -> bool:
        """Whether the manager thread has something to do now (what looks at every worker, last)."""
        if self.lost or self.state == TERMINATE:
            return True
        if any(lazy.submission.wants_more for lazy in self.lazy) and len(self.pending) < self.watermark():
            return True
        if self.state == RUN:
            return not self.broken and sum(1 for w in self.workers.values() if not w.retiring) < self.target_size
        return self.state == CLOSE and not self._retired_all and self.all_done() \
            and any(not w.retiring for w in self.workers.values())

    def retire_all_if_done(self) -> list:
        """A closed pool with nothing left to do retires every worker, once: one that asks for work
        after is retired as it asks (``park``)."""
        if self.state != CLOSE or self._retired_all or not self.all_done():
            return []
        self._retired_all = True
        for worker in self.workers.values():
            worker.retiring = True
        return [r for w in list(self.workers.values()) for r in self.retire_if_done(w)]

    def resize(self, size: int) -> list:
        self.target_size = size
        active = [w for w in self.workers.values() if not w.retiring]
        # retire the least busy first
        for worker in sorted(active, key=lambda w: len(w.inflight))[:max(0, len(active) - size)]:
            worker.retiring = True
            self.classify(worker)
        return [r for w in list(self.workers.values()) for r in self.retire_if_done(w)]

    def take_everything(self) -> tuple[list[Chunk], list[LazyInput]]:
        """Every chunk waiting or in flight, and every lazy input, for the caller to fail."""
        held = {c.id: c for w in self.workers.values() for c in w.inflight if not c.done}  # a copy once
        chunks = list(self.pending) + list(held.values())
        self.pending.clear()
        lazies, self.lazy = self.lazy, []
        return chunks, lazies

    # --- a worker lost ---------------------------------------------------------------
    def lose(self, worker: Worker, exitcode: int | None, lost: str | None, job_error: str | None,
             now: float) -> Loss | None:
        """``worker`` is gone (``lost``: the backend says why it was killed with others;
        ``job_error``: why it could not run): its chunks are charged (crashes.py) and the rest
        rerun first.  None if that was already handled."""
        if self.workers.pop(worker.id, None) is None:
            return None
        self._starting.pop(worker.id, None)
        self.by_stream.pop(worker.stream_id, None)
        if worker.parked is not None:
            worker.parked.claim()  # nobody is left to answer
            worker.parked = None
        self.classify(worker)
        held, failed = list(worker.inflight), []
        if held:
            self.working -= 1
        worker.inflight.clear()
        inflight = self._uncovered(held)
        # told to stop, before it could say so too (a job stopped as it started)
        preempted = worker.preempted or (not worker.asked and told_to_stop(exitcode))
        if preempted:
            lost = "it was told to stop"  # what it gives back is not its fault
        elif worker.cut_off:
            lost = "its host was cut off"  # nor is a partition
        if inflight:
            inflight, failed, self.pending = self.crashes.charge(worker, inflight, self.pending, lost,
                                                                 self.target_size)
            self.pending.extendleft(reversed(inflight))
            self.counts["in_flight"] -= sum(c.count for c in inflight) + sum(c.count for c, _ in failed)
            self.counts["resubmitted"] += sum(c.count for c in inflight)
            self.counts["failed"] += sum(c.count for c, _ in failed)
        expected = worker.retiring and not inflight and not failed and exitcode == 0
        if preempted:
            self.counts["preempted"] += 1
        elif worker.cut_off:
            self.counts["cut_off"] += 1
        elif not expected:
            self.counts["restarts"] += 1
            if not worker.asked and not lost:
                connected = any(w.stream_id is not None for w in self.workers.values())
                broken = self.crashes.startup_death(worker, exitcode, job_error, connected, now)
                if broken:
                    self.broken = broken
        return Loss(inflight, failed, expected, preempted)


def _pop_chunk(inflight: deque, chunk_id: int):
    if inflight and inflight[0].id == chunk_id:
        return inflight.popleft()
    for chunk in inflight:
        if chunk.id == chunk_id:
            inflight.remove(chunk)
            return chunk
    return None
