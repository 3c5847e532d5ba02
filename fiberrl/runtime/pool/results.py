"""What ``apply_async``/``map_async``/``imap`` return, filled in as chunks
of results arrive from the workers."""
from __future__ import annotations

import _thread
import builtins
import collections
import logging
import multiprocessing
import threading
from multiprocessing.pool import RemoteTraceback  # multiprocessing's own: code checks a cause's type


class WorkerLostError(RuntimeError):
    """A task was running each time its worker died, too many times to retry."""


class PoolTerminated(RuntimeError):
    """The pool was terminated before this result arrived."""


class TimeoutError(multiprocessing.TimeoutError, builtins.TimeoutError):  # noqa: A001 -- multiprocessing's name
    """A result not ready in time: caught as ``multiprocessing.TimeoutError``,
    as code written for it expects, and as the built-in ``TimeoutError``."""


def with_remote_traceback(exc: BaseException, tb: str | None) -> BaseException:
    if tb:
        exc.__cause__ = RemoteTraceback(f'\n"""\n{tb}"""')
    return exc


class Submission:
    """Base of every result object: ``n`` tasks delivered in chunks."""

    def __init__(self, n: int, description: str):
        self.n = n
        self.description = description

    def deliver(self, start: int, values: list) -> None:
        raise NotImplementedError

    def fail(self, start: int, count: int, error: BaseException) -> None:
        """Tasks ``start .. start+count`` failed together (one chunk)."""
        raise NotImplementedError

    @property
    def wants_more(self) -> bool:
        """Whether a lazy job may pull more input now (imap back-pressure)."""
        return True


class _Latch:
    """Set once, waking every waiter: an Event made of one bare lock, as one
    is made per task (Event builds a Condition in Python)."""

    __slots__ = ("_lock", "_set")

    def __init__(self):
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        if self._lock.acquire(True, -1 if timeout is None else max(0.0, timeout)):
            self._lock.release()  # for the next waiter
            return True
        return self._set


class AsyncResult(Submission):
    """Result of ``apply_async`` and ``map_async``, as in multiprocessing."""

    def __init__(self, n: int, description: str, single: bool, callback=None, error_callback=None, pump=None):
        """``pump``: the pool's StreamPump, read by a caller waiting here."""
        super().__init__(n, description)
        self._lock = threading.Lock()
        self._pump = pump
        self._single = single
        self._values: list = [None] * n
        self._missing = n
        self._error: BaseException | None = None
        self._callback = callback
        self._error_callback = error_callback
        self._event = _Latch()
        self._finished = False  # under self._lock: the one who sets it finishes
        if n == 0:
            self._finished = True
            self._finish()

    def ready(self) -> bool:
        return self._event.is_set()

    def successful(self) -> bool:
        if not self.ready():
            raise ValueError(f"{self.description} is not ready")
        return self._error is None

    def wait(self, timeout: float | None = None) -> None:
        self._wait(timeout)

    def _wait(self, timeout: float | None) -> bool:
        if self._event.is_set():
            return True
        pump = self._pump
        if pump is None:
            return self._event.wait(timeout)
        done = pump.wait(self._event.is_set, timeout)
        if done is not None:
            return done
        pump.waiting_on_another(1)
        try:
            return self._event.wait(timeout)
        finally:
            pump.waiting_on_another(-1)

    def get(self, timeout: float | None = None):
        if not self._wait(timeout):
            raise TimeoutError(f"{self.description} not ready after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._values[0] if self._single else self._values

    def deliver(self, start: int, values: list) -> None:
        with self._lock:
            if self._finished:
                return
            self._values[start:start + len(values)] = values
            self._missing -= len(values)
            if self._missing:
                return
            self._finished = True
        self._finish()

    def fail(self, start: int, count: int, error: BaseException) -> None:
        with self._lock:
            if self._finished:
                return
            self._error = error
            self._finished = True
        self._finish()

    def _finish(self) -> None:
        # callbacks before the event, as in multiprocessing: whoever wait()s or get()s
        # may count on what the callback did (appended the result somewhere)
        try:
            if self._error is None and self._callback is not None:
                self._callback(self._values[0] if self._single else self._values)
            elif self._error is not None and self._error_callback is not None:
                self._error_callback(self._error)
        except Exception:
            logging.getLogger("fiberrl.pool").exception("callback of %s raised", self.description)
        finally:
            self._event.set()  # even past a KeyboardInterrupt in the callback: nobody waits for ever
            if self._pump is not None:
                self._pump.result_ready()


class IMapIterator(Submission):
    """Lazy results of ``imap`` (in order) or ``imap_unordered``."""

    def __init__(self, description: str, ordered: bool, lookahead: int):
        super().__init__(-1, description)
        self._cond = threading.Condition()
        self._ordered = ordered
        self._lookahead = lookahead
        self._ready: dict[int, tuple] = {}
        self._arrivals: collections.deque = collections.deque()
        self._next = 0
        self._submitted = 0
        self._input_done = False
        self.on_consumed = None  # the pool's hook to pull more input

    # called by the pool's feeder
    def submitted(self, count: int, exhausted: bool) -> None:
        with self._cond:
            self._submitted += count
            self._input_done = exhausted
            self._cond.notify_all()

    @property
    def wants_more(self) -> bool:
        return not self._input_done and self._submitted - self._next < self._lookahead

    def deliver(self, start: int, values: list) -> None:
        self._store([(start + i, True, v, 1) for i, v in enumerate(values)])

    def fail(self, start: int, count: int, error: BaseException) -> None:
        # the chunk's error stands for all of its tasks, as in multiprocessing
        self._store([(start, False, error, count)])

    def _store(self, items) -> None:
        with self._cond:
            for index, ok, value, weight in items:
                if self._ordered:
                    self._ready[index] = (ok, value, weight)
                else:
                    self._arrivals.append((ok, value, weight))
            self._cond.notify_all()

    def __iter__(self):
        return self

    def next(self, timeout: float | None = None):
        with self._cond:
            def available():
                if self._ordered:
                    return self._next in self._ready
                return bool(self._arrivals)

            def finished():
                return self._input_done and self._next >= self._submitted

            if not self._cond.wait_for(lambda: available() or finished(), timeout):
                raise TimeoutError(f"{self.description}: no result after {timeout} s")
            if not available():
                raise StopIteration
            ok, value, weight = self._ready.pop(self._next) if self._ordered else self._arrivals.popleft()
            self._next += weight
        if self.on_consumed is not None:
            self.on_consumed()
        if not ok:
            raise value
        return value

    __next__ = next
