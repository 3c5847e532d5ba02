"""The shared types of ``SyncManager`` (as in ``multiprocessing.managers``):
what the server holds, and the proxies that make them look local."""
from __future__ import annotations

import _thread
import array
import collections
import itertools
import os
import queue
import threading
import time

from .held_ctypes import HeldCtypes, HeldCtypesProxy
from .proxy import BaseProxy, forwarding

_CANCEL_GRACE = 10.0  # how long an interrupted wait waits for its cancellation to be sent


class Namespace:
    def __init__(self, **kwds):
        self.__dict__.update(kwds)

    def __repr__(self):
        items = ", ".join(f"{k}={v!r}" for k, v in sorted(self.__dict__.items()) if not k.startswith("_"))
        return f"Namespace({items})"


class Value:
    def __init__(self, typecode, value, lock=True):
        self._typecode = typecode
        self._value = value

    def get(self):
        return self._value

    def set(self, value):
        self._value = value

    def __repr__(self):
        return f"{type(self).__name__}({self._typecode!r}, {self._value!r})"


def Array(typecode, sequence, lock=True):  # noqa: N802 -- the multiprocessing name
    return array.array(typecode, sequence)


class Batches:
    """An iteration over a shared container, held by the server: a proxy takes its
    items a few at a time, so it sees the container as it is when it reaches them
    (a list changed ahead of it, a dict that changed size is an error), as
    multiprocessing's proxies do, without a round trip per item."""

    def __init__(self, iterator):
        self._iterator = iterator

    def take(self, n: int) -> list:
        return list(itertools.islice(self._iterator, n))


class SharedList(list):
    def iterate(self) -> Batches:
        return Batches(iter(self))

    def __reduce_ex__(self, protocol):
        return list, (list(self),)  # a copy (_getvalue()) is a list, as in multiprocessing


class SharedDict(dict):
    """A dict whose views travel as lists (a view cannot be pickled)."""

    def iterate(self) -> Batches:
        return Batches(iter(self))

    def __reduce_ex__(self, protocol):
        return dict, (dict(self),)

    def keys(self):
        return list(super().keys())

    def values(self):
        return list(super().values())

    def items(self):
        return list(super().items())


def shared_dict(*args, **kwds):
    return SharedDict(*args, **kwds)


@forwarding("__contains__", "__delitem__", "__getitem__", "__len__", "__setitem__", "clear", "copy", "get",
            "items", "keys", "pop", "popitem", "setdefault", "update", "values", also=("__repr__", "iterate"))
class DictProxy(BaseProxy):
    def __iter__(self):
        return _RemoteIteration(self._callmethod("iterate"))


@forwarding("__add__", "__contains__", "__delitem__", "__getitem__", "__len__", "__mul__", "__rmul__",
            "__setitem__", "append", "count", "extend", "index", "insert", "pop", "remove", "reverse", "sort",
            "copy", also=("__imul__", "__repr__", "iterate"))
class ListProxy(BaseProxy):
    def __iter__(self):
        return _RemoteIteration(self._callmethod("iterate"))

    def __iadd__(self, other):
        self._callmethod("extend", (other,))
        return self

    def __imul__(self, n):
        self._callmethod("__imul__", (n,))
        return self


class NamespaceProxy(BaseProxy):
    _exposed_ = ("__getattribute__", "__setattr__", "__delattr__", "__repr__")

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._callmethod("__getattribute__", (name,))

    def __setattr__(self, name, value):
        if name.startswith("_"):
            return object.__setattr__(self, name, value)
        return self._callmethod("__setattr__", (name, value))

    def __delattr__(self, name):
        if name.startswith("_"):
            return object.__delattr__(self, name)
        return self._callmethod("__delattr__", (name,))


@forwarding("get", "set", also=("__repr__",))
class ValueProxy(BaseProxy):
    value = property(lambda self: self.get(), lambda self, v: self.set(v))


@forwarding("__len__", "__getitem__", "__setitem__", "tolist", also=("__repr__",))
class ArrayProxy(BaseProxy):
    pass


@forwarding("release", also=("acquire",))
class AcquirerProxy(BaseProxy):
    def acquire(self, blocking: bool = True, timeout: float | None = None):
        # multiprocessing's locks take a timeout with blocking=False and ignore it; threading's refuse it
        # (a lock's "no timeout" is -1, a semaphore's None: pass only what was given)
        return self._callmethod("acquire", (blocking, timeout) if blocking and timeout is not None else (blocking,))

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


class ServedCondition(threading.Condition):
    """threading's Condition, whose wait a client may cancel: a proxy interrupted
    (Ctrl-C) as it waits cancels its wait, so the server's thread for that client
    takes the lock back and serves its next call (the ``with`` block's release) at
    once, as multiprocessing's Condition takes the lock back before the interrupt
    goes on.  The wait is threading's own, with its waiter kept by the caller's id."""

    def __init__(self, lock=None):
        super().__init__(lock)
        self._cancellable: dict = {}  # wait id -> its waiter
        self._cancelled: set = set()

    def cancellable_wait(self, timeout, wait_id) -> bool:
        if not self._is_owned():
            raise RuntimeError("cannot wait on un-acquired lock")
        waiter = _thread.allocate_lock()
        waiter.acquire()
        self._waiters.append(waiter)
        self._cancellable[wait_id] = waiter
        saved = self._release_save()
        notified = False
        try:
            notified = waiter.acquire(True, -1 if timeout is None else max(0.0, timeout))
            return notified and wait_id not in self._cancelled
        finally:
            self._acquire_restore(saved)
            self._cancellable.pop(wait_id, None)
            self._cancelled.discard(wait_id)
            if not notified:
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass

    def cancel_wait(self, wait_id) -> None:
        waiter = self._cancellable.get(wait_id)
        if waiter is None:
            return  # it has returned already
        self._cancelled.add(wait_id)
        try:
            waiter.release()
        except RuntimeError:
            return  # a notify released it first: that wait ends anyway
        try:
            self._waiters.remove(waiter)  # not counted by a later notify
        except ValueError:
            pass


