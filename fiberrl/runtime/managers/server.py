"""The manager's server: runs in the manager's job-backed process and holds
the shared objects; proxies in any process of the run call their methods.

Each process talks to the server over one authenticated stream
(:mod:`fiberrl.runtime.stream`).  A threaded server runs the calls of each
calling thread in order on a thread of their own, so a blocking call (a
``Lock.acquire``, a ``Queue.get``) only holds up its own caller, as with
``multiprocessing``.  An inline server runs every call, one at a time, on
the thread that read it: no thread hop, which is what an environment server
stepping one env per call wants.
"""
from __future__ import annotations

import functools
import itertools
import queue
import struct
import threading
import traceback

from .. import wire
from ..backends import get_backend
from ..config import get_config
from ..stream import Listener, Stream, StreamClosed

M_CREATE, M_CALL, M_INCREF, M_DECREF, M_SHUTDOWN, M_COUNT = range(1, 7)
# a call: op, call id (0: no reply wanted), calling thread, object token; then its pickled arguments
HEAD = struct.Struct("<BQQq")
CALL_ID = struct.Struct("<Q")  # a reply: the call it answers, then the pickled reply
GETVALUE = "#getvalue"  # a copy of the object itself
# reply kinds
RETURN, RAISE, PROXY = 0, 1, 2


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


class Lanes:
    """One thread per calling thread of each connected process, as
    ``multiprocessing`` has one per connection: its calls run in order, on the
    same thread (an ``RLock`` must be released by the thread that took it)."""

    def __init__(self):
        self._lanes: dict[tuple, queue.SimpleQueue] = {}
        self._lock = threading.Lock()

    def submit(self, key: tuple, fn) -> None:
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = queue.SimpleQueue()
                threading.Thread(target=_run_lane, args=(lane,), name="fiberrl-manager-call", daemon=True).start()
        lane.put(fn)

    def close_stream(self, stream_id: int) -> None:
        with self._lock:
            keys = [key for key in self._lanes if key[0] == stream_id]
            for key in keys:
                self._lanes.pop(key).put(None)

    def close(self) -> None:
        with self._lock:
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.put(None)


def _run_lane(lane: queue.SimpleQueue) -> None:
    while True:
        fn = lane.get()
        if fn is None:
            return
        fn()


class ManagerServer:
    """Serves the manager's streams: one thread reads each connected process's calls."""

    def __init__(self, registry: dict, inline: bool):
        self._registry = registry  # typeid -> (callable, exposed, method_to_typeid)
        self._objects: dict[int, Entry] = {}
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self._lanes = None if inline else Lanes()
        self._inline_lock = threading.Lock()  # inline calls run one at a time, whichever stream sent them
        self.stopped = threading.Event()

    def serve(self, stream: Stream) -> None:
        try:
            while True:
                frame = stream.recv()
                op, call_id, caller, token = HEAD.unpack_from(frame)
                payload = memoryview(frame)[HEAD.size:]
                if op == M_CALL or op == M_CREATE:
                    if self._lanes is None:
                        with self._inline_lock:
                            self._run(stream, call_id, op, token, payload)
                    else:
                        self._lanes.submit((id(stream), caller),
                                           functools.partial(self._run, stream, call_id, op, token, payload))
                elif op == M_DECREF:
                    self._change_refs(token, -1)  # one-way: nothing to answer
                elif op == M_INCREF:
                    _reply(stream, call_id, (RETURN, self._change_refs(token, 1)))
                elif op == M_COUNT:
                    _reply(stream, call_id, (RETURN, len(self._objects)))
                elif op == M_SHUTDOWN:
                    _reply(stream, call_id, (RETURN, None))
                    self.stopped.set()
                else:
                    _reply(stream, call_id, (RAISE, (ValueError(f"unknown manager op {op}"), "")))
        finally:
            if self._lanes is not None:
                self._lanes.close_stream(id(stream))

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
        obj = factory(*args, **kwargs)
        return (PROXY, self._store(obj, exposed, method_to_typeid) + (typeid,))

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
        if self._lanes is not None:
            self._lanes.close()
        with self._lock:
            self._objects.clear()


def _reply(stream: Stream, call_id: int, reply: tuple) -> None:
    try:
        parts = wire.dumps(reply)
    except Exception as exc:
        parts = wire.dumps((RAISE, _portable_error(TypeError(f"the result could not be pickled: {exc!r}"))))
    try:
        stream.send([CALL_ID.pack(call_id), *parts])
    except StreamClosed:
        pass  # the caller went away


def _portable_error(exc: BaseException) -> tuple:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        wire.dumps(exc)
        return exc, tb
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc} (the exception could not be pickled)"), tb


def serve(registry: dict, inline: bool, address_queue) -> None:
    """The manager process's target: serve on a stream listener, say where, run until shut down."""
    server = ManagerServer(registry, inline)
    listener = Listener(get_config().host or get_backend().listen_host(), server.serve)
    address_queue.put(listener.address)
    server.stopped.wait()
    listener.close()
    server.close()
