"""The loop every pool worker runs.

The master's reply to a request for work carries a batch of chunks (up to
its prefetch) and says whether more work is waiting.  Results of a batch's
chunks are sent as soon as each is done, without an answer.  When no more
work was waiting, the result of the last chunk travels in the worker's next
request for work, which the master parks until it has more.  When more was
waiting, the worker asks for its next batch as it starts its last chunk, so
that the batch arrives while that chunk runs and the worker never waits on
the master between chunks.  Chunks run one after another in the order
received.  The worker says when it starts each (W_START, unanswered, or in
that request for more), so that a death is charged to the chunk it was
running and to no other: chunks a worker only held, received or still on
their way when it died, are rerun free.  Before it loads a function it has
not run yet it says so too (W_LOAD): a death while loading a function no
worker has loaded yet is the function's, not the chunk's.  Told to stop
(SIGTERM), it starts no other chunk and leaves as :mod:`.preemption` says.
The messages and their frames: :mod:`.protocol`.
"""
from __future__ import annotations

import math
import os
import sys
import time
import traceback

from ..config import get_config
from ..net import wire
from ..net.errors import LinkError
from ..net.dial import connect
from ..processes.lifeline import beat_less_often, heard_from_parent, spoke
from ..processes.parent_link import job_link
from .preemption import Preemption
from .protocol import CHUNK, CHUNK_ID, OK, REPORT, W_GET, W_HELLO, W_LOAD, W_RESULT, W_RESULT_GET, W_START, WORKER_ID

# how long a thread of an oversubscribed worker waits for the GIL before it asks for it (Python's default
# is 5 ms).  A worker's other threads (its lifeline) wait for the GIL while the task's thread holds it, and
# among hundreds of runnable workers per core the holder runs only now and then: at 5 ms each waiter woke
# 100-200 times a second, in every worker.  Measured, ES on BipedalWalker, 1024 workers on 2 cores:
# 6 million context switches and 46 s of kernel time an iteration at 5 ms, 0.3 million and 7 s at 0.1 s
OVERSUBSCRIBED_SWITCH_INTERVAL = 0.1
# seconds between an oversubscribed local worker's checks of its parent: 1024 workers checking once a
# second, each a cold process woken and answered, made an ES iteration on BipedalWalker on 2 cores take
# 29.9 s instead of 28.6 s, and 39.4 s instead of 30.0 s where every worker had a task at once
OVERSUBSCRIBED_HEARTBEAT = 10.0


def encode_error(exc: BaseException) -> bytearray:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        return wire.encode((exc, tb))
    except Exception:
        # the exception itself cannot travel: send what it said
        return wire.encode((RuntimeError(f"{type(exc).__name__}: {exc} (the exception could not be pickled)"), tb))


def load_function(blob):
    try:
        return wire.loads(blob)
    except Exception as exc:
        message = f"the task function could not be loaded in the worker: {exc!r}"

        def unloadable(*_args):
            raise RuntimeError(message)
        return unloadable


def run_chunk(func, args_blob, star: bool) -> tuple[bool, bytearray]:
    try:
        args_list = wire.loads(args_blob)
        values = [func(*args) for args in args_list] if star else [func(args) for args in args_list]
    except BaseException as exc:  # noqa: BLE001 -- a task's SystemExit is its error too
        return False, encode_error(exc)
    try:
        return True, wire.encode(values)
    except Exception as exc:
        return False, encode_error(TypeError(f"the result could not be pickled: {exc!r}"))


class ChunkClock:
    """A chunk's wall time and how much of it the worker's thread wanted a core (ran, or waited
    in the run queue) rather than slept on I/O or a lock: from Linux's per-thread schedstat,
    read through a file kept open (about 1 us a read)."""

    def __init__(self):
        try:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None
        self._wall = self._busy = 0.0

    def _busy_ns(self) -> int:
        on_cpu, waiting, _slices = os.pread(self._fd, 128, 0).split()
        return int(on_cpu) + int(waiting)

    def start(self) -> None:
        self._wall = time.perf_counter()
        self._busy = self._busy_ns() if self._fd is not None else 0

    def stop(self) -> tuple[float, float]:
        """(wall seconds, share of them spent running or runnable) since ``start``."""
        wall = time.perf_counter() - self._wall
        if self._fd is None or wall <= 0:
            return wall, math.nan
        return wall, min(1.0, (self._busy_ns() - self._busy) / 1e9 / wall)


