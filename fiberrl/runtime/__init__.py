"""fiberrl.runtime: the ``multiprocessing`` API, with every process a job on
a cluster backend.  ``import fiberrl.runtime as mp`` and run ordinary
multiprocessing code.

Importing opens no socket, starts no thread and reads no configuration.
"""
from .config import ConfigError, RuntimeConfig, configure, get_config, init
from .connection import Connection, Pipe
from .context import (
                      AuthenticationError,
                      BufferTooShort,
                      ProcessError,
                      freeze_support,
                      get_all_start_methods,
                      get_context,
                      get_logger,
                      get_start_method,
                      log_to_stderr,
                      set_start_method,
)
from .managers import AsyncManager, BaseManager, Manager, ManagerError, SyncManager
from .meta import meta
from .net.errors import LinkClosed, LinkError, PeerGone
from .pool import AsyncResult, Pool, PoolTerminated, TimeoutError, WorkerLostError
from .processes.fork_server import set_forkserver_preload
from .processes.process import Process, active_children, cpu_count, current_process, parent_process
from .queues import Empty, Full, Queue, SimpleQueue
from .ring import Ring, RingError
from .synchronize import (
                      Array,
                      Barrier,
                      BoundedSemaphore,
                      Condition,
                      Event,
                      JoinableQueue,
                      Lock,
                      RawArray,
                      RawValue,
                      RLock,
                      Semaphore,
                      Value,
)

__all__ = [
    "Array", "AsyncManager", "AsyncResult", "AuthenticationError", "Barrier", "BaseManager", "BoundedSemaphore",
    "BufferTooShort", "Condition", "ConfigError", "Connection", "Empty", "Event", "Full", "JoinableQueue", "LinkClosed",
    "LinkError", "Lock", "Manager", "ManagerError", "PeerGone", "Pipe", "Pool", "PoolTerminated", "Process",
    "ProcessError", "Queue", "RLock", "RawArray", "RawValue", "Ring", "RingError", "RuntimeConfig", "Semaphore",
    "SimpleQueue", "SyncManager", "TimeoutError", "Value", "WorkerLostError", "active_children", "configure",
    "cpu_count", "current_process", "freeze_support", "get_all_start_methods", "get_config", "get_context",
    "get_logger", "get_start_method", "init", "log_to_stderr", "meta", "parent_process", "set_forkserver_preload",
    "set_start_method",
]
