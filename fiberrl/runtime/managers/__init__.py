"""Managers: objects held by a server process, used through proxies.

``manager`` (the managers), ``server`` (what they run), ``proxy`` (a process's
handles on the objects), ``protocol`` (what proxies and server say),
``client`` (a process's streams to its managers and the releases it owes
them), ``sync_types`` (``SyncManager``'s types) and ``held_ctypes`` (shared
ctypes structures and char arrays)."""
from .manager import AsyncManager, BaseManager, Manager, SyncManager
from .proxy import BaseProxy, Handle, ManagerError
from .sync_types import Namespace

__all__ = ["AsyncManager", "BaseManager", "BaseProxy", "Handle", "Manager", "ManagerError", "Namespace",
           "SyncManager"]
