"""A FIFO of serialised items hosted by the process that created it, and the
handle any process uses to reach it.  Queues and pipes are built on it.

The owner keeps items as the bytes writers sent and never unpickles them; a
reader's ``get`` on an empty channel is parked in the owner and answered
when an item arrives, so a blocked reader costs no polling.  In the owner
itself the handle works on the channel directly, without a socket.
"""
from __future__ import annotations

import os
import queue
import struct
import threading
import time
import uuid
from collections import deque

from ..net import wire
from ..net.errors import PeerGone
from ..net.transport import CLOSED, EMPTY, ERROR, FULL, MISSING, OK, Request, check_size
from ..processes.hub import Q_CLOSE, Q_GET, Q_HOLD, Q_PEND, Q_PUT, Q_SIZE, Q_UNPEND, current_hub, get_hub

_TIMEOUT = struct.Struct("<d")
_SIZE = struct.Struct("<q")
_NO_TIMEOUT = _TIMEOUT.pack(-1.0)
# the holder key of handles in the owner's own process (remote ones are keyed by their connection)
LOCAL = 0
# how much longer than the owner's own deadline a reader waits for its reply
_REPLY_GRACE = 30.0


class ChannelClosed(EOFError):
    """The writing side closed the channel and every item has been read."""


class Channel:
    def __init__(self, maxsize: int = 0):
        self.maxsize = maxsize
        self._items: deque = deque()
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._parked_gets: deque[Request] = deque()
        self._parked_puts: deque[tuple[Request, object]] = deque()
        self._closed = False
        # writer handles, counted as a pipe's write descriptors are: the channel closes when the
        # last is released.  holder -> handles; a pickled handle is pending until a process takes it
        self._holds: dict[int, int] = {}
        # connections of other processes that have used it: once its creator lets go of it,
        # it lives on while any of them is open, as a pipe lives while a process holds it
        self.users: set[int] = set()
        self._pending: dict[bytes, int] = {}
        self._taken_early: set[bytes] = set()

    def _full(self) -> bool:
        return 0 < self.maxsize <= len(self._items)

    # --- under self._lock; return the replies to send once unlocked ----
    def _offer(self, data):
        while self._parked_gets:
            request = self._parked_gets.popleft()
            if request.claim():
                return [(request, OK, data)]
        self._items.append(data)
        self._not_empty.notify()
        return []

    def _take(self):
        data = self._items.popleft()
        replies = []
        while self._parked_puts and not self._full():
            request, item = self._parked_puts.popleft()
            if request.claim():
                replies.extend(self._offer(item))
                replies.append((request, OK, b""))
        self._not_full.notify()
        return data, replies

    @staticmethod
    def _send(replies) -> None:
        for request, status, data in replies:
            request.reply(status, data, claimed=True)

    # --- in the owner's process -------------------------------------------
    def put(self, data, timeout: float | None) -> None:
        with self._lock:
            if self._full():
                if not self._not_full.wait_for(lambda: not self._full(), timeout):
                    raise queue.Full
            replies = self._offer(data)
        self._send(replies)

    def get(self, timeout: float | None):
        with self._lock:
            if not self._not_empty.wait_for(lambda: self._items or self._closed, timeout):
                raise queue.Empty
            if not self._items:
                raise ChannelClosed
            data, replies = self._take()
        self._send(replies)
        return data

    def qsize(self) -> int:
        return len(self._items)

    # --- writer handles ---------------------------------------------------
    def hold(self, holder: int, token: bytes | None = None) -> None:
        """A writer handle came to life in ``holder`` (``token``: it was unpickled)."""
        with self._lock:
            if token is not None:
                if self._pending.pop(token, None) is None:
                    self._taken_early.add(token)  # its pickler's notice is still on the way
            self._holds[holder] = self._holds.get(holder, 0) + 1
            self._closed = False

    def pend(self, holder: int, token: bytes) -> None:
        """A writer handle was pickled in ``holder``; it counts until taken or dropped."""
        with self._lock:
            if token in self._taken_early:
                self._taken_early.discard(token)
            else:
                self._pending[token] = holder

    def unpend(self, token: bytes) -> None:
        """A pickled handle will never be taken (the process it went to ended)."""
        with self._lock:
            if self._pending.pop(token, None) is None:
                return
        self._close_if_unheld()

    def release(self, holder: int) -> None:
        """A writer handle of ``holder`` closed; one not counted (a forked copy) changes nothing."""
        with self._lock:
            count = self._holds.get(holder, 0)
            if count == 0:
                return
            if count == 1:
                del self._holds[holder]
            else:
                self._holds[holder] = count - 1
        self._close_if_unheld()

    def _drop_holder(self, holder: int) -> None:
        with self._lock:
            held = self._holds.pop(holder, 0)
            pending = [token for token, pickler in self._pending.items() if pickler == holder]
            for token in pending:
                del self._pending[token]
        if held or pending:
            self._close_if_unheld()

    def _close_if_unheld(self) -> None:
        with self._lock:
            if self._holds or self._pending:
                return
        self.close_writer()

    def close_writer(self) -> None:
        with self._lock:
            self._closed = True
            self._not_empty.notify_all()
            if self._items:
                return
            parked, self._parked_gets = list(self._parked_gets), deque()
        for request in parked:
            request.reply(CLOSED)

    # --- requests from other processes ------------------------------------
    def handle(self, request: Request) -> None:
        op = request.op
        self.users.add(request.pipe_id)
        if op == Q_GET:
            self._remote_get(request, _TIMEOUT.unpack_from(request.body)[0])
        elif op == Q_PUT:
            self._remote_put(request, _TIMEOUT.unpack_from(request.body)[0], request.body[_TIMEOUT.size:])
        elif op == Q_SIZE:
            request.reply(OK, _SIZE.pack(self.qsize()))
        elif op == Q_CLOSE:
            self.release(request.pipe_id)
            request.reply(OK)
        elif op == Q_HOLD:
            self.hold(request.pipe_id, bytes(request.body) or None)
            request.reply(OK)
        elif op == Q_PEND:
            self.pend(request.pipe_id, bytes(request.body))
            request.reply(OK)
        elif op == Q_UNPEND:
            self.unpend(bytes(request.body))
            request.reply(OK)
        else:
            request.reply(ERROR, b"unknown channel operation")

    def _remote_get(self, request: Request, timeout: float) -> None:
        with self._lock:
            if self._items:
                data, replies = self._take()
                replies.append((request, OK, data))
                request.claim()
            elif self._closed:
                replies = [(request, CLOSED, b"")] if request.claim() else []
            elif timeout == 0:
                replies = [(request, EMPTY, b"")] if request.claim() else []
            else:
                self._parked_gets.append(request)
                replies = []
                if timeout > 0:
                    get_hub().call_at(time.monotonic() + timeout, lambda: self._expire(request, EMPTY))
        self._send(replies)

    def _remote_put(self, request: Request, timeout: float, data) -> None:
        with self._lock:
            if not self._full():
                replies = self._offer(data)
                replies.append((request, OK, b""))
                request.claim()
            elif timeout == 0:
                replies = [(request, FULL, b"")] if request.claim() else []
            else:
                self._parked_puts.append((request, data))
                replies = []
                if timeout > 0:
                    get_hub().call_at(time.monotonic() + timeout, lambda: self._expire(request, FULL))
        self._send(replies)

    def drop_requests_of(self, pipe_id: int) -> None:
        """Forget the parked requests and writer handles of a connection that closed."""
        self.users.discard(pipe_id)
        self._drop_holder(pipe_id)
        with self._lock:
            gone = [r for r in self._parked_gets if r.pipe_id == pipe_id]
            gone += [r for r, _ in self._parked_puts if r.pipe_id == pipe_id]
            if not gone:
                return
            for request in gone:
                request.claim()
            self._parked_gets = deque(r for r in self._parked_gets if r.pipe_id != pipe_id)
            self._parked_puts = deque(p for p in self._parked_puts if p[0].pipe_id != pipe_id)

    def _expire(self, request: Request, status: int) -> None:
        if request.claim():
            with self._lock:
                self._parked_gets = deque(r for r in self._parked_gets if r is not request)
                self._parked_puts = deque(p for p in self._parked_puts if p[0] is not request)
            request.reply(status, claimed=True)


