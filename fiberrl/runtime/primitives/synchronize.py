"""``multiprocessing``'s module-level synchronisation objects (``Lock``,
``Event``, ``Barrier``...) for processes that may run on other hosts.

They cannot live in shared memory, so they live in one ``SyncManager`` that
this process starts the first time it makes one (a job on the configured
backend, stopped at exit), and each is a proxy of it: pass it to a
``Process`` or a pool's ``initargs`` as with ``multiprocessing``.  Each
operation is a round trip to the manager.  The shared ``Value`` and
``Array`` (:mod:`.sharedctypes`) live in the same manager.
"""
from __future__ import annotations

import os
import threading

from ..managers import SyncManager

_manager: SyncManager | None = None
_manager_pid: int | None = None
_manager_lock = threading.Lock()


def shared_objects_manager() -> SyncManager:
    """This process's manager for its shared objects, started on first use."""
    global _manager, _manager_pid
    with _manager_lock:
        if _manager is None or _manager_pid != os.getpid():
            manager = SyncManager()
            manager.start()
            # children the program never joined may still use its objects as it exits: it
            # stops after them (stop_children), not with the other daemonic children
            manager._finalizer.atexit = False
            manager._process._stop_after_children = shutdown_manager
            _manager, _manager_pid = manager, os.getpid()
        return _manager


def shutdown_manager() -> None:
    """Stop this process's manager now rather than at exit; its objects are gone."""
    global _manager
    with _manager_lock:
        manager, _manager = _manager, None
    if manager is not None and _manager_pid == os.getpid():
        manager.shutdown()


def Lock():  # noqa: N802 -- multiprocessing's names, here and below
    return shared_objects_manager().Lock()


def RLock():  # noqa: N802
    return shared_objects_manager().RLock()


def Semaphore(value: int = 1):  # noqa: N802
    return shared_objects_manager().Semaphore(value)


def BoundedSemaphore(value: int = 1):  # noqa: N802
    return shared_objects_manager().BoundedSemaphore(value)


def Event():  # noqa: N802
    return shared_objects_manager().Event()


def Condition(lock=None):  # noqa: N802
    manager = shared_objects_manager()
    if lock is not None and getattr(getattr(lock, "_ref", None), "address", None) != manager.address:
        raise TypeError(f"Condition(lock) needs a lock made by fiberrl.runtime.Lock() or RLock() in this "
                        f"process (one the condition's manager holds), not {lock!r}; or call Condition() "
                        f"and use the condition itself as the lock")
    return manager.Condition(lock)


def Barrier(parties: int, action=None, timeout: float | None = None):  # noqa: N802
    return shared_objects_manager().Barrier(parties, action, timeout)


def JoinableQueue(maxsize: int = 0):  # noqa: N802
    return shared_objects_manager().JoinableQueue(maxsize)
