"""Authenticated request/reply for the objects a hub hosts (queues, pipes),
over streams (:mod:`fiberrl.runtime.net.stream`).

A :class:`Server` accepts streams on a :class:`~.listener.Listener` and
reads all of them on one thread (a :class:`~.stream_pump.StreamPump`).  A
request may be parked (a blocking ``get`` on an empty queue) and answered
later from any thread, so one thread serves any number of waiting clients.

A :class:`Client` is one stream to one server, shared by the threads of a
process: each request carries a call id and its reply the same, and
whichever thread waits reads the stream (:class:`~.calls.CallStream`).

Wire format -- request: op (1 byte) | call id (8) | token, unused (8) |
object id (16) | payload; reply: call id (8) | status (1) | payload.

A stream passes the run's handshake before any frame it carries is read,
bound to the connection and, over TCP, with a MAC on every frame; the
listener holds at most 40 bytes of a peer that has not proved itself, so no
one without the secret makes it read a message, however long it says it is.
A reply goes to the waiting thread through no other (a round trip ~18 us).
"""
from __future__ import annotations

import logging
import threading
import traceback
from collections import deque

from ..config import get_config
from .calls import CALL_ID, HEAD, CallStream
from .errors import LinkError, PeerGone
from .listener import Listener
from .stream import Stream
from .stream_pump import StreamPump

log = logging.getLogger("fiberrl.transport")

# reply status
OK, EMPTY, FULL, ERROR, CLOSED, MISSING = range(6)
NULL_ID = bytes(16)
_OBJ_ID = 16
# replies to posted requests outstanding at once before a post waits
POST_WINDOW = 256
# posted requests are answered at once (never parked): a missing answer means a stuck peer
POST_REPLY_TIMEOUT = 30.0


class MessageTooLarge(ValueError):
    """An item too large to send through a queue or pipe."""


class RemoteError(RuntimeError):
    """The server could not carry out a request; the message says why."""


def check_size(parts) -> None:
    """Refuse a message no server would take (an item as large stored in a queue
    of this process could not be read from another)."""
    size = sum(len(p) if type(p) is bytes else memoryview(p).nbytes for p in parts)
    most = get_config().max_message_size
    if size > most:
        raise MessageTooLarge(f"an item of {size:,} bytes (pickled) is more than a queue or pipe carries "
                              f"(max_message_size={most:,}); send it in parts, raise max_message_size, or pass "
                              f"it to a Pool's tasks or a Manager")


class Request:
    """A request being served; answer it exactly once with :meth:`reply`."""

    __slots__ = ("_stream", "_call_id", "op", "obj_id", "body", "pipe_id", "_answered")

    def __init__(self, stream: Stream, frame: bytearray, pipe_id: int):
        self._stream = stream
        self.op, self._call_id, _ = HEAD.unpack_from(frame)
        self.obj_id = bytes(frame[HEAD.size:HEAD.size + _OBJ_ID])
        self.body = memoryview(frame)[HEAD.size + _OBJ_ID:]
        self.pipe_id = pipe_id
        self._answered = threading.Lock()

    def claim(self) -> bool:
        """Reserve the right to answer; False if someone else already did."""
        return self._answered.acquire(blocking=False)

    def reply(self, status: int, *parts, claimed: bool = False) -> None:
        if not claimed and not self.claim():
            return
        try:
            self._stream.send([CALL_ID.pack(self._call_id) + bytes((status,)), *parts])
        except LinkError:
            pass  # the client is gone; on_pipe_lost tells its objects


