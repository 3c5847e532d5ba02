"""``Pool`` with the ``multiprocessing.Pool`` API, on job-backed workers.

Beyond multiprocessing: a worker that dies costs nothing (its tasks go to
others and a new worker replaces it), work starts as soon as the first
worker is up, ``resize(n)`` changes the number of workers while it runs,
``imap`` pulls its input lazily, and ``statistics()`` shows what it is doing.
"""
from __future__ import annotations

import atexit
import time
from dataclasses import dataclass
import warnings
import weakref
from multiprocessing import pool as mp_pool

from ..meta import resources_of
from ..processes.process import _register_exit_hook, cpu_count
from .results import AsyncResult, IMapIterator, TimeoutError
from .dispatch import CLOSE, RUN, TERMINATE
from .scheduler import PoolStatistics, Scheduler
from .tasks import LazyInput


class Pool:
    def __init__(self, processes: int | None = None, initializer=None, initargs=(), maxtasksperchild=None,
                 cluster=None, *, prefetch: int = 2, max_task_crashes: int | None = None,
                 worker_resources: dict | None = None, error_handling: bool | None = None,
                 retry_exceptions=None, max_task_retries: int = 3, backup_tasks: bool = False):
        """``prefetch``: chunks a worker holds at once (the running one
        included); ``max_task_crashes``: how many times a task may be running
        when its worker dies before it fails with WorkerLostError (default 3);
        ``worker_resources``: dict(cpu=, gpu=, mem=) for each worker's job
        (default: the initializer's ``@meta``).  Fiber's arguments:
        ``cluster`` must be None; ``error_handling`` True (Fiber's
        ResilientZPool, this pool's default) resubmits the tasks of a worker
        that dies, False (Fiber's ZPool) fails them with WorkerLostError.
        ``retry_exceptions``: a task that raises fails its map, as in
        multiprocessing, unless this says to run it again (in the worker
        where it raised, up to ``max_task_retries`` more times): True (any
        ``Exception``), an exception type or a tuple of them; Fiber's
        explicit ``error_handling=True`` means True, as Fiber's own tests
        expect (its workers died with a raising task, which then ran again).
        ``backup_tasks``: once no task waits, a worker that asks for work runs
        a copy of a chunk another worker still runs (the longest running
        first; MapReduce's backup tasks, Spark's speculation), and the first
        result is kept: a slow host then no longer sets the pace of a map's
        end.  A task may then run twice (its result is delivered once), so
        it is off by default; a task's side effects must bear it."""
        if cluster is not None:
            raise ValueError(f"Pool(cluster={cluster!r}): Fiber's cluster argument has no meaning in fiberrl; "
                             f"leave it None and pick the backend with configure(backend=...)")
        max_task_crashes = _crashes_allowed(error_handling, max_task_crashes)
        self._retry = _retries(error_handling, retry_exceptions, max_task_retries)
        processes = cpu_count() if processes is None else processes
        if processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if maxtasksperchild is not None and (not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0):
            raise ValueError("maxtasksperchild must be a positive int or None")
        if prefetch < 1 or max_task_crashes < 1:
            raise ValueError("prefetch and max_task_crashes must be at least 1")
        resources = worker_resources if worker_resources is not None else resources_of(initializer)
        self._scheduler = Scheduler(processes, initializer, tuple(initargs),
                                    maxtasksperchild, prefetch, max_task_crashes, resources, bool(backup_tasks))
        _live_pools.add(self)
        _register_pool_exit_hook()
        # a pool dropped without terminate() takes its workers with it, as in multiprocessing
        self._finalizer = weakref.finalize(self, self._scheduler.terminate)
        # multiprocessing's attribute and values: code reads pool._state to tell whether a
        # pool still runs, and __del__ warns by it
        self._state = mp_pool.RUN

    # --- submitting ---------------------------------------------------------
    def _job(self, func, items: list, chunksize: int, star: bool, submission) -> None:
        scheduler = self._scheduler
        if scheduler.state != RUN:
            raise ValueError("Pool not running")
        func_id = _function_id(scheduler, self._retrying(func), submission)
        scheduler.submit(scheduler.tasks.make_chunks(submission, func_id, star, items, chunksize))

    def _retrying(self, func):
        """``func`` as the workers run it: run again after what ``retry_exceptions`` names."""
        return func if self._retry is None else _Retrying(func, *self._retry)

    def _chunksize(self, n: int, chunksize: int | None) -> int:
        if chunksize is None:
            # multiprocessing's rule: about four chunks per worker
            chunksize, extra = divmod(n, self._scheduler.target_size * 4)
            if extra:
                chunksize += 1
        if chunksize < 1:
            raise ValueError(f"chunksize must be at least 1, not {chunksize}")
        return max(1, chunksize)

    def apply_async(self, func, args=(), kwds=None, callback=None, error_callback=None) -> AsyncResult:
        result = AsyncResult(1, f"apply({_name(func)})", True, callback, error_callback, self._scheduler.pump)
        call = func if not kwds else _CallWithKeywords(func, kwds)
        self._job(call, [tuple(args)], 1, True, result)
        return result

    def apply(self, func, args=(), kwds=None):
        return self.apply_async(func, args, kwds).get()

    def _map_async(self, func, iterable, chunksize, star, callback, error_callback, kind) -> AsyncResult:
        items = list(iterable)
        result = AsyncResult(len(items), f"{kind}({_name(func)})", False, callback, error_callback,
                             self._scheduler.pump)
        if items:
            self._job(func, items, self._chunksize(len(items), chunksize), star, result)
        return result

    def map_async(self, func, iterable, chunksize=None, callback=None, error_callback=None) -> AsyncResult:
        return self._map_async(func, iterable, chunksize, False, callback, error_callback, "map")

    def map(self, func, iterable, chunksize=None) -> list:
        return self.map_async(func, iterable, chunksize).get()

    def starmap_async(self, func, iterable, chunksize=None, callback=None, error_callback=None) -> AsyncResult:
        return self._map_async(func, (tuple(a) for a in iterable), chunksize, True, callback, error_callback,
                               "starmap")

    def starmap(self, func, iterable, chunksize=None) -> list:
        return self.starmap_async(func, iterable, chunksize).get()

    def _imap(self, func, iterable, chunksize, ordered: bool) -> IMapIterator:
        if chunksize < 1:
            raise ValueError(f"chunksize must be at least 1, not {chunksize}")
        scheduler = self._scheduler
        if scheduler.state != RUN:
            raise ValueError("Pool not running")
        lookahead = 2 * scheduler.policy.watermark() * chunksize
        submission = IMapIterator(f"{'imap' if ordered else 'imap_unordered'}({_name(func)})", ordered, lookahead)
        submission.on_consumed = scheduler.wake
        func_id = _function_id(scheduler, self._retrying(func), submission)
        scheduler.submit_lazy(LazyInput(submission, iter(iterable), chunksize, func_id, False))
        return submission

    def imap(self, func, iterable, chunksize: int = 1) -> IMapIterator:
        """Results in input order; the input is read only as workers can take it."""
        return self._imap(func, iterable, chunksize, True)

    def imap_unordered(self, func, iterable, chunksize: int = 1) -> IMapIterator:
        return self._imap(func, iterable, chunksize, False)

    # --- running ------------------------------------------------------------
    def resize(self, processes: int) -> None:
        """Grow or shrink the pool while it runs; leaving workers finish what they hold."""
        if processes < 1:
            raise ValueError("Number of processes must be at least 1")
        self._scheduler.resize(processes)

    def statistics(self) -> PoolStatistics:
        return self._scheduler.statistics()

    def start_workers(self) -> None:
        """Fiber's ``start_workers()``: this pool starts its workers when it is made, so nothing is left to do."""
        if self._scheduler.state != RUN:
            raise ValueError("Pool not running")

    def wait_until_workers_up(self, timeout: float | None = None) -> None:
        """Fiber's ``wait_until_workers_up()``: block until every worker has connected.
        ``timeout`` None waits as long as a worker may take to start (start_timeout,
        plus schedule_timeout off the local backend); TimeoutError past it."""
        scheduler = self._scheduler
        limit = scheduler.startup_limit() if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            scheduler.check_running()
            alive = scheduler.statistics().workers_alive
            if alive >= scheduler.target_size:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{alive} of the pool's {scheduler.target_size} workers connected in {limit:.0f} s; "
                                   f"see the log for why the others did not start")
            time.sleep(0.05)

    def close(self) -> None:
        """No more tasks; workers exit once everything submitted is done."""
        self._scheduler.close()
        if self._state == mp_pool.RUN:
            self._state = mp_pool.CLOSE

    def terminate(self) -> None:
        """Stop every worker now; results not yet delivered fail with PoolTerminated."""
        self._state = mp_pool.TERMINATE
        if self._scheduler.state != TERMINATE:
            self._finalizer()

    def join(self) -> None:
        if self._scheduler.state == RUN:
            raise ValueError("Pool is still running; close() or terminate() it first")
        if self._scheduler.state == CLOSE:
            self._scheduler.join()

    def __enter__(self):
        if self._scheduler.state != RUN:
            raise ValueError("Pool not running")
        return self

    def __exit__(self, *exc):
        self.terminate()

    def __repr__(self):
        return f"<fiberrl Pool state={self._scheduler.state} workers={self._scheduler.target_size}>"

    def __del__(self):
        # a pool made by a failed __init__ has no _state, and nothing to warn of
        if getattr(self, "_state", None) == mp_pool.RUN:
            # the text multiprocessing's warning starts with, which warning filters match
            warnings.warn(f"unclosed running multiprocessing pool {self!r}: its workers are killed now; "
                          f"close() and join(), or terminate(), a pool once done with it",
                          ResourceWarning, source=self)


