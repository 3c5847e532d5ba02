"""The master side of a Pool: hands chunks of tasks to workers that ask for
them, collects results, and replaces workers that die without losing or
repeating a result.

Each worker talks to the pool over one authenticated stream
(:mod:`fiberrl.runtime.net.stream`); the pool's :class:`StreamPump` reads them
all and runs :meth:`handle` on the workers' requests, on the thread of a
caller waiting for a result when there is one; a stream that ends is a
worker lost.  Callers of the Pool API run :meth:`submit`; one manager
thread per pool starts and replaces workers and pulls lazy (imap) input.
All state is under one lock; replies are sent after it is released.
"""
from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass

import cloudpickle

from ..backends import listen_host, resolve_name
from ..config import get_config
from ..net import wire
from ..net.errors import LinkError
from ..net.listener import Listener
from ..net.stream import Stream
from ..net.stream_pump import StreamPump
from ..net.transport import CLOSED, OK
from ..processes.process import Process, cpu_count
from .cpu_gate import CpuGate, usable_cores
from .results import PoolTerminated, Submission, WorkerLostError, with_remote_traceback
from .worker import (
    CHUNK,
    CHUNK_ID,
    REPORT,
    W_GET,
    W_HELLO,
    W_LOAD,
    W_RESULT,
    W_RESULT_GET,
    W_START,
    WORKER_ID,
    run_worker,
)

log = logging.getLogger("fiberrl.pool")
# how much lower local pool workers run while they outnumber the cores (see Scheduler._worker_nice)
OVERSUBSCRIBED_NICE = 10
RUN, CLOSE, TERMINATE = "run", "close", "terminate"
# generations of workers in a row dying before asking for work, after which the pool gives up
MAX_STARTUP_DEATHS = 3


@dataclass
class PoolStatistics:
    workers_alive: int
    workers_starting: int
    tasks_pending: int
    tasks_in_flight: int
    tasks_done: int
    tasks_failed: int
    tasks_resubmitted: int
    worker_restarts: int


class Chunk:
    __slots__ = ("id", "submission", "start", "count", "func_id", "star", "args", "crashes")

    def __init__(self, chunk_id, submission, start, count, func_id, star, args):
        self.id, self.submission, self.start, self.count = chunk_id, submission, start, count
        self.func_id, self.star, self.args, self.crashes = func_id, star, args, 0

    def name(self) -> str:
        tasks = f"task {self.start}" if self.count == 1 else f"tasks {self.start}..{self.start + self.count - 1}"
        return f"{tasks} of {self.submission.description}"


class Worker:
    __slots__ = ("id", "process", "stream_id", "parked", "inflight", "running", "loading", "funcs", "tasks_done",
                 "retiring", "asked", "started_at")

    def __init__(self, worker_id: int, process: Process):
        self.id, self.process = worker_id, process
        self.started_at = time.monotonic()
        self.stream_id: int | None = None
        self.parked: "WorkerRequest | None" = None
        self.inflight: deque[Chunk] = deque()
        self.running: int | None = None  # the id of the chunk it last said it started
        self.loading: int | None = None  # the id of the function it said it is loading
        self.funcs: set[int] = set()
        self.tasks_done = 0
        self.retiring = False
        self.asked = False


class WorkerRequest:
    """One request read from a worker's stream; answered exactly once (a
    posted result, W_RESULT, wants no answer)."""

    __slots__ = ("_stream", "op", "body", "stream_id", "_answered")

    def __init__(self, stream: Stream, stream_id: int, frame: bytearray):
        self._stream = stream
        self.op = frame[0]
        self.body = memoryview(frame)[1:]
        self.stream_id = stream_id
        self._answered = threading.Lock()

    def claim(self) -> bool:
        """Reserve the right to answer; False if someone else already did."""
        return self._answered.acquire(blocking=False)

    def reply(self, status: int, *parts) -> None:
        if self.op == W_RESULT or not self.claim():
            return
        try:
            self._stream.send([bytes((status,)), *parts])
        except LinkError:
            pass  # the worker is gone; its loss is being handled


