"""fiberrl.runtime: the ``multiprocessing`` API, with every process a job on
a cluster backend.  ``import fiberrl.runtime as mp`` and run ordinary
multiprocessing code.

Importing opens no socket, starts no thread and reads no configuration.
"""
from .config import ConfigError, RuntimeConfig, configure, get_config
from .connection import Connection, Pipe
from .meta import meta
from .pool import AsyncResult, Pool, PoolTerminated, WorkerLostError
from .process import Process, active_children, cpu_count, current_process, parent_process
from .queues import Empty, Full, Queue, SimpleQueue
from .transport import PeerGone

__all__ = [
    "AsyncResult", "ConfigError", "Connection", "Empty", "Full", "PeerGone", "Pipe", "Pool", "PoolTerminated",
    "Process", "Queue", "RuntimeConfig", "WorkerLostError",
    "SimpleQueue", "active_children", "configure", "cpu_count", "current_process", "get_config", "meta",
    "parent_process",
]
