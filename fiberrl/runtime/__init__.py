"""fiberrl.runtime: the ``multiprocessing`` API, with every process a job on
a cluster backend.  ``import fiberrl.runtime as mp`` and run ordinary
multiprocessing code.

Importing opens no socket, starts no thread and reads no configuration.
"""
from .backends.forkserver import set_forkserver_preload
from .config import ConfigError, RuntimeConfig, configure, get_config
from .connection import Connection, Pipe
from .managers import AsyncManager, BaseManager, Manager, ManagerError, SyncManager
from .meta import meta
from .pool import AsyncResult, Pool, PoolTerminated, WorkerLostError
from .process import Process, active_children, cpu_count, current_process, parent_process
from .queues import Empty, Full, Queue, SimpleQueue
from .ring import Ring, RingError
from .transport import PeerGone

__all__ = [
    "AsyncManager", "AsyncResult", "BaseManager", "ConfigError", "Connection", "Empty", "Full", "Manager",
    "ManagerError", "PeerGone", "Pipe", "Pool", "PoolTerminated", "Process", "Queue", "Ring", "RingError",
    "RuntimeConfig", "SimpleQueue", "SyncManager", "WorkerLostError", "active_children", "configure", "cpu_count",
    "current_process", "get_config", "meta", "parent_process", "set_forkserver_preload",
]
