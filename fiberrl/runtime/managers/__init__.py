"""Managers: objects held by a server process, used through proxies."""
from .manager import AsyncManager, BaseManager, Manager, SyncManager
from .proxy import BaseProxy, Handle, ManagerError
from .sync_types import Namespace

__all__ = ["AsyncManager", "BaseManager", "BaseProxy", "Handle", "Manager", "ManagerError", "Namespace",
           "SyncManager"]