class ChannelRef:
    """A handle on a channel, usable from any process of the run."""

    __slots__ = ("address", "obj_id", "maxsize", "_channel", "_pid")

    def __init__(self, address: str, obj_id: bytes, maxsize: int = 0, channel: Channel | None = None):
        self.address = address
        self.obj_id = obj_id
        self.maxsize = maxsize
        self._channel = channel
        self._pid = os.getpid()  # whose the channel is: a forked child holds only a copy of it

    def __reduce__(self):
        return ChannelRef, (self.address, self.obj_id, self.maxsize)

    def _local(self) -> Channel | None:
        if self._pid != os.getpid():  # forked from the owner: its items are the owner's, reached remotely
            self._channel, self._pid = None, os.getpid()
        if self._channel is None:
            hub = current_hub()
            if hub is not None and hub.owns(self.address):
                self._channel = hub.hosted(self.obj_id)
        return self._channel

    def _owner_gone(self) -> PeerGone:
        return PeerGone(f"the process that created this queue or pipe ({self.address}) is gone")

    def _request(self, op: int, parts, wait: float | None):
        try:
            client = get_hub().client(self.address)
            status, payload = client.request(op, self.obj_id, parts, timeout=wait)
        except PeerGone:
            raise self._owner_gone() from None
        except TimeoutError:
            raise PeerGone(f"the process that created this queue or pipe ({self.address}) stopped answering") from None
        if status == MISSING:
            raise PeerGone("this queue or pipe no longer exists: the process that created it dropped every "
                           "reference to it; keep the object alive in its creator while others use it")
        if status == ERROR:
            raise RuntimeError(bytes(payload).decode(errors="replace"))
        return status, payload

    @staticmethod
    def _wire_timeout(timeout: float | None) -> tuple[float, float | None]:
        if timeout is None:
            return -1.0, None
        timeout = max(0.0, timeout)
        return timeout, timeout + _REPLY_GRACE

    def put(self, obj, timeout: float | None = None) -> None:
        """Serialise and append ``obj``; raise queue.Full after ``timeout``.

        Into an unbounded channel of another process the put is pipelined:
        it returns once sent, and the owner stores items in the order sent.
        """
        parts = wire.dumps(obj)
        check_size(parts)
        channel = self._local()
        if channel is not None:
            channel.put(wire.join(parts), timeout)
            return
        if self.maxsize == 0:
            try:
                get_hub().client(self.address).post(Q_PUT, self.obj_id, [_NO_TIMEOUT, *parts])
            except PeerGone:
                raise self._owner_gone() from None
            return
        wire_timeout, wait = self._wire_timeout(timeout)
        status, _ = self._request(Q_PUT, [_TIMEOUT.pack(wire_timeout), *parts], wait)
        if status == FULL:
            raise queue.Full

    def get(self, timeout: float | None = None):
        """Remove and return the oldest item; queue.Empty after ``timeout``,
        ChannelClosed once the writer closed and the channel is drained."""
        channel = self._local()
        if channel is not None:
            return wire.loads(channel.get(timeout))
        wire_timeout, wait = self._wire_timeout(timeout)
        status, payload = self._request(Q_GET, [_TIMEOUT.pack(wire_timeout)], wait)
        if status == EMPTY:
            raise queue.Empty
        if status == CLOSED:
            raise ChannelClosed
        return wire.loads(payload)

    def qsize(self) -> int:
        channel = self._local()
        if channel is not None:
            return channel.qsize()
        _, payload = self._request(Q_SIZE, [], _REPLY_GRACE)
        return _SIZE.unpack_from(payload)[0]

    def hold(self, token: bytes | None = None, wait: bool = False) -> None:
        """Count a writer handle of this process (``token``: unpickled from a pending one;
        ``wait``: return once the owner has counted it)."""
        channel = self._local()
        if channel is not None:
            channel.hold(LOCAL, token)
        elif wait:
            self._request(Q_HOLD, [token or b""], _REPLY_GRACE)
        else:
            self._post(Q_HOLD, token or b"")

    def pend(self, token: bytes) -> None:
        channel = self._local()
        if channel is not None:
            channel.pend(LOCAL, token)
        else:
            self._post(Q_PEND, token)

    def unpend(self, token: bytes) -> None:
        channel = self._local()
        if channel is not None:
            channel.unpend(token)
        else:
            self._post(Q_UNPEND, token)

    def release(self) -> None:
        """Uncount a writer handle of this process; the last one's release closes the channel."""
        channel = self._local()
        if channel is not None:
            channel.release(LOCAL)
        else:
            self._post(Q_CLOSE, b"")

    def _post(self, op: int, body: bytes) -> None:
        # posted, so ordered with this process's puts; a later flush (every job's exit) delivers it
        try:
            get_hub().client(self.address).post(op, self.obj_id, [body])
        except PeerGone:
            raise self._owner_gone() from None

    def flush(self) -> None:
        """Wait until every item this process put has been stored by the owner."""
        if self._local() is None:
            get_hub().client(self.address).flush()


def new_channel(maxsize: int = 0, channel: Channel | None = None) -> tuple[ChannelRef, Channel]:
    """Create a channel hosted by this process (``channel``: one of another kind, made by the caller)."""
    hub = get_hub()
    channel = Channel(maxsize) if channel is None else channel
    obj_id = uuid.uuid4().bytes
    hub.host(obj_id, channel)
    return ChannelRef(hub.address, obj_id, maxsize, channel), channel
