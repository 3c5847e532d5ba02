"""Proxies: a process's handle on an object held by a manager.

A proxy can be passed to other processes of the run (as an argument, through
a queue); each copy holds a reference, and the object is freed when the last
one is released.  A proxy of an ``AsyncManager`` returns a :class:`Handle`
from every method call at once; ``handle.get()`` waits for the result.
"""
from __future__ import annotations

import weakref
from multiprocessing.managers import RemoteError

from ..net import wire
from ..net.calls import CallStream
from ..net.errors import LinkError, PeerGone
from ..pool.results import with_remote_traceback
from .client import connection, pending_releases, queue_release, send_releases
from .protocol import GETVALUE, M_CALL, M_CREATE, M_INCREF, PROXY, RAISE


class ManagerError(PeerGone):
    """The manager's process is gone, so its objects are too.  ``reason`` is
    what happened, without the advice, for a caller that acts on it itself."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


class ManagerRef:
    """What a proxy knows of its manager; travels with it."""

    def __init__(self, address: str, name: str, proxytypes: dict, is_async: bool):
        self.address = address
        self.name = name
        self.proxytypes = proxytypes  # typeid -> proxy class, None for an automatic one
        self.is_async = is_async

    def gone(self, exc) -> ManagerError:
        reason = f"{self.name} at {self.address} is gone ({exc})"
        return ManagerError(f"{reason}; its objects went with it. "
                            f"Restart the manager (AsyncManager.restart()) and create them again.", reason)

    def ask(self, op: int, token: int, parts=()) -> tuple[CallStream, int]:
        if pending_releases:
            send_releases()
        try:
            conn = connection(self.address, self.name)
            return conn, conn.call(op, token, parts)
        except LinkError as exc:
            raise self.gone(exc) from None

    def request(self, op: int, token: int, parts=(), timeout: float | None = None):
        conn, call_id = self.ask(op, token, parts)
        try:
            payload = conn.reply(call_id, timeout)
        except LinkError as exc:
            raise self.gone(exc) from None
        return _decode(self, payload, creating=op == M_CREATE)

    def make_proxy(self, token: int, exposed: tuple, typeid: str) -> "BaseProxy":
        proxytype = self.proxytypes.get(typeid) or auto_proxy_class(tuple(exposed), self.is_async)
        return proxytype(self, token, typeid, exposed)


def create(ref: ManagerRef, typeid: str, args, kwds, manager=None) -> "BaseProxy":
    proxy = ref.request(M_CREATE, 0, wire.dumps((typeid, args, kwds)))
    proxy._manager = manager  # the creating process's manager lives as long as its proxies
    return proxy


def _decode(ref: ManagerRef, payload, creating: bool = False):
    kind, value = wire.loads(payload)
    if kind == RAISE:
        exc, tb = value
        raise with_remote_traceback(_creation_error(exc) if creating else exc, tb)
    if kind == PROXY:
        token, exposed, typeid = value
        return ref.make_proxy(token, exposed, typeid)
    return value


_creation_error_types: dict = {}


def _creation_error(exc: BaseException) -> BaseException:
    """``exc``, raised by the server while creating an object, as an instance of
    both its own type and ``multiprocessing.managers.RemoteError``: what
    multiprocessing raises there, so code written for it catches it, and code
    that catches the error's own type (a ValueError of ``Pool(0)``) still does."""
    cls = type(exc)
    if not isinstance(exc, Exception) or isinstance(exc, RemoteError):
        return exc
    both = _creation_error_types.get(cls)
    if both is None:
        try:
            both = type(cls.__name__, (cls, RemoteError), {
                "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                "__str__": cls.__str__,  # its own text, not RemoteError's framing of it
                # travels as its own type: this one exists only in the process that made it
                "__reduce__": lambda self: (cls, self.args, self.__dict__ or None)})
        except TypeError:  # a type that cannot be combined (its layout, or it is final)
            return exc
        _creation_error_types[cls] = both
    try:
        combined = both.__new__(both, *exc.args)
        combined.__dict__.update(exc.__dict__)
    except Exception:  # noqa: BLE001 -- an odd __new__: its own type is what it has
        return exc
    combined.args = exc.args
    return combined


