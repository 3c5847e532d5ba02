"""A process's side of its managers' streams: one stream per thread and
server, and the releases of the proxies it let go, sent before its next call.

A manager's own process holds proxies too (a pool's callback, a proxy stored
in a shared dict) but never calls: its server sends them as it serves
(``server.ManagerServer``).
"""
from __future__ import annotations

import os
import threading
from collections import deque

from ..net.calls import CallStream
from ..net.errors import LinkError
from .protocol import M_DECREF

_local = threading.local()


def _forget_streams() -> None:
    """In a forked child: the parent's streams are the parent's."""
    _local.__dict__.clear()


os.register_at_fork(after_in_child=_forget_streams)


def connection(address: str, server: str) -> CallStream:
    """This thread's live connection to the server ``server`` at ``address``: one
    per thread, so a call that blocks in the server holds up no other thread.
    Keyed by the server too: a new server may be given a dead one's port, and a
    connection to the dead one may not have noticed yet."""
    conns = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
    key = (address, server)
    conn = conns.get(key)
    if conn is None or conn.error is not None:
        conn = conns[key] = CallStream(address)
    return conn


# Releases are queued by finalizers, which may run inside any code that holds
# a lock, and sent before the next request of this process: never from the finalizer.
pending_releases: deque = deque()


def queue_release(address: str, server: str, token: int) -> None:
    pending_releases.append((address, server, token))


def send_releases(own_address: str | None = None, release_own=None) -> None:
    """Send the releases queued in this process; in a manager's process, those of
    its own server (at ``own_address``) go to ``release_own(token)`` instead."""
    while pending_releases:
        try:
            address, server, token = pending_releases.popleft()
        except IndexError:
            return  # another thread sent the last one
        if address == own_address:
            release_own(token)
            continue
        try:
            connection(address, server).call(M_DECREF, token, reply=False)
        except (LinkError, PermissionError):
            pass  # the manager went away: nothing left to release