def stream_to(master: str):
    """The worker's stream to its pool: its job's link to its parent, the pool's process, carrying
    the pool's messages too (the master then holds one stream a worker, not two); a stream of its
    own where its parent has no such pool or the worker is no job."""
    link = job_link()
    if link is not None:
        carried = link.carry(master, timeout=get_config().start_timeout)
        if carried is not None:
            return carried
    return connect(master)


def leave(stream) -> None:
    """Told to stop: ask once more and wait for the master's CLOSED, sent once it has handled
    everything sent before; a stream ending right after a result may be handled first, and the
    result refused as a lost worker's."""
    stream.send([bytes((W_GET,))])
    while stream.recv()[0] == OK:
        pass  # work it was given before the master heard it leaves: that went to others


def run_worker(master: str, worker_id: int, initializer, initargs, nice: int = 0) -> None:
    """``nice``: the workers outnumber the cores; run this much lower, with longer GIL turns."""
    if nice:
        try:
            os.nice(nice)
        except OSError:  # not allowed here: the worker runs as it is
            pass
        sys.setswitchinterval(OVERSUBSCRIBED_SWITCH_INTERVAL)
        beat_less_often(OVERSUBSCRIBED_HEARTBEAT)
    preemption = Preemption(get_config().preempt_grace)
    preemption.install()
    stream = stream_to(master)

    def ask(op: int, parts=()):
        stream.send([bytes((op,)), *parts])
        reply = stream.recv()
        heard_from_parent()  # its pool is its parent: no ping is needed meanwhile
        return reply[0], memoryview(reply)[1:]

    try:
        ask(W_HELLO, [WORKER_ID.pack(worker_id)])
        preemption.connected(stream)
        if initializer is not None:
            initializer(*initargs)
        funcs: dict[int, object] = {}
        clock = ChunkClock()
        status, payload = ask(W_GET)
        while status == OK:  # anything else: the master retires this worker
            parts = wire.split(payload)
            backlog = parts[0][0]
            batch = list(CHUNK.iter_unpack(parts[0][1:]))
            blobs = iter(parts[1:])
            for i, (chunk_id, func_id, has_func, star) in enumerate(batch):
                last = i + 1 == len(batch)
                # once told to stop it starts nothing more: the master gives what it holds to others
                if has_func:
                    if not preemption.send_unless_leaving([bytes((W_LOAD,)), CHUNK_ID.pack(chunk_id)]):
                        return leave(stream)
                    funcs[func_id] = load_function(next(blobs))
                # says it starts the chunk; asking for the next batch says so too, in one message
                start = bytes((W_GET if last and backlog else W_START,))
                if not preemption.send_unless_leaving([start, CHUNK_ID.pack(chunk_id)]):
                    return leave(stream)
                clock.start()
                ok, blob = run_chunk(funcs[func_id], next(blobs), star)
                report = wire.frames([REPORT.pack(chunk_id, ok, *clock.stop()), blob])
                if preemption.leaving:
                    stream.send([bytes((W_RESULT,)), *report])
                    return leave(stream)
                if last and not backlog:
                    status, payload = ask(W_RESULT_GET, report)
                else:
                    stream.send([bytes((W_RESULT,)), *report])
                spoke()  # its pool heard it: no heartbeat is needed meanwhile
            if backlog:
                reply = stream.recv()
                heard_from_parent()
                status, payload = reply[0], memoryview(reply)[1:]
    except LinkError:
        pass  # the master is gone; so is the work
    finally:
        stream.close()
