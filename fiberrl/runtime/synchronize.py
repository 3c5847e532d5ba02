"""Mirrors ``multiprocessing.synchronize``: re-exports :mod:`fiberrl.runtime.primitives.synchronize`."""
from .primitives.synchronize import Barrier, BoundedSemaphore, Condition, Event, Lock, RLock, Semaphore

__all__ = ["Barrier", "BoundedSemaphore", "Condition", "Event", "Lock", "RLock", "Semaphore"]