class BaseProxy:
    """A reference to one object in a manager."""

    _auto = False

    def __init__(self, ref: ManagerRef, token: int, typeid: str, exposed: tuple):
        self._ref = ref
        self._token = token
        self._typeid = typeid
        self._exposed = tuple(exposed)
        self._manager = None
        finalizer = weakref.finalize(self, queue_release, ref.address, ref.name, token)
        finalizer.atexit = False

    def _callmethod(self, methodname: str, args=(), kwds=None):
        """Call ``methodname`` on the object and return its result."""
        return self._ref.request(M_CALL, self._token, wire.dumps((methodname, tuple(args), dict(kwds or {}))))

    def _callmethod_async(self, methodname: str, args=(), kwds=None) -> "Handle":
        conn, call_id = self._ref.ask(M_CALL, self._token, wire.dumps((methodname, tuple(args), dict(kwds or {}))))
        return Handle(self._ref, conn, call_id, methodname)

    def _getvalue(self):
        """A copy of the object itself."""
        return self._callmethod(GETVALUE)

    def __reduce__(self):
        # the copy in transit holds its own reference, so the object outlives this proxy
        if not self._ref.request(M_INCREF, self._token):
            raise ReferenceError(f"{self!r} refers to an object its manager no longer has")
        return _rebuild, (None if type(self)._auto else type(self), self._ref, self._token, self._typeid,
                          self._exposed)

    def __repr__(self):
        # multiprocessing's form, which code and tests match, then which object of which manager
        return (f"<{type(self).__name__} object, typeid {self._typeid!r} at {id(self):#x}; "
                f"#{self._token} in {self._ref.name}>")

    def __str__(self):
        try:
            return self._callmethod("__repr__")
        except Exception:  # noqa: BLE001 -- str() must not fail on a dead manager
            return repr(self)


def _rebuild(cls, ref, token, typeid, exposed):
    if cls is None:
        cls = auto_proxy_class(tuple(exposed), ref.is_async)
    return cls(ref, token, typeid, exposed)


class Handle:
    """The result of an asynchronous call, matched to it by the call's id."""

    __slots__ = ("_ref", "_conn", "_call_id", "_method", "_outcome")

    def __init__(self, ref: ManagerRef, conn: CallStream, call_id: int, methodname: str):
        self._ref = ref
        self._conn = conn
        self._call_id = call_id
        self._method = methodname
        self._outcome = None

    def ready(self) -> bool:
        """Whether the result has arrived (never blocks)."""
        return self.wait(0.0)

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the result has arrived within ``timeout`` s; unlike ``get``, a call still
        unanswered stays awaited (``get`` or ``wait`` it again)."""
        if self._outcome is None:
            try:
                self._collect(timeout, abandon=False)
            except TimeoutError:
                return False
        return True

    def get(self, timeout: float | None = None):
        """The call's result, or its exception re-raised with the remote traceback."""
        if self._outcome is None:
            try:
                self._collect(timeout)
            except TimeoutError:
                raise TimeoutError(f"{self._method}() gave no result within {timeout} s") from None
        ok, value = self._outcome
        if ok:
            return value
        raise value

    def _collect(self, timeout: float | None, abandon: bool = True) -> None:
        try:
            payload = self._conn.reply(self._call_id, timeout, abandon)
        except LinkError as exc:
            self._outcome = (False, self._ref.gone(exc))
            return
        try:
            self._outcome = (True, _decode(self._ref, payload))
        except BaseException as exc:  # noqa: BLE001 -- the remote call's own exception
            self._outcome = (False, exc)


_auto_classes: dict = {}


def auto_proxy_class(exposed: tuple, is_async: bool) -> type:
    """A proxy class with one method per exposed name."""
    key = (exposed, is_async)
    cls = _auto_classes.get(key)
    if cls is None:
        namespace = {name: _forwarder(name, is_async) for name in exposed}
        namespace["_auto"] = True
        namespace["_exposed_"] = exposed  # as multiprocessing's AutoProxy
        cls = type("AsyncProxy" if is_async else "AutoProxy", (BaseProxy,), namespace)
        _auto_classes[key] = cls
    return cls


def _forwarder(name: str, is_async: bool):
    if is_async:
        def method(self, *args, **kwds):
            return self._callmethod_async(name, args, kwds)
    else:
        def method(self, *args, **kwds):
            return self._callmethod(name, args, kwds)
    method.__name__ = name
    return method


def forwarding(*names, also=()):
    """Class decorator: give a proxy class a method forwarding each name
    (unless it defines one), and expose those names, its base's and ``also``
    (methods its own code calls) in its ``_exposed_``."""
    def decorate(cls):
        for name in names:
            if name not in cls.__dict__:
                setattr(cls, name, _forwarder(name, False))
        cls._exposed_ = tuple(getattr(cls, "_exposed_", ())) + names + tuple(also)
        return cls
    return decorate
