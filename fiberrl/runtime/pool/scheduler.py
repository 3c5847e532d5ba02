"""The master side of a Pool, as a state machine under one lock: RUN, then
CLOSE (no more tasks; workers end once everything is done) or TERMINATE
(workers killed, results not yet in failed); it takes tasks, answers the
workers' requests and keeps the statistics.

Each worker talks to the pool over one authenticated stream
(:mod:`fiberrl.runtime.net.stream`, messages in :mod:`.protocol`): its job's
link to this process, which carries the pool's messages too
(``parent_link.CARRY``), or one of its own where it has no such link.  The
pool's :class:`StreamPump` reads them all and runs :meth:`Scheduler.handle`
on the workers' requests, on the thread of a caller waiting for a result
when there is one; a stream that ends is a worker lost.  Every decision is
the dispatch policy's (:mod:`.dispatch`), taken under the lock; the
workers' lifecycle (:mod:`.lifecycle`) runs on one manager thread.

All state is under one lock; replies are sent, and results unpickled and
delivered, after it is released.
"""
from __future__ import annotations

import itertools
import math
import threading
import time
from dataclasses import dataclass

from ..backends import listen_host, resolve_name
from ..config import get_config
from ..net import wire
from ..net.errors import LinkError
from ..net.listener import Listener
from ..net.stream import Stream
from ..net.stream_pump import StreamPump
from ..processes.hub import get_hub
from ..processes.parent_link import ChildLink
from .cpu_gate import CpuGate, usable_cores
from .dispatch import CLOSE, RUN, TERMINATE, DispatchPolicy
from .lifecycle import OVERSUBSCRIBED_NICE, WorkerLifecycle
from .protocol import (
    CHUNK_ID,
    CLOSED,
    OK,
    REPORT,
    W_GET,
    W_HELLO,
    W_LEAVE,
    W_LOAD,
    W_RESULT,
    W_RESULT_GET,
    W_START,
    WORKER_ID,
    WorkerRequest,
    send_replies,
)
from .results import PoolTerminated
from .tasks import Chunk, LazyInput, TaskEncoder, deliver

# CLOSE, RUN, TERMINATE and LazyInput as the API imports them; OVERSUBSCRIBED_NICE where experiments read it
__all__ = ["CLOSE", "OVERSUBSCRIBED_NICE", "RUN", "TERMINATE", "LazyInput", "PoolStatistics", "Scheduler"]


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
    workers_preempted: int = 0
    """workers that left when told to (SIGTERM), their work handed to others: not restarts"""
    tasks_backed_up: int = 0
    """tasks also given to a second worker as a backup (``backup_tasks``)"""
    backups_first: int = 0
    """of those, tasks whose backup's result came first"""
    workers_cut_off: int = 0
    """workers unheard for ``silence_timeout`` (their host partitioned or stalled), given up and
    replaced, their work handed to others: not restarts"""