_live_pools: "weakref.WeakSet[Pool]" = weakref.WeakSet()
_pool_hook_registered = False


def _register_pool_exit_hook() -> None:
    global _pool_hook_registered
    if not _pool_hook_registered:
        _pool_hook_registered = True
        _register_exit_hook()  # registered first, so the hook below runs before it
        atexit.register(_terminate_live_pools)


def _terminate_live_pools() -> None:
    """At exit, as multiprocessing does: pools still open are terminated
    before their workers are, so nobody mourns or replaces the workers."""
    for pool in list(_live_pools):
        pool.terminate()


def _crashes_allowed(error_handling, max_task_crashes: int | None) -> int:
    """``max_task_crashes`` as Fiber's ``error_handling`` asks: without it a task whose worker dies fails at once."""
    if error_handling not in (None, True, False):
        raise ValueError(f"Pool(error_handling={error_handling!r}): must be True (resubmit the tasks of a worker "
                         f"that dies), False (fail them) or None (the default, True)")
    if error_handling is not None and not error_handling:
        if max_task_crashes not in (None, 1):
            raise ValueError(f"Pool(error_handling=False, max_task_crashes={max_task_crashes}): error_handling=False "
                             f"means max_task_crashes=1; give one of them")
        return 1
    return 3 if max_task_crashes is None else max_task_crashes