@forwarding("notify", "notify_all", also=("cancellable_wait", "cancel_wait"))
class ConditionProxy(AcquirerProxy):
    def wait(self, timeout: float | None = None) -> bool:
        wait_id = os.urandom(8)
        try:
            return self._callmethod("cancellable_wait", (timeout, wait_id))
        except KeyboardInterrupt:
            # this thread's stream waits behind the server's wait: cancel it from another
            canceller = threading.Thread(target=self._callmethod, args=("cancel_wait", (wait_id,)),
                                         name="fiberrl-cancel-wait", daemon=True)
            canceller.start()
            canceller.join(_CANCEL_GRACE)
            raise

    def wait_for(self, predicate, timeout: float | None = None):
        """Wait until ``predicate()`` (run here, in the caller) is true, or
        ``timeout`` s have passed; its last value."""
        deadline = None if timeout is None else time.monotonic() + timeout
        result = predicate()
        while not result:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self.wait(left)
            result = predicate()
        return result


@forwarding("is_set", "set", "clear", "wait")
class EventProxy(BaseProxy):
    pass


@forwarding("wait", "abort", "reset", also=("__getattribute__",))
class BarrierProxy(BaseProxy):
    parties = property(lambda self: self._callmethod("__getattribute__", ("parties",)))
    n_waiting = property(lambda self: self._callmethod("__getattribute__", ("n_waiting",)))
    broken = property(lambda self: self._callmethod("__getattribute__", ("broken",)))


@forwarding("apply", "apply_async", "close", "imap", "imap_unordered", "join", "map", "map_async", "starmap",
            "starmap_async", "terminate")
class PoolProxy(BaseProxy):
    """A pool held by the manager (its workers are the manager's children), as
    multiprocessing's ``SyncManager.Pool``."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.terminate()


@forwarding("take")
class BatchesProxy(BaseProxy):
    pass


class _RemoteIteration:
    """The client's side of :class:`Batches`: one item, then batches growing to ``MOST``."""

    MOST = 256

    def __init__(self, batches: BatchesProxy):
        self._batches = batches
        self._buffered: collections.deque = collections.deque()
        self._next_batch = 1

    def __iter__(self):
        return self

    def __next__(self):
        if not self._buffered:
            if self._batches is None:
                raise StopIteration
            taken = self._batches.take(self._next_batch)
            if len(taken) < self._next_batch:
                self._batches = None  # exhausted: the server's iteration is let go
            self._next_batch = min(self._next_batch * 4, self.MOST)
            if not taken:
                raise StopIteration
            self._buffered.extend(taken)
        return self._buffered.popleft()


@forwarding("get", "wait", "ready", "successful")
class AsyncResultProxy(BaseProxy):
    pass


@forwarding("__next__")
class IteratorProxy(BaseProxy):
    def __iter__(self):
        return self

    def next(self, timeout: float | None = None):
        return self._callmethod("next", (timeout,))


def _pool(*args, **kwds):
    from ..pool import Pool  # imported in the manager's process, which runs the pool
    return Pool(*args, **kwds)


# an iteration over a shared dict or list stays in the manager, taken in batches
CONTAINER_RESULTS = {"iterate": "Batches"}

# what a manager's pool returns stays in the manager, reached through these proxies
POOL_RESULTS = {"apply_async": "AsyncResult", "map_async": "AsyncResult", "starmap_async": "AsyncResult",
                "imap": "Iterator", "imap_unordered": "Iterator"}

# typeid -> (callable, proxytype); a proxytype exposes its _exposed_, None all public methods
SYNC_TYPES = {
    "dict": (shared_dict, DictProxy),
    "list": (SharedList, ListProxy),
    "Namespace": (Namespace, NamespaceProxy),
    "Value": (Value, ValueProxy),
    "Array": (Array, ArrayProxy),
    "HeldCtypes": (HeldCtypes, HeldCtypesProxy),  # held_ctypes: shared ctypes that are not plain numbers
    "Lock": (threading.Lock, AcquirerProxy),
    "RLock": (threading.RLock, AcquirerProxy),
    "Semaphore": (threading.Semaphore, AcquirerProxy),
    "BoundedSemaphore": (threading.BoundedSemaphore, AcquirerProxy),
    "Condition": (ServedCondition, ConditionProxy),
    "Event": (threading.Event, EventProxy),
    "Barrier": (threading.Barrier, BarrierProxy),
    "Queue": (queue.Queue, None),
    "JoinableQueue": (queue.Queue, None),
}
