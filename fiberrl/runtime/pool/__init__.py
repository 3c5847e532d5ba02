"""A fault-tolerant ``multiprocessing.Pool`` on job-backed workers."""
from .api import Pool
from .results import AsyncResult, IMapIterator, PoolTerminated, RemoteTraceback, TimeoutError, WorkerLostError
from .scheduler import PoolStatistics

__all__ = ["AsyncResult", "IMapIterator", "Pool", "PoolStatistics", "PoolTerminated", "RemoteTraceback",
           "TimeoutError", "WorkerLostError"]
