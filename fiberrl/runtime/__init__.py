"""fiberrl.runtime: the ``multiprocessing`` API, with every process a job on
a cluster backend.  ``import fiberrl.runtime as mp`` and run ordinary
multiprocessing code.

The primitives are in ``primitives/`` (and ``pool/``, ``managers/``);
``connection``, ``queues``, ``synchronize`` and ``sharedctypes`` here are
``multiprocessing``'s module names for them.  Importing opens no socket,
starts no thread and reads no configuration.
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
from .primitives.ring import Ring, RingError
from .primitives.synchronize import JoinableQueue
from .processes.fork_server import install as _install_fork_server
from .processes.fork_server import set_forkserver_preload
from .processes.children import active_children
from .processes.process import Process, cpu_count, current_process, parent_process
from .queues import Empty, Full, Queue, SimpleQueue
from .sharedctypes import Array, RawArray, RawValue, Value
from .synchronize import Barrier, BoundedSemaphore, Condition, Event, Lock, RLock, Semaphore

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

# How jobs start is settled here, with the API (every start method is spawn: ``context``): a local job
# of the child command is forked from a warm fork server (setting ``local_fork_server``), which the
# local backend is given now.  That registers a class; the server starts with the first local job.
_install_fork_server()