class Scheduler:
    def __init__(self, size: int, initializer, initargs, maxtasksperchild,
                 prefetch: int, max_task_crashes: int, worker_resources: dict, backup_tasks: bool = False):
        self.lock = threading.Lock()
        self.wake_condition = threading.Condition(self.lock)
        self.tasks = TaskEncoder()
        local = resolve_name(get_config().backend) == "local"
        per_core = get_config().local_cpu_bound_per_core
        gate = CpuGate(max(1, round(per_core * usable_cores())) if local and per_core else 0)
        self.policy = DispatchPolicy(size, prefetch, maxtasksperchild, max_task_crashes, gate, self.tasks.blobs,
                                     self.wake_condition.notify_all, backup_tasks)
        self._stream_ids = itertools.count(1)
        self._streams: dict[int, Stream] = {}  # the workers' streams by id, until they end
        # when each stream was last read: a worker sending results is heard, and skips its heartbeats
        # (processes.lifeline.spoke), so the silence check counts both
        self.heard: dict[int, float] = {}
        self._links: dict[int, ChildLink] = {}  # the workers' jobs' links that carry the pool, by stream id
        self.pump = StreamPump(self._on_frames, self._on_stream_closed, "fiberrl-pool-io")
        self._listener = Listener(listen_host(), self._serve_worker, hand_off=True, name="pool")
        self._hub = get_hub()
        self._hub.carry(self._listener.address, self._take_link)
        self._lifecycle = WorkerLifecycle(self, initializer, initargs, worker_resources, local)
        self._lifecycle.start()

    @property
    def state(self) -> str:
        return self.policy.state

    @property
    def target_size(self) -> int:
        return self.policy.target_size

    @property
    def address(self) -> str:
        """Where workers connect to this pool."""
        return self._listener.address

    def startup_limit(self) -> float:
        """Seconds a started worker may take to connect before it counts as unable to start."""
        return self._lifecycle.startup_limit()

    # --- submitting -------------------------------------------------------
    def submit(self, chunks: list[Chunk]) -> None:
        with self.lock:
            self.check_running()
            replies = self.policy.add_chunks(chunks)
        send_replies(replies)

    def submit_lazy(self, lazy: LazyInput) -> None:
        with self.lock:
            self.check_running()
            self.policy.lazy.append(lazy)
            self.wake_condition.notify_all()

    def wake(self) -> None:
        with self.lock:
            self.wake_condition.notify_all()

    def check_running(self) -> None:
        if self.policy.state != RUN:
            raise ValueError("Pool not running")
        if self.policy.broken:
            raise RuntimeError(self.policy.broken)

    # --- the workers' requests (on whichever thread reads the streams) ------
    def _serve_worker(self, stream: Stream) -> None:
        stream_id = next(self._stream_ids)
        self._streams[stream_id] = stream
        self.pump.add(stream, stream_id)

    def _take_link(self, stream: Stream, link: ChildLink):
        """A worker's job's link, carrying the pool from now on: read here, as a worker's stream."""
        stream_id = next(self._stream_ids)
        self._streams[stream_id] = stream
        self._links[stream_id] = link
        self.pump.add(stream, stream_id)
        return lambda: self.hang_up(stream_id)

    def hang_up(self, stream_id: int) -> None:
        """End a worker's stream from this side: the worker is lost, and what it sends after is never read."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            self.pump.drop(stream, stream_id)

    def unheard_since(self, stream_id: int, since: float) -> bool:
        """Whether the worker of ``stream_id`` has not spoken over it since ``since``: nothing read, nor
        waiting to be read (the master too busy to read must not take it for silent, as
        ``parent_link._last_heard``)."""
        if self.heard.get(stream_id, -math.inf) >= since:
            return False
        stream = self._streams.get(stream_id)
        try:
            return stream is None or not stream.readable(0)
        except (OSError, ValueError, LinkError):  # closed meanwhile: its end is being handled
            return True

    def _on_frames(self, stream: Stream, stream_id: int, frames) -> None:
        self.heard[stream_id] = now = time.monotonic()
        link = self._links.get(stream_id)
        if link is not None:
            link.heard = now
        for frame in frames:
            if link is not None and frame and frame[0] < W_HELLO:  # the job's own, over its link
                self._hub.answer_link(stream, link, [frame])
            else:
                self.handle(WorkerRequest(stream, stream_id, frame))

    def _on_stream_closed(self, _stream: Stream, stream_id: int) -> None:
        self._streams.pop(stream_id, None)
        self.heard.pop(stream_id, None)
        link = self._links.pop(stream_id, None)
        if link is not None:
            self._hub.link_ended(link)
        with self.lock:
            self.policy.stream_ended(stream_id)

    def handle(self, request: WorkerRequest) -> None:
        op = request.op
        if op == W_START:
            chunk_id = CHUNK_ID.unpack_from(request.body)[0]
            with self.lock:
                self.policy.started(request.stream_id, chunk_id)
        elif op == W_LOAD:
            with self.lock:
                self.policy.loading(request.stream_id)
        elif op == W_RESULT or op == W_RESULT_GET:
            self._on_results(request, op == W_RESULT_GET)
        elif op == W_GET:
            # with a body: asked for more as it started its last chunk
            chunk_id = CHUNK_ID.unpack_from(request.body)[0] if request.body else None
            with self.lock:
                if chunk_id is not None:
                    self.policy.started(request.stream_id, chunk_id)
                replies = self.policy.park(request)
            send_replies(replies)
        elif op == W_LEAVE:
            with self.lock:
                replies = self.policy.leave(request.stream_id)
            send_replies(replies)
        elif op == W_HELLO:
            worker_id = WORKER_ID.unpack_from(request.body)[0]
            with self.lock:
                known = self.policy.hello(request.stream_id, worker_id)
            request.reply(OK if known else CLOSED)
        else:
            request.reply(CLOSED)

    def _on_results(self, request: WorkerRequest, ask: bool) -> None:
        parts = wire.split(request.body)
        reports = REPORT.iter_unpack(parts[0])
        delivered = []
        with self.lock:
            replies = self.policy.results(request, reports, parts[1:], delivered, ask)
        # sending under the lock would hold every other stream's reader and the submitters behind
        # this worker's socket; each request is answered once (WorkerRequest.claim), so whichever
        # thread sends it, and when, cannot answer it twice.  The worker's next work goes first:
        # unpickling results may take a while, and a callback as long as its caller likes, so they
        # wait until this worker's stream (its link: its pings) is read again
        send_replies(replies)
        if delivered:
            self.pump.later(lambda: [deliver(chunk, ok, blob) for chunk, ok, blob in delivered])

    # --- ending -------------------------------------------------------------
    def close(self) -> None:
        with self.lock:
            if self.policy.state == RUN:
                self.policy.state = CLOSE
            self.wake_condition.notify_all()

    def join(self) -> None:
        self._lifecycle.join()
        for worker in list(self.policy.workers.values()):
            worker.process.join()
        self._stop_listening()

    def _stop_listening(self) -> None:
        self._hub.stop_carrying(self._listener.address)
        self._listener.close()
        self.pump.close()
        for link in list(self._links.values()):  # closed with the pump, unreported
            self._hub.link_ended(link)
        self._links.clear()

    def terminate(self) -> None:
        with self.lock:
            if self.policy.state == TERMINATE:
                return
            self.policy.state = TERMINATE
            self.wake_condition.notify_all()
        self._lifecycle.join(30)  # no worker is being started after this
        with self.lock:
            # started ones (a container or a Slurm job has no pid)
            workers = [w for w in self.policy.workers.values() if w.process._job is not None]
        for worker in workers:
            worker.process.kill()
        for worker in workers:
            worker.process.join(10)
        self.fail_everything(PoolTerminated("the pool was terminated before this result arrived"))
        self._stop_listening()

    def fail_everything(self, error: BaseException) -> None:
        with self.lock:
            chunks, lazies = self.policy.take_everything()
        for chunk in chunks:
            chunk.submission.fail(chunk.start, chunk.count, error)
        for lazy in lazies:
            lazy.submission.fail(lazy.next_index, 1, error)
            lazy.submission.submitted(1, True)

    def resize(self, size: int) -> None:
        with self.lock:
            replies = self.policy.resize(size)
            self.wake_condition.notify_all()
        send_replies(replies)

    def statistics(self) -> PoolStatistics:
        with self.lock:
            policy = self.policy
            workers = list(policy.workers.values())
            return PoolStatistics(
                workers_alive=sum(1 for w in workers if w.stream_id is not None),
                workers_starting=sum(1 for w in workers if w.stream_id is None),
                tasks_pending=sum(c.count for c in policy.pending),
                tasks_in_flight=policy.counts["in_flight"],
                tasks_done=policy.counts["done"],
                tasks_failed=policy.counts["failed"],
                tasks_resubmitted=policy.counts["resubmitted"],
                worker_restarts=policy.counts["restarts"],
                workers_preempted=policy.counts["preempted"],
                workers_cut_off=policy.counts["cut_off"],
                tasks_backed_up=policy.counts["backups"],
                backups_first=policy.counts["backups_first"],
            )
