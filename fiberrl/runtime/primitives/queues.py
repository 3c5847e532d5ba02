"""``SimpleQueue`` and ``Queue`` with the ``multiprocessing`` API, shareable
by any number of processes of the run (pass them as arguments to children,
or through another queue).

Items are owned by the creating process.  A ``put`` from another process
into an unbounded queue is pipelined (it returns once sent, like
multiprocessing's feeder thread); ``join_thread()`` waits until the owner
has stored them all, and a job-backed process does so before it exits.
"""
from __future__ import annotations

import queue as _queue
import weakref

from ..processes.hub import current_hub
from .channel import Channel, ChannelRef, new_channel
from .dealing_channel import DealingChannel

Empty = _queue.Empty
Full = _queue.Full


class _QueueBase:
    def __init__(self, maxsize: int = 0, channel: Channel | None = None):
        if maxsize < 0:
            raise ValueError("maxsize must be >= 0 (0 means unbounded)")
        self._ref, _ = new_channel(maxsize, channel)
        self._maxsize = maxsize
        self._closed = False
        # the creator's handle keeps the items alive; when it is collected they go
        hub = current_hub()
        weakref.finalize(self, hub.unhost, self._ref.obj_id)

    def __reduce__(self):
        return _rebuild, (type(self), self._ref, self._maxsize)

    def _check_open(self):
        if self._closed:
            raise ValueError(f"{type(self).__name__} is closed")

    def put(self, obj, block: bool = True, timeout: float | None = None) -> None:
        self._check_open()
        self._ref.put(obj, timeout if block else 0.0)

    def get(self, block: bool = True, timeout: float | None = None):
        self._check_open()
        return self._ref.get(timeout if block else 0.0)

    def empty(self) -> bool:
        return self._ref.qsize() == 0

    def close(self) -> None:
        """This handle will not be used again (items already put stay)."""
        self._closed = True


class SimpleQueue(_QueueBase):
    def __init__(self):
        super().__init__(0)


class SimpleQueuePush(SimpleQueue):
    """Fiber's push queue: items are dealt to the readers in turn (see
    :mod:`.dealing_channel`), so readers that ask at different speeds still
    get equal shares."""

    def __init__(self):
        _QueueBase.__init__(self, 0, DealingChannel())


# Fiber's pull queue: each item to whichever reader asks first
SimpleQueuePull = SimpleQueue


class Queue(_QueueBase):
    def qsize(self) -> int:
        return self._ref.qsize()

    def full(self) -> bool:
        return 0 < self._maxsize <= self.qsize()

    def put_nowait(self, obj) -> None:
        self.put(obj, block=False)

    def get_nowait(self):
        return self.get(block=False)

    def join_thread(self) -> None:
        """Wait until every item this process put has reached the queue."""
        self._ref.flush()

    def cancel_join_thread(self) -> None:
        """Accepted for compatibility; a process still delivers its puts before exiting."""


def _rebuild(cls, ref: ChannelRef, maxsize: int):
    self = cls.__new__(cls)
    self._ref = ref
    self._maxsize = maxsize
    self._closed = False
    return self
