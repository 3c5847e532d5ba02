"""``BaseManager``, ``SyncManager`` and ``AsyncManager``.

A manager's server is a job-backed process, so it runs on whichever backend
is configured, and every connection to it proves the run's secret like any
other.  ``register(typeid, callable)`` adds a method that creates an object
in the server and returns its proxy.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import time
import weakref

from ..config import get_config
from ..processes.process import Process
from ..primitives.queues import Queue
from .protocol import M_COUNT, M_DEBUG_INFO, M_SHUTDOWN
from .proxy import BaseProxy, ManagerError, ManagerRef, create
from .server import serve
from .sync_types import (
    CONTAINER_RESULTS,
    POOL_RESULTS,
    SYNC_TYPES,
    AsyncResultProxy,
    BatchesProxy,
    IteratorProxy,
    PoolProxy,
    _pool,
)

log = logging.getLogger("fiberrl")

# how long a shut-down server gets to exit before it is killed
SHUTDOWN_GRACE = 5.0


class BaseManager:
    """Starts a server process holding shared objects; hands out proxies to them."""

    _registry: dict = {}  # typeid -> (callable, exposed, method_to_typeid, proxytype)
    _inline = False       # serve calls on the receiving thread (AsyncManager)
    _async = False        # proxies return handles
    batch_scheduling = False  # run the server under SCHED_BATCH (see AsyncManager)
    _counter = itertools.count(1)

    def __init__(self, address=None, authkey=None, serializer="pickle", ctx=None):
        if address is not None or authkey is not None:
            raise ValueError(f"{type(self).__name__} starts its own server as a job and authenticates it with the "
                             f"run's secret: leave address and authkey unset")
        self._process: Process | None = None
        self._ref: ManagerRef | None = None
        self._initializer = None
        self._initargs = ()
        self._finalizer = None
        self._name = f"{type(self).__name__}-{next(BaseManager._counter)}"

    @classmethod
    def register(cls, typeid: str, callable=None, proxytype=None, exposed=None, method_to_typeid=None,  # noqa: A002
                 create_method: bool = True) -> None:
        """Make ``typeid`` creatable in this manager class's servers: ``callable(*args)`` builds it."""
        if "_registry" not in cls.__dict__:
            cls._registry = dict(cls._registry)  # a subclass's registrations stay its own
        if proxytype is not None and not (isinstance(proxytype, type) and issubclass(proxytype, BaseProxy)):
            raise TypeError(f"register({typeid!r}): proxytype must be a BaseProxy subclass, not {proxytype!r}")
        exposed = tuple(exposed) if exposed is not None else getattr(proxytype, "_exposed_", None)
        cls._registry[typeid] = (callable, exposed, dict(method_to_typeid or {}), proxytype)
        if create_method:
            def create_object(self, *args, **kwds):
                return self._create(typeid, args, kwds)
            create_object.__name__ = typeid
            setattr(cls, typeid, create_object)

    # --- lifecycle -------------------------------------------------------
    def start(self, initializer=None, initargs=()) -> None:
        """Start the server process; ``initializer(*initargs)`` runs in it first."""
        if self._process is not None:
            raise ValueError(f"{self._name} has already been started")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        self._initializer, self._initargs = initializer, tuple(initargs)
        self._launch()

    def _launch(self) -> None:
        # a typeid without a callable is still one of methods' results (method_to_typeid)
        registry = {typeid: (fn, exposed, m2t) for typeid, (fn, exposed, m2t, _) in self._registry.items()}
        proxytypes = {typeid: entry[3] for typeid, entry in self._registry.items()}
        ready = Queue()
        process = Process(target=_serve_with_initializer, name=self._name, daemon=True,
                          args=(registry, self._inline, self.batch_scheduling, ready, self._initializer,
                                self._initargs))
        process.start()
        self._process = process
        address = _await_address(process, ready, get_config().start_timeout)
        where = f"pid {process.pid}" if process.pid is not None else f"job {process.job_id}"
        self._ref = ManagerRef(address, f"{self._name} ({where})", proxytypes, self._async)
        self._finalizer = weakref.finalize(self, _stop_server, process, self._ref)

    def shutdown(self) -> None:
        """Stop the server; its objects are gone and their proxies raise ManagerError."""
        if self._finalizer is not None:
            self._finalizer()

    def join(self, timeout: float | None = None) -> None:
        if self._process is not None:
            self._process.join(timeout)

    @property
    def address(self) -> str | None:
        return self._ref.address if self._ref is not None else None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def unheard(self) -> bool:
        """Whether its server's job has gone unheard past ``silence_timeout`` (``Process.unheard``):
        its host cut off or stalled, so that calls to it may never be answered."""
        return self._process is not None and self._process.unheard()

    def _number_of_objects(self) -> int:
        """How many objects the server holds (for tests and debugging)."""
        return self._ref.request(M_COUNT, 0)

    def _debug_info(self) -> str:
        """What the server holds, an object and its count of proxies each (for debugging)."""
        return self._ref.request(M_DEBUG_INFO, 0)

    def __enter__(self):
        if self._process is None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def _create(self, typeid: str, args: tuple, kwds: dict):
        if self._process is None:
            self.start()  # Fiber's examples use a manager without start()
        elif self._finalizer is not None and not self._finalizer.alive:
            raise ValueError(f"{self._name} has been shut down")
        return create(self._ref, typeid, args, kwds, manager=self)

    def __repr__(self):
        state = "not started" if self._process is None else ("running" if self.is_alive() else "stopped")
        return f"<{type(self).__name__} {self._name} {state}>"