class LazyInput:
    """An imap job whose input is pulled only as workers can take it."""

    def __init__(self, submission, iterator, chunksize, func_id, star):
        self.submission, self.iterator, self.chunksize = submission, iterator, chunksize
        self.func_id, self.star, self.next_index = func_id, star, 0


class Scheduler:
    def __init__(self, size: int, initializer, initargs, maxtasksperchild,
                 prefetch: int, max_task_crashes: int, worker_resources: dict):
        self._initializer, self._initargs = initializer, initargs
        self._maxtasks, self._prefetch, self._max_crashes = maxtasksperchild, prefetch, max_task_crashes
        self._worker_resources = worker_resources
        self.target_size = size
        self.state = RUN
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: deque[Chunk] = deque()
        self._workers: dict[int, Worker] = {}
        self._by_stream: dict[int, Worker] = {}
        self._idle: dict[Worker, None] = {}  # parked, nothing in flight
        self._busy: dict[Worker, None] = {}  # parked, room for more
        self._working = 0  # workers with chunks in flight
        self._lost: deque[Worker] = deque()
        self._lazy: list[LazyInput] = []
        self._funcs: dict[int, bytearray] = {}
        self._func_ids: dict = {}
        self._chunk_ids = itertools.count()
        self._worker_ids = itertools.count()
        self._startup_deaths = 0
        self._load_deaths: dict[int, int] = {}  # by function: workers that died loading it
        self._loaded: set[int] = set()  # functions some worker has loaded: loading them kills nobody
        self._startup_death_at = -math.inf  # when the last one counted was handled
        self._broken: str | None = None
        self._counts = dict(done=0, failed=0, resubmitted=0, restarts=0, in_flight=0)
        self._stream_ids = itertools.count(1)
        self.pump = StreamPump(self._on_frames, self._on_stream_closed, "fiberrl-pool-io")
        self._listener = Listener(listen_host(), self._serve_worker, hand_off=True, name="pool")
        self._local = resolve_name(get_config().backend) == "local"
        per_core = get_config().local_cpu_bound_per_core
        self._gate = CpuGate(max(1, round(per_core * usable_cores())) if self._local and per_core else 0)
        self._manager = threading.Thread(target=self._manage, name="fiberrl-pool-manager", daemon=True)
        self._manager.start()

    # --- submitting -------------------------------------------------------
    def function_id(self, func) -> int:
        """Pickle ``func`` once per pool; workers fetch it once each."""
        try:
            known = self._func_ids.get(func)
        except TypeError:  # unhashable callable: pickle it every time
            known = None
        if known is not None:
            return known
        # by plain pickle where it can (cloudpickle where it cannot, as any message): a
        # classmethod, which cloudpickle sends by value, then runs the module's own code
        # in the worker, so that a task's traceback shows its source lines
        blob = wire.encode(func)
        with self._lock:
            func_id = len(self._funcs)
            self._funcs[func_id] = blob
        try:
            self._func_ids[func] = func_id
        except TypeError:
            pass
        return func_id

    def make_chunks(self, submission: Submission, func_id: int, star: bool, items: list, chunksize: int,
                    first: int = 0):
        """Serialise ``items`` into chunks; a chunk that cannot be pickled fails its job at once."""
        chunks = []
        for start in range(0, len(items), chunksize):
            batch = items[start:start + chunksize]
            try:
                args = wire.encode(batch)
            except Exception as exc:
                # the pickler's own exception, as multiprocessing gives it: code catches its type
                bad = next((i for i, item in enumerate(batch) if not _picklable(item)), 0)
                exc.add_note(f"task {first + start + bad} of {submission.description}: its arguments cannot be pickled")
                submission.fail(first + start, len(batch), exc)
                continue
            chunks.append(Chunk(next(self._chunk_ids), submission, first + start, len(batch), func_id, star, args))
        return chunks

    def submit(self, chunks) -> None:
        with self._lock:
            self._check_running()
            self._pending.extend(chunks)
            replies = self._dispatch()
        _send(replies)

    def submit_lazy(self, lazy: LazyInput) -> None:
        with self._lock:
            self._check_running()
            self._lazy.append(lazy)
            self._wake.notify_all()

    def wake(self) -> None:
        with self._lock:
            self._wake.notify_all()

    def _check_running(self) -> None:
        if self.state != RUN:
            raise ValueError("Pool not running")
        if self._broken:
            raise RuntimeError(self._broken)

    # --- the workers' requests (on whichever thread reads the streams) ------
    def _serve_worker(self, stream: Stream) -> None:
        self.pump.add(stream, next(self._stream_ids))

    def _on_frames(self, stream: Stream, stream_id: int, frames) -> None:
        for frame in frames:
            self.handle(WorkerRequest(stream, stream_id, frame))

    def _on_stream_closed(self, _stream: Stream, stream_id: int) -> None:
        self._worker_stream_ended(stream_id)

    def handle(self, request: WorkerRequest) -> None:
        op = request.op
        if op == W_START:
            with self._lock:
                self._started(request)
        elif op == W_LOAD:
            with self._lock:
                worker = self._by_stream.get(request.stream_id)
                if worker is not None and worker.inflight:  # its head: chunks run in order
                    worker.loading = worker.inflight[0].func_id
        elif op == W_RESULT or op == W_RESULT_GET:
            self._on_results(request, ask=op == W_RESULT_GET)
        elif op == W_GET:
            with self._lock:
                if request.body:
                    self._started(request)  # asked for more as it started its last chunk
                replies = self._park(request)
            _send(replies)
        elif op == W_HELLO:
            worker_id = WORKER_ID.unpack_from(request.body)[0]
            with self._lock:
                worker = self._workers.get(worker_id)
                if worker is not None:
                    worker.stream_id = request.stream_id
                    self._by_stream[request.stream_id] = worker
            request.reply(OK if worker is not None else CLOSED)
        else:
            request.reply(CLOSED)

    def _started(self, request: WorkerRequest) -> None:
        worker = self._by_stream.get(request.stream_id)
        if worker is not None:
            worker.running = CHUNK_ID.unpack_from(request.body)[0]
            if worker.loading is not None:
                self._loaded.add(worker.loading)
                worker.loading = None

    def _park(self, request: WorkerRequest) -> list:
        """A worker asks for work: answer now if there is some, else later."""
        worker = self._by_stream.get(request.stream_id)
        if worker is None or self.state == TERMINATE:
            return [(request, CLOSED, [])]
        worker.parked, worker.asked = request, True
        self._startup_deaths = 0
        self._classify(worker)
        return self._dispatch() + self._retire_if_done(worker)

    def _on_results(self, request: WorkerRequest, ask: bool) -> None:
        parts = wire.split(request.body)
        reports = REPORT.iter_unpack(parts[0])
        delivered = []
        with self._lock:
            worker = self._by_stream.get(request.stream_id)
            if worker is None:
                request.reply(CLOSED)
                return  # from a worker already given up for lost: its chunks went elsewhere
            for (chunk_id, ok, wall, share), blob in zip(reports, parts[1:], strict=True):
                chunk = _pop_chunk(worker.inflight, chunk_id)
                if chunk is None:
                    continue
                self._gate.observe(chunk.func_id, wall, share)
                if not worker.inflight:
                    self._working -= 1
                worker.tasks_done += chunk.count
                self._counts["in_flight"] -= chunk.count
                self._counts["done" if ok else "failed"] += chunk.count
                delivered.append((chunk, ok, blob))
            if self._maxtasks and worker.tasks_done >= self._maxtasks and not worker.retiring:
                worker.retiring = True
                self._wake.notify_all()  # start its successor
            if ask:
                replies = self._park(request)
            else:
                # the worker may have asked for more already: it gets it, or is retired, now
                self._classify(worker)
                replies = self._dispatch() + self._retire_if_done(worker)
            if (self._lazy and len(self._pending) < self._watermark()) or \
                    (self.state == CLOSE and not self._pending and not self._lazy):
                self._wake.notify_all()  # more input to pull, or the close may be complete
        _send(replies)  # the worker's next work first: unpickling results may take a while
        for chunk, ok, blob in delivered:
            _deliver(chunk, ok, blob)

    def _worker_stream_ended(self, stream_id: int) -> None:
        """A worker's stream ended: the worker is lost."""
        with self._lock:
            worker = self._by_stream.pop(stream_id, None)
            if worker is not None:
                self._lost.append(worker)
                self._wake.notify_all()

    # --- dispatching (under self._lock) -----------------------------------
    def _classify(self, worker: Worker) -> None:
        self._idle.pop(worker, None)
        self._busy.pop(worker, None)
        if worker.parked is not None and not worker.retiring and len(worker.inflight) < self._prefetch:
            (self._busy if worker.inflight else self._idle)[worker] = None

    def _dispatch(self) -> list:
        batches: dict[Worker, list[Chunk]] = {}
        held = False
        while self._pending and (self._idle or self._busy):
            gated = bool(self._idle) and self._gate.gates(self._pending[0].func_id, self.target_size)
            if gated and self._working >= self._gate.limit:
                # one more CPU-bound chunk running would only share the cores more thinly; nor is it
                # queued behind a running one, which it would wait for if the gate lets go (below)
                held = True
                break
            if not self._idle and len(self._pending) <= self.target_size - self._working:
                # the workers that have none (starting, or about to ask) take these: a second chunk
                # held behind a running one would wait for it, and a task that blocks until the
                # others start would wait for ever
                break
            if gated:
                worker = next(reversed(self._idle))  # the one idle for the shortest time: its memory is warm
            else:
                worker = next(iter(self._idle or self._busy))  # idle workers first
            chunk = self._pending.popleft()
            if not worker.inflight:
                self._working += 1
            worker.inflight.append(chunk)
            self._counts["in_flight"] += chunk.count
            batches.setdefault(worker, []).append(chunk)
            self._classify(worker)
        if self._gate.holding(held):
            self._wake.notify_all()  # the manager watches for a stall
        replies = []
        backlog = bytes((bool(self._pending or self._lazy),))  # the worker asks again before it runs out
        for worker, chunks in batches.items():
            request, worker.parked = worker.parked, None
            self._classify(worker)
            meta, blobs = [], []
            for chunk in chunks:
                new_func = chunk.func_id not in worker.funcs
                if new_func:
                    worker.funcs.add(chunk.func_id)
                    blobs.append(self._funcs[chunk.func_id])
                meta.append(CHUNK.pack(chunk.id, chunk.func_id, new_func, chunk.star))
                blobs.append(chunk.args)
            replies.append((request, OK, wire.frames([backlog + b"".join(meta), *blobs])))
        return replies

    def _retire_if_done(self, worker: Worker) -> list:
        if worker.retiring and not worker.inflight and worker.parked is not None:
            request, worker.parked = worker.parked, None
            self._classify(worker)
            return [(request, CLOSED, [])]
        return []

    # --- the manager thread -------------------------------------------------
    def _manage(self) -> None:
        while True:
            with self._lock:
                starting = [w for w in self._workers.values() if w.stream_id is None]
                if not self._needs_attention():
                    self._wake.wait(self._next_check(starting))
                if self.state == TERMINATE:
                    return
                stalled = self._pending and self._gate.stalled(self._pending[0].func_id)
                replies = self._dispatch() if stalled else []
                lost, self._lost = list(self._lost), deque()
                # workers that died before connecting: backend status is the only witness
                lost += [w for w in starting if w.process.exitcode is not None and w.id in self._workers]
                unreachable = self._none_connected_in_time(starting)
            for worker in lost:
                self._handle_loss(worker)
            _send(replies)
            if unreachable:
                self._fail_everything(RuntimeError(self._broken))
            self._start_missing_workers()
            self._feed()
            with self._lock:
                if self.state == CLOSE and self._all_done():
                    for worker in self._workers.values():
                        worker.retiring = True
                    replies = [r for w in list(self._workers.values()) for r in self._retire_if_done(w)]
                else:
                    replies = []
                if self.state == CLOSE and not self._workers:
                    return
            _send(replies)

    def _next_check(self, starting: list[Worker]) -> float | None:
        """How long the manager may sleep unwoken: it watches starting workers, and a gate holding chunks."""
        waits = [0.5] if starting else []
        if self._gate.is_holding() and self._pending:
            waits.append(self._gate.patience(self._pending[0].func_id))
        return min(waits, default=None)

    def startup_limit(self) -> float:
        """Seconds a started worker may take to connect before it counts as unable to start."""
        config = get_config()
        # a job on a cluster may first wait to be scheduled, which the backend bounds itself
        return config.start_timeout + (0 if self._local else config.schedule_timeout)

    def _none_connected_in_time(self, starting: list[Worker]) -> bool:
        """Whether no worker runs and none of those started has connected within the
        time a job may take (with the lock held): the pool is then broken, not slow."""
        if self._broken or not starting or len(starting) < len(self._workers):
            return False
        limit = self.startup_limit()
        oldest = min(w.started_at for w in starting)
        if time.monotonic() - oldest < limit:
            return False
        self._broken = (f"no pool worker has connected to this process at {self._listener.address} in {limit:.0f} s "
                        f"(start_timeout): the workers cannot start or cannot reach it; see the log above")
        return True

    def _needs_attention(self) -> bool:
        active = sum(1 for w in self._workers.values() if not w.retiring)
        feedable = any(lazy.submission.wants_more for lazy in self._lazy) and len(self._pending) < self._watermark()
        return bool(self._lost) or (self.state == RUN and active < self.target_size and not self._broken) \
            or feedable or self.state == TERMINATE \
            or (self.state == CLOSE and self._all_done() and any(not w.retiring for w in self._workers.values()))

    def _watermark(self) -> int:
        return 2 * self._prefetch * max(1, self.target_size)

    def _all_done(self) -> bool:
        return not self._pending and not self._lazy and not any(w.inflight for w in self._workers.values())

    def _handle_loss(self, worker: Worker) -> None:
        exitcode = worker.process.exitcode
        if exitcode is None:
            worker.process.join(2.0)
            exitcode = worker.process.exitcode
        failed = []
        lost = worker.process.job_lost
        with self._lock:
            if self._workers.pop(worker.id, None) is None:
                return
            self._by_stream.pop(worker.stream_id, None)
            if worker.parked is not None:
                worker.parked.claim()  # nobody is left to answer
                worker.parked = None
            self._classify(worker)
            inflight = list(worker.inflight)
            if inflight:
                self._working -= 1
            worker.inflight.clear()
            if inflight:
                # only the chunk it was running is charged, and not when the worker was killed with
                # others from outside (its fork server killed): chunks it merely held (the rest of its
                # batch, or one sent as it died) are rerun free
                suspect = inflight[0] if inflight[0].id == worker.running and not lost else None
                if suspect is not None:
                    suspect.crashes += 1
                    if suspect.crashes >= self._max_crashes:
                        failed.append((suspect, f"was running each of the {suspect.crashes} times a worker died"))
                        inflight = inflight[1:]
                elif worker.loading is not None and worker.loading not in self._loaded and not lost:
                    # dying while loading a function no worker has loaded yet is the function's.  Every
                    # worker may be loading it at once, and a storm of kills takes loaders before any is
                    # done (seen: 3 in a row on a loaded 2-core host): its chunks fail once max_task_crashes
                    # times as many workers as the pool has died loading it, as many as the chunks of a
                    # function that kills whoever runs it may cost
                    func = worker.loading
                    deaths = self._load_deaths[func] = self._load_deaths.get(func, 0) + 1
                    if deaths >= self._max_crashes * max(1, self.target_size):
                        why = f"needs a function that {deaths} workers died loading, and none has loaded"
                        failed += [(c, why) for c in (*inflight, *self._pending) if c.func_id == func]
                        inflight = [c for c in inflight if c.func_id != func]
                        self._pending = deque(c for c in self._pending if c.func_id != func)
                self._pending.extendleft(reversed(inflight))
                self._counts["in_flight"] -= sum(c.count for c in inflight) + sum(c.count for c, _ in failed)
                self._counts["resubmitted"] += sum(c.count for c in inflight)
                self._counts["failed"] += sum(c.count for c, _ in failed)
            expected = worker.retiring and not inflight and not failed and exitcode == 0
            if not expected:
                self._counts["restarts"] += 1
                if not worker.asked and not lost:
                    if worker.started_at > self._startup_death_at:
                        # workers dying together (their host lost, the local fork server killed) count
                        # once: only one started after the last counted death shows the start failing again
                        self._startup_deaths += 1
                        self._startup_death_at = time.monotonic()
                    error = worker.process.job_error
                    connected = any(w.stream_id is not None for w in self._workers.values())
                    if error and not connected:
                        # the cluster will not run the job (no such image, never scheduled) and no worker
                        # runs: waiting for a retry would only hang the caller as long again
                        self._broken = f"pool workers cannot start: {error}"
                    elif self._startup_deaths >= MAX_STARTUP_DEATHS:
                        self._broken = (f"pool workers keep dying before taking any task (last exit code "
                                        f"{exitcode}); is the initializer failing? See the log above")
            replies = self._dispatch()
        if not expected:
            log.warning("pool worker %s (pid %s) died with exit code %s%s", worker.process.name,
                        worker.process.pid, exitcode,
                        f"; resubmitting {sum(c.count for c in inflight)} task(s)" if inflight else "")
        for chunk, why in failed:
            chunk.submission.fail(chunk.start, chunk.count, WorkerLostError(
                f"{chunk.name()} {why} (last exit code {exitcode}); not retried again"))
        if self._broken:
            self._fail_everything(RuntimeError(self._broken))
        _send(replies)

    def _worker_nice(self) -> int:
        """How much lower than this process local workers run when they outnumber the cores:
        the master, the run's servers and connections being set up then get the CPU at once.
        Measured: 1024 ES workers on 2 cores at the same priority starved the parameter
        server, whose handshakes then outlasted their 10 s."""
        if self.target_size <= cpu_count() or resolve_name(get_config().backend) != "local":
            return 0
        return OVERSUBSCRIBED_NICE

    def _start_missing_workers(self) -> None:
        while True:
            with self._lock:
                active = sum(1 for w in self._workers.values() if not w.retiring)
                if self.state != RUN or self._broken or active >= self.target_size:
                    return
                worker_id = next(self._worker_ids)
                process = Process(target=run_worker, name=f"PoolWorker-{worker_id}", daemon=True,
                                  args=(self._listener.address, worker_id, self._initializer,
                                        self._initargs, self._worker_nice()))
                process._resources = self._worker_resources
                self._workers[worker_id] = Worker(worker_id, process)
            try:
                process.start()
            except Exception as exc:
                with self._lock:
                    self._workers.pop(worker_id, None)
                    self._broken = f"cannot start pool workers: {exc}"
                self._fail_everything(RuntimeError(self._broken))
                return

    def _feed(self) -> None:
        """Pull lazy input while workers could use more (runs user iterators, so not under the lock)."""
        for lazy in list(self._lazy):
            while lazy.submission.wants_more and len(self._pending) < self._watermark():
                items, exhausted, error = [], False, None
                try:
                    for _ in range(lazy.chunksize):
                        items.append(next(lazy.iterator))
                except StopIteration:
                    exhausted = True
                except Exception as exc:
                    exhausted, error = True, exc
                if error is not None:
                    # a chunk's results come together, so the input's error takes the place of
                    # the chunk it broke off, as in multiprocessing: what that chunk had read is dropped
                    items = []
                first = lazy.next_index
                lazy.next_index += len(items)
                chunks = self.make_chunks(lazy.submission, lazy.func_id, lazy.star, items, lazy.chunksize, first)
                if error is not None:
                    lazy.submission.fail(lazy.next_index, 1, error)
                    lazy.next_index += 1
                lazy.submission.submitted(lazy.next_index - first, exhausted)
                with self._lock:
                    self._pending.extend(chunks)
                    replies = self._dispatch()
                    if exhausted:
                        self._lazy.remove(lazy)
                _send(replies)
                if exhausted:
                    break

    # --- ending -------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self.state == RUN:
                self.state = CLOSE
            self._wake.notify_all()

    def join(self) -> None:
        self._manager.join()
        for worker in list(self._workers.values()):
            worker.process.join()
        self._listener.close()
        self.pump.close()

    def terminate(self) -> None:
        with self._lock:
            if self.state == TERMINATE:
                return
            self.state = TERMINATE
            self._wake.notify_all()
        self._manager.join(30)  # no worker is being started after this
        with self._lock:
            # started ones (a container or a Slurm job has no pid)
            workers = [w for w in self._workers.values() if w.process._job is not None]
        for worker in workers:
            worker.process.kill()
        for worker in workers:
            worker.process.join(10)
        self._fail_everything(PoolTerminated("the pool was terminated before this result arrived"))
        self._listener.close()
        self.pump.close()

    def _fail_everything(self, error: BaseException) -> None:
        with self._lock:
            chunks = list(self._pending) + [c for w in self._workers.values() for c in w.inflight]
            self._pending.clear()
            lazies, self._lazy = self._lazy, []
        for chunk in chunks:
            chunk.submission.fail(chunk.start, chunk.count, error)
        for lazy in lazies:
            lazy.submission.fail(lazy.next_index, 1, error)
            lazy.submission.submitted(1, True)

    def resize(self, size: int) -> None:
        with self._lock:
            self.target_size = size
            active = [w for w in self._workers.values() if not w.retiring]
            # retire the least busy first
            for worker in sorted(active, key=lambda w: len(w.inflight))[:max(0, len(active) - size)]:
                worker.retiring = True
                self._classify(worker)
            replies = [r for w in list(self._workers.values()) for r in self._retire_if_done(w)]
            self._wake.notify_all()
        _send(replies)

    def statistics(self) -> PoolStatistics:
        with self._lock:
            workers = list(self._workers.values())
            return PoolStatistics(
                workers_alive=sum(1 for w in workers if w.stream_id is not None),
                workers_starting=sum(1 for w in workers if w.stream_id is None),
                tasks_pending=sum(c.count for c in self._pending),
                tasks_in_flight=self._counts["in_flight"],
                tasks_done=self._counts["done"],
                tasks_failed=self._counts["failed"],
                tasks_resubmitted=self._counts["resubmitted"],
                worker_restarts=self._counts["restarts"],
            )


def _send(replies) -> None:
    for request, status, parts in replies:
        request.reply(status, *parts)


def _pop_chunk(inflight: deque, chunk_id: int):
    if inflight and inflight[0].id == chunk_id:
        return inflight.popleft()
    for chunk in inflight:
        if chunk.id == chunk_id:
            inflight.remove(chunk)
            return chunk
    return None


def _deliver(chunk: Chunk, ok: bool, blob) -> None:
    try:
        payload = wire.loads(blob)
    except Exception as exc:
        chunk.submission.fail(chunk.start, chunk.count,
                       TypeError(f"the result of {chunk.name()} could not be unpickled here: {exc!r}"))
        return
    if ok:
        chunk.submission.deliver(chunk.start, payload)
    else:
        exc, tb = payload
        chunk.submission.fail(chunk.start, chunk.count, with_remote_traceback(exc, tb))


def _picklable(obj) -> bool:
    try:
        cloudpickle.dumps(obj)
        return True
    except Exception:
        return False