def _retries(error_handling, retry_exceptions, max_task_retries: int) -> tuple[tuple, int] | None:
    """(the exception types a task is run again after, how many times more), or None: it fails."""
    if retry_exceptions is None:
        retry_exceptions = error_handling is True
    if retry_exceptions is False:
        return None
    if isinstance(max_task_retries, bool) or not isinstance(max_task_retries, int) or max_task_retries < 1:
        raise ValueError(f"Pool(max_task_retries={max_task_retries!r}): must be an int >= 1")
    if retry_exceptions is True:
        return (Exception,), max_task_retries
    kinds = retry_exceptions if isinstance(retry_exceptions, tuple) else (retry_exceptions,)
    if not kinds or not all(isinstance(k, type) and issubclass(k, BaseException) for k in kinds):
        raise ValueError(f"Pool(retry_exceptions={retry_exceptions!r}): must be True, False, an exception type "
                         f"or a tuple of them")
    return kinds, max_task_retries


@dataclass(frozen=True)
class _Retrying:
    """``func``, run again where it raised one of ``kinds``, up to ``retries`` more times."""
    func: object
    kinds: tuple
    retries: int

    def __call__(self, *args):
        for attempt in range(self.retries + 1):
            try:
                return self.func(*args)
            except self.kinds as exc:
                if attempt == self.retries:
                    exc.add_note(f"it raised in each of its {attempt + 1} tries (Pool's max_task_retries="
                                 f"{self.retries})")
                    raise


class _CallWithKeywords:
    """``func(*args, **kwds)`` as a picklable callable."""

    def __init__(self, func, kwds):
        self.func, self.kwds = func, dict(kwds)

    def __call__(self, *args):
        return self.func(*args, **self.kwds)


def _function_id(scheduler: Scheduler, func, submission) -> int:
    try:
        return scheduler.tasks.function_id(func)
    except Exception as exc:
        # the pickler's own exception, as multiprocessing gives it: code catches its type
        exc.add_note(f"{submission.description}: the function cannot be pickled")
        raise


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__name__


__all__ = ["Pool"]