def _serve_with_initializer(registry, inline, batch_scheduling, ready, initializer, initargs) -> None:
    if batch_scheduling:
        _schedule_as_batch()
    if initializer is not None:
        initializer(*initargs)
    serve(registry, inline, ready)


def _schedule_as_batch() -> None:
    """Run this process under Linux's SCHED_BATCH: a call that wakes it does
    not preempt whatever runs on its core, so a caller sharing the host, in the
    middle of sending calls to many servers, finishes sending before they run.
    Measured on 2 cores: up to 14% more env steps/s with 2 to 8 env servers
    (Breakout with 2: no difference).  Any process may lower itself to it;
    where the platform has no such policy, or a sandbox refuses it, the server
    runs as it is."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, policy, os.sched_param(0))


def _await_address(process: Process, ready: Queue, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ready.get(timeout=0.25)
        except queue.Empty:
            pass
        if process.exitcode is not None:
            raise ManagerError(f"the manager process {process.name} exited with code {process.exitcode} before "
                               f"it was ready (its error is in the log above)")
        if time.monotonic() > deadline:
            process.kill()
            process.join(SHUTDOWN_GRACE)
            raise ManagerError(f"the manager process {process.name} was not ready within {timeout} s "
                               f"(config start_timeout)")


def _stop_server(process: Process, ref: ManagerRef) -> None:
    if process.exitcode is None:
        log.info("sending shutdown message to manager")
        try:
            ref.request(M_SHUTDOWN, 0, timeout=SHUTDOWN_GRACE)
        except (ManagerError, TimeoutError):
            pass
        process.join(SHUTDOWN_GRACE)
    if process.exitcode is None:
        process.kill()
        process.join(SHUTDOWN_GRACE)


class SyncManager(BaseManager):
    """A manager with multiprocessing's shared types: dict, list, Namespace,
    Value, Array, Queue, Lock, RLock, Semaphore, Condition, Event, Barrier."""


for _typeid, (_callable, _proxytype) in SYNC_TYPES.items():
    SyncManager.register(_typeid, _callable, _proxytype,
                         method_to_typeid=CONTAINER_RESULTS if _typeid in ("dict", "list") else None)
SyncManager.register("Batches", proxytype=BatchesProxy, create_method=False)
SyncManager.register("Pool", _pool, PoolProxy, method_to_typeid=POOL_RESULTS)
SyncManager.register("AsyncResult", proxytype=AsyncResultProxy, create_method=False)
SyncManager.register("Iterator", proxytype=IteratorProxy, exposed=("__next__", "next"), create_method=False)


class AsyncManager(BaseManager):
    """A manager whose proxies return a :class:`Handle` from every call at once.

    Replies are matched to calls by request, so handles can be collected in
    any order and many managers stepped in parallel.  Calls are served one at
    a time in the order they arrive.  When the server dies, pending and later
    calls raise ManagerError; :meth:`restart` starts a fresh one.

    Its server runs under SCHED_BATCH on Linux (it and the processes it starts):
    its calls are throughput work for a caller that sends many at once, and
    arriving calls should not preempt that caller.  A subclass whose calls are
    latency-critical sets ``batch_scheduling = False``.
    """

    _inline = True
    _async = True
    batch_scheduling = True

    def restart(self, cut_off: bool = False) -> None:
        """Replace the server process (killing it if it still runs) with a new, empty one.
        ``cut_off``: the old one is given up for lost (``Process.cut_off``), not asked to stop:
        its host is cut off or stalled, and it must not come back beside the new one."""
        if self._process is None:
            raise ValueError(f"{self._name} was never started")
        if self._finalizer is not None:
            self._finalizer.detach()
        if not cut_off:
            _stop_server(self._process, self._ref)
        elif self._process.exitcode is None:  # nothing to ask it: it would not hear
            try:
                self._process.cut_off()
            except Exception as exc:  # noqa: BLE001 -- the backend cannot reach it either: its lifeline ends it
                log.warning("could not kill the job of cut-off manager %s: %s", self._name, exc)
            self._process.join(SHUTDOWN_GRACE)
        self._process = None
        self._launch()


def Manager() -> SyncManager:  # noqa: N802 -- the multiprocessing name
    """A started SyncManager, as ``multiprocessing.Manager()`` returns."""
    manager = SyncManager()
    manager.start()
    return manager