class Server:
    def __init__(self, host: str, handler, on_pipe_lost=None):
        """``handler(request)`` serves each request, on the server's one thread;
        ``on_pipe_lost(pipe_id)`` hears of every closed connection."""
        self._handler = handler
        self._on_pipe_lost = on_pipe_lost
        self._pipe_ids = iter(range(1, 1 << 62))
        self._listeners: list[Listener] = []
        self._pump = StreamPump(self._on_frames, self._closed, "fiberrl-hub")
        self.address = self.listen(host)

    def listen(self, host: str) -> str:
        """Also accept connections on ``host`` (a fresh port); its address."""
        listener = Listener(host, self._adopt, hand_off=True, name="objects")
        self._listeners.append(listener)
        return listener.address

    def _adopt(self, stream: Stream) -> None:
        stream.max_frame = get_config().max_message_size + HEAD.size + _OBJ_ID
        self._pump.add(stream, next(self._pipe_ids))

    def _on_frames(self, stream: Stream, pipe_id: int, frames) -> None:
        for frame in frames:
            if len(frame) < HEAD.size + _OBJ_ID:
                log.warning("closing the connection of %s: a malformed request", stream.peer)
                stream.close()
                return
            request = Request(stream, frame, pipe_id)
            try:
                self._handler(request)
            except Exception:
                log.exception("request op=%d failed", request.op)
                request.reply(ERROR, traceback.format_exc().encode())

    def _closed(self, _stream: Stream, pipe_id: int) -> None:
        if self._on_pipe_lost is not None:
            self._on_pipe_lost(pipe_id)

    def close(self) -> None:
        for listener in self._listeners:
            listener.close()
        self._pump.close()


class Client:
    """A process's connection to one server, shared by its threads.  Raises
    ``PeerGone`` once the server is gone; a lost connection stays lost."""

    def __init__(self, address: str, connect_timeout: float = 10.0):
        self.address = address
        try:
            self._conn = CallStream(address, timeout=connect_timeout)
        except PermissionError:
            raise  # the other side failed the handshake: not a process that went away
        except (LinkError, OSError) as exc:
            raise PeerGone(f"cannot reach {address}: {exc}") from None
        self._posted: deque[int] = deque()
        self._post_lock = threading.Lock()
        self._post_error: Exception | None = None

    @property
    def alive(self) -> bool:
        return self._conn.error is None

    def request(self, op: int, obj_id: bytes = NULL_ID, parts=(), timeout: float | None = None):
        """Send a request and return (status, payload).  Raises PeerGone if
        the server's process goes away, TimeoutError after ``timeout`` s."""
        try:
            call_id = self._conn.call(op, 0, [obj_id, *parts])
            reply = self._conn.reply(call_id, timeout)
        except LinkError as exc:
            raise PeerGone(f"lost the connection to {self.address}: {exc}") from None
        except TimeoutError:
            raise TimeoutError(f"no reply from {self.address} within {timeout} s") from None
        return reply[0], reply[1:]

    def post(self, op: int, obj_id: bytes = NULL_ID, parts=()) -> None:
        """Send a request without waiting for its reply.  Requests from one
        client are served in the order sent; a failed reply is raised by a
        later :meth:`post` or :meth:`flush`."""
        with self._post_lock:
            self._reap(POST_WINDOW - 1)
            try:
                self._posted.append(self._conn.call(op, 0, [obj_id, *parts]))
            except LinkError as exc:
                raise PeerGone(f"lost the connection to {self.address}: {exc}") from None

    def flush(self) -> None:
        """Wait until every posted request has been served."""
        with self._post_lock:
            self._reap(0)

    def _reap(self, keep: int) -> None:
        posted = self._posted
        while len(posted) > keep:
            call_id = posted.popleft()
            try:
                reply = self._conn.reply(call_id, POST_REPLY_TIMEOUT)
            except LinkError as exc:
                self._post_error = self._post_error or PeerGone(f"lost the connection to {self.address}: {exc}")
                continue
            except TimeoutError:
                self._post_error = self._post_error or TimeoutError(
                    f"no reply from {self.address} within {POST_REPLY_TIMEOUT} s")
                continue
            status = reply[0]
            if status == MISSING and self._post_error is None:
                self._post_error = PeerGone(f"a queue or pipe this process wrote to no longer exists at "
                                            f"{self.address}: its creator dropped every reference to it")
            elif status != OK and self._post_error is None:
                self._post_error = RemoteError(f"{self.address} refused a request: "
                                               f"{bytes(reply[1:]).decode(errors='replace')}")
        if self._post_error is not None:
            error, self._post_error = self._post_error, None
            raise error

    def close(self) -> None:
        self._conn.stream.close()
