"""The manager's server: runs in the manager's job-backed process and holds
the shared objects; proxies in any process of the run call their methods.

Each thread of a client process talks to the server over a stream of its
own (:mod:`fiberrl.runtime.net.stream`), served by a thread of its own, as
``multiprocessing`` gives each a connection: calls run in the order sent,
on the thread that read them (no hop), and a blocking call (a
``Lock.acquire``, a ``Queue.get``) holds up only its caller.  An inline
server (AsyncManager) also runs calls one at a time, whichever stream sent
them.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import traceback

from ..backends import listen_host
from ..net import wire
from ..net.calls import CALL_ID, HEAD
from ..net.errors import LinkError
from ..net.listener import Listener
from ..net.stream import Stream
from .client import pending_releases, send_releases
from .protocol import (GETVALUE, M_CALL, M_COUNT, M_CREATE, M_DEBUG_INFO, M_DECREF, M_INCREF, M_SHUTDOWN, PROXY, RAISE,
                       RETURN)

log = logging.getLogger("fiberrl")


def public_methods(obj) -> tuple:
    """What a proxy of ``obj`` exposes when its typeid did not say."""
    return tuple(name for name in dir(obj) if not name.startswith("_") and callable(getattr(obj, name, None)))


class Entry:
    __slots__ = ("obj", "refs", "exposed", "method_to_typeid")

    def __init__(self, obj, exposed, method_to_typeid):
        self.obj = obj
        self.refs = 1
        self.exposed = frozenset(exposed)
        self.method_to_typeid = method_to_typeid or {}


class ManagerServer:
    """Serves the manager's streams: one thread reads each connected process's calls."""

    def __init__(self, registry: dict, inline: bool):
        self._registry = registry  # typeid -> (callable, exposed, method_to_typeid)
        self._objects: dict[int, Entry] = {}
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        # inline calls run one at a time, whichever stream sent them; others on their stream's thread
        self._call_lock = threading.Lock() if inline else contextlib.nullcontext()
        self.stopped = threading.Event()
        self.address: str | None = None  # the listener's, once it listens
        # releases of proxies held in this process (a pool's callback, a proxy stored in a
        # shared dict): a client sends its own before its next call, but this process
        # never calls, so its server sends them as it serves
        self._held_releases = pending_releases

    def serve(self, stream: Stream) -> None:
        """Serve one stream (one thread of a client process) until it closes."""
        held_releases = self._held_releases
        while True:
            frame = stream.recv()
            if held_releases:  # let go of on another thread (a pool's): before a count sees them
                self._release_held()
            op, call_id, token = HEAD.unpack_from(frame)
            payload = memoryview(frame)[HEAD.size:]
            if op == M_CALL or op == M_CREATE:
                with self._call_lock:
                    self._run(stream, call_id, op, token, payload)
            elif op == M_DECREF:
                self._change_refs(token, -1)  # one-way: nothing to answer
            elif op == M_INCREF:
                _reply(stream, call_id, (RETURN, self._change_refs(token, 1)))
            elif op == M_COUNT:
                _reply(stream, call_id, (RETURN, len(self._objects)))
            elif op == M_DEBUG_INFO:
                _reply(stream, call_id, (RETURN, self._debug_info()))
            elif op == M_SHUTDOWN:
                _reply(stream, call_id, (RETURN, None))
                self.stopped.set()
            else:
                _reply(stream, call_id, (RAISE, (ValueError(f"unknown manager op {op}"), "")))
            if held_releases:  # let go of by this call: before this stream's next one
                self._release_held()

    def _release_held(self) -> None:
        send_releases(self.address, self._release_own)

    def _release_own(self, token: int) -> None:
        self._change_refs(token, -1)

    def _run(self, stream: Stream, call_id: int, op: int, token: int, payload) -> None:
        try:
            reply = self._create(*wire.loads(payload)) if op == M_CREATE else self._call(token, *wire.loads(payload))
        except BaseException as exc:  # noqa: BLE001 -- the caller's error, whatever it is
            reply = (RAISE, _portable_error(exc))
        _reply(stream, call_id, reply)

    # --- objects --------------------------------------------------------
    def _create(self, typeid: str, args: tuple, kwargs: dict):
        try:
            factory, exposed, method_to_typeid = self._registry[typeid]
        except KeyError:
            raise KeyError(f"no typeid {typeid!r} is registered with this manager") from None
        if factory is None:
            raise TypeError(f"{typeid!r} is registered without a callable: only a method's result is of it")
        obj = factory(*args, **kwargs)
        return (PROXY, self._store(obj, exposed, method_to_typeid) + (typeid,))

    def _debug_info(self) -> str:
        """The objects held, a line each with its count of proxies (multiprocessing's form)."""
        with self._lock:
            held = list(self._objects.items())
        return "\n".join(f"  {token}:       refcount={entry.refs}\n    {_shown(entry.obj)}" for token, entry in held)

    def _store(self, obj, exposed, method_to_typeid) -> tuple:
        exposed = tuple(exposed) if exposed is not None else public_methods(obj)
        entry = Entry(obj, exposed, method_to_typeid)
        with self._lock:
            token = next(self._tokens)
            self._objects[token] = entry
        return token, exposed

    def _call(self, token: int, method: str, args: tuple, kwargs: dict):
        entry = self._objects.get(token)
        if entry is None:
            raise ReferenceError(f"object {token} no longer exists in this manager (every proxy of it was "
                                 f"released, or the manager was restarted)")
        if method == GETVALUE:
            return (RETURN, entry.obj)
        if method not in entry.exposed:
            raise AttributeError(f"method {method!r} of {type(entry.obj).__name__} is not exposed by its proxy")
        result = getattr(entry.obj, method)(*args, **kwargs)
        typeid = entry.method_to_typeid.get(method)
        if typeid is None:
            return (RETURN, result)
        _factory, exposed, method_to_typeid = self._registry[typeid]
        return (PROXY, self._store(result, exposed, method_to_typeid) + (typeid,))

    def _change_refs(self, token: int, delta: int) -> bool:
        with self._lock:
            entry = self._objects.get(token)
            if entry is None:
                return False
            entry.refs += delta
            if entry.refs <= 0:
                del self._objects[token]
        return True

    def close(self) -> None:
        with self._lock:
            self._objects.clear()


def _reply(stream: Stream, call_id: int, reply: tuple) -> None:
    try:
        parts = wire.dumps(reply)
    except Exception as exc:
        parts = wire.dumps((RAISE, _portable_error(TypeError(f"the result could not be pickled: {exc!r}"))))
    try:
        stream.send([CALL_ID.pack(call_id), *parts])
    except LinkError:
        pass  # the caller went away


def _portable_error(exc: BaseException) -> tuple:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        wire.dumps(exc)
        return exc, tb
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc} (the exception could not be pickled)"), tb


def _shown(obj) -> str:
    try:
        return str(obj)[:75]
    except Exception as exc:  # noqa: BLE001 -- the user's __str__
        return f"<{type(obj).__name__}: str() failed: {exc!r}>"


def serve(registry: dict, inline: bool, address_queue) -> None:
    """The manager process's target: serve on a stream listener, say where, run until shut down."""
    server = ManagerServer(registry, inline)
    listener = Listener(listen_host(), server.serve, name="manager")
    server.address = listener.address
    log.info("manager serving at %r", listener.address)
    address_queue.put(listener.address)
    server.stopped.wait()
    log.info("manager shutting down")
    listener.close()
    server.close()
