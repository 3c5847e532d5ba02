"""Authenticated request/reply over nng.

A :class:`Server` is one raw Rep0 socket served by one thread.  Raw mode lets
a request be parked (a blocking ``get`` on an empty queue) and answered later
from any thread, so one thread serves any number of waiting clients.

A :class:`Client` is one Req0 socket dialled to one server; each request runs
in its own nng context, so threads of one process share it.

Wire format -- request: op (1 byte) | object id (16 bytes) | payload;
reply: status (1 byte) | payload.  Nothing from a connection reaches a
handler, let alone ``pickle``, before the connection passed the handshake of
:mod:`fiberrl.runtime.auth`, bound to the address the client dialled: the
client's hello names it, and a server that does not listen there refuses
(a party that relays a job's connection to another listener of the run).

nng reads a whole message before anyone sees it, so a server takes none
larger than ``MAX_MESSAGE`` bytes (a peer that announces more is cut off
before anything is allocated for it), and a client refuses to send one.
"""
from __future__ import annotations

import logging
import threading
import traceback
from collections import deque

import pynng
from pynng import lib

from . import auth, wire

log = logging.getLogger("fiberrl.transport")

# ops the transport itself answers
HELLO, PROOF = 1, 2
# reply status
OK, EMPTY, FULL, ERROR, CLOSED, MISSING = range(6)
NULL_ID = bytes(16)
_HEAD = 17  # op + object id
# replies to posted requests outstanding at once before a post waits
POST_WINDOW = 256
# posted requests are answered at once (never parked): a missing answer means a stuck peer
POST_REPLY_TIMEOUT_MS = 30_000
# the largest message a server takes: an item put into a queue or sent through a pipe, pickled
MAX_MESSAGE = 1 << 30


class PeerGone(ConnectionError):
    """The process at the other end of a connection went away."""


class MessageTooLarge(ValueError):
    """An item too large to send through a queue or pipe."""


class RemoteError(RuntimeError):
    """The server could not carry out a request; the message says why."""


class Request:
    """A request being served; answer it exactly once with :meth:`reply`."""

    __slots__ = ("_server", "_header", "op", "obj_id", "body", "pipe_id", "_answered")

    def __init__(self, server, header, body, pipe_id):
        self._server = server
        self._header = header
        self.op = body[0]
        self.obj_id = bytes(body[1:_HEAD])
        self.body = memoryview(body)[_HEAD:]
        self.pipe_id = pipe_id
        self._answered = threading.Lock()

    def claim(self) -> bool:
        """Reserve the right to answer; False if someone else already did."""
        return self._answered.acquire(blocking=False)

    def reply(self, status: int, *parts, claimed: bool = False) -> None:
        if not claimed and not self.claim():
            return
        self._server.send_reply(self._header, status, parts)


class Server:
    def __init__(self, host: str, handler, on_pipe_lost=None):
        """``handler(request)`` serves each authenticated request;
        ``on_pipe_lost(pipe_id)`` hears of every closed connection."""
        self._handler = handler
        self._on_pipe_lost = on_pipe_lost
        self._secret = auth.run_secret()
        self._sock = pynng.Socket(opener=lib.nng_rep0_open_raw)
        self._sock.recv_max_size = MAX_MESSAGE
        self._addresses: set[str] = set()
        self._trusted: set[int] = set()
        self._pending: dict[int, tuple[bytes, bytes]] = {}
        self._sock.add_post_pipe_remove_cb(self._forget_pipe)
        self.address = self.listen(host)
        self._thread = threading.Thread(target=self._serve, name="fiberrl-server", daemon=True)
        self._thread.start()

    def listen(self, host: str) -> str:
        """Also accept connections on ``host`` (a fresh port); its address."""
        listener = self._sock.listen(f"tcp://{host}:0")
        address = str(listener.url if hasattr(listener, "url") else listener.local_address)
        address = address if address.startswith("tcp://") else "tcp://" + address
        self._addresses.add(address)
        return address

    def send_reply(self, header: bytes, status: int, parts) -> None:
        msg = wire.new_msg([bytes((status,)), *parts], header=header)
        try:
            wire.sock_send(self._sock.socket, msg)
        except pynng.Closed:
            pass

    def close(self) -> None:
        self._sock.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _forget_pipe(self, pipe) -> None:
        self._pending.pop(pipe.id, None)
        if pipe.id in self._trusted:
            self._trusted.discard(pipe.id)
            if self._on_pipe_lost is not None:
                self._on_pipe_lost(pipe.id)

    def _serve(self) -> None:
        sock = self._sock.socket
        while True:
            try:
                msg = wire.sock_recv(sock)
            except pynng.Closed:
                return
            pipe = lib.nng_msg_get_pipe(msg)
            pipe_id = lib.nng_pipe_id(pipe)
            header = wire.msg_header(msg)
            body = wire.msg_body(msg)
            if pipe_id not in self._trusted:
                self._handshake(pipe, pipe_id, header, body)
                continue
            if len(body) < _HEAD:
                self.send_reply(header, ERROR, [b"malformed request"])
                continue
            request = Request(self, header, body, pipe_id)
            try:
                self._handler(request)
            except Exception:
                log.exception("request op=%d failed", request.op)
                request.reply(ERROR, traceback.format_exc().encode())

    def _handshake(self, pipe, pipe_id, header, body) -> None:
        op = body[0] if body else 0
        if op == HELLO and _HELLO_MIN <= len(body) <= _HELLO_MAX and pipe_id not in self._pending:
            client_nonce = bytes(body[1:_HELLO_MIN])
            dialled = bytes(body[_HELLO_MIN:]).decode(errors="replace")
            if dialled not in self._addresses:
                log.warning("closed a connection that dialled %s, which is not this server: relayed by a party "
                            "in the middle", dialled)
                lib.nng_pipe_close(pipe)
                return
            server_nonce = auth.new_nonce()
            self._pending[pipe_id] = (client_nonce, server_nonce, auth.channel("tcp", dialled))
            proof = auth.server_proof(self._secret, client_nonce, server_nonce, self._pending[pipe_id][2])
            self.send_reply(header, OK, [server_nonce, proof])
            return
        if op == PROOF and pipe_id in self._pending:
            client_nonce, server_nonce, channel = self._pending.pop(pipe_id)
            if auth.verify(auth.client_proof(self._secret, server_nonce, client_nonce, channel), bytes(body[1:])):
                self._trusted.add(pipe_id)
                self.send_reply(header, OK, [])
                return
        log.warning("closed a connection that failed authentication (%d bytes ignored)", len(body))
        lib.nng_pipe_close(pipe)


# a hello: op, the client's nonce, the address it dialled
_HELLO_MIN = 1 + auth.NONCE_BYTES
_HELLO_MAX = _HELLO_MIN + 300


def check_size(parts) -> None:
    """Refuse a message no server would take (an item as large stored in a queue
    of this process could not be read from another)."""
    size = sum(len(p) if type(p) is bytes else memoryview(p).nbytes for p in parts)
    if size > MAX_MESSAGE - _HEAD:  # a reply's status byte or a request's head must fit as well
        raise MessageTooLarge(f"an item of {size:,} bytes (pickled) is more than a queue or pipe carries "
                              f"({MAX_MESSAGE:,}); send it in parts, or pass it to a Pool's tasks or a Manager")


class Pending:
    """A request sent by :meth:`Client.ask` whose reply has not been read."""

    __slots__ = ("_client", "_ctx")

    def __init__(self, client, ctx):
        self._client = client
        self._ctx = ctx

    def wait(self):
        """(status, payload) of the reply; PeerGone if the server goes away."""
        return self._client._end(self._ctx)


NEVER_MS = 2**31 - 1


class Client:
    def __init__(self, address: str, connect_timeout: float = 10.0):
        self.address = address
        # no resends and no redials: a request must never travel down a fresh pipe
        # that has not passed the handshake; a lost connection stays lost (PeerGone)
        self._sock = pynng.Req0(resend_time=-1, reconnect_time_min=NEVER_MS, reconnect_time_max=NEVER_MS,
                                recv_max_size=MAX_MESSAGE)
        self._lost = threading.Event()
        self._inflight: set = set()
        self._lock = threading.Lock()
        self._idle: list = []
        self._posted: deque = deque()
        self._post_lock = threading.Lock()
        self._post_error: Exception | None = None
        self._sock.add_post_pipe_remove_cb(self._on_pipe_removed)
        try:
            self._sock.dial(address, block=True)
        except pynng.NNGException as exc:
            self._sock.close()
            raise PeerGone(f"cannot reach {address}: {exc}") from None
        try:
            self._authenticate(connect_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        return not self._lost.is_set()

    def wait_lost(self, timeout: float) -> bool:
        """Block until the connection is lost or ``timeout`` passes."""
        return self._lost.wait(timeout)

    def _on_pipe_removed(self, _pipe) -> None:
        self._lost.set()
        with self._lock:
            for ctx in self._inflight:
                ctx.cancel()

    def _authenticate(self, timeout: float) -> None:
        secret = auth.run_secret()
        client_nonce = auth.new_nonce()
        channel = auth.channel("tcp", self.address)
        status, reply = self._roundtrip([bytes((HELLO,)), client_nonce, self.address.encode()], timeout)
        server_nonce, proof = bytes(reply[:auth.NONCE_BYTES]), bytes(reply[auth.NONCE_BYTES:])
        if status != OK or not auth.verify(auth.server_proof(secret, client_nonce, server_nonce, channel), proof):
            raise PermissionError(f"{self.address} failed to prove it holds this run's secret")
        status, _ = self._roundtrip([bytes((PROOF,)), auth.client_proof(secret, server_nonce, client_nonce, channel)],
                                    timeout)
        if status != OK:
            raise PermissionError(f"{self.address} rejected this process's credentials")

    def request(self, op: int, obj_id: bytes = NULL_ID, parts=(), timeout: float | None = None):
        """Send a request and return (status, payload).  Raises PeerGone if
        the server's process goes away, TimeoutError after ``timeout`` s."""
        return self._roundtrip([bytes((op,)), obj_id, *parts], timeout)

    def ask(self, op: int, obj_id: bytes = NULL_ID, parts=()) -> "Pending":
        """Send a request now and collect its reply later with ``wait()``."""
        ctx = self._begin([bytes((op,)), obj_id, *parts])
        ctx.start_recv()
        return Pending(self, ctx)

    def post(self, op: int, obj_id: bytes = NULL_ID, parts=()) -> None:
        """Send a request without waiting for its reply.  Requests from one
        client are served in the order sent; a failed reply is raised by a
        later :meth:`post` or :meth:`flush`."""
        with self._post_lock:
            self._reap(POST_WINDOW - 1)
            ctx = self._begin([bytes((op,)), obj_id, *parts])
            ctx.start_recv(POST_REPLY_TIMEOUT_MS)
            self._posted.append(ctx)

    def flush(self) -> None:
        """Wait until every posted request has been served."""
        with self._post_lock:
            self._reap(0)

    def _reap(self, keep: int) -> None:
        posted = self._posted
        while posted and (len(posted) > keep or posted[0].done()):
            ctx = posted.popleft()
            try:
                status, payload = self._end(ctx, POST_REPLY_TIMEOUT_MS / 1000)
            except Exception as exc:
                self._post_error = self._post_error or exc
                continue
            if status == MISSING and self._post_error is None:
                self._post_error = PeerGone(f"a queue or pipe this process wrote to no longer exists at "
                                            f"{self.address}: its creator dropped every reference to it")
            elif status != OK and self._post_error is None:
                self._post_error = RemoteError(f"{self.address} refused a request: "
                                               f"{bytes(payload).decode(errors='replace')}")
        if self._post_error is not None:
            error, self._post_error = self._post_error, None
            raise error

    def _roundtrip(self, parts, timeout):
        ctx = self._begin(parts)
        ctx.start_recv(-1 if timeout is None else int(timeout * 1000))
        return self._end(ctx, timeout)

    def _begin(self, parts):
        if self._lost.is_set():
            raise PeerGone(f"lost the connection to {self.address}")
        check_size(parts)
        with self._lock:
            ctx = self._idle.pop() if self._idle else wire.Context(self._sock.socket)
            self._inflight.add(ctx)
        try:
            ctx.send(wire.new_msg(parts))
        except (pynng.Canceled, pynng.Closed, pynng.ConnectionReset):
            self._release(ctx, reuse=False)
            raise PeerGone(f"lost the connection to {self.address}") from None
        except BaseException:
            self._release(ctx, reuse=False)
            raise
        return ctx

    def _end(self, ctx, timeout=None):
        try:
            msg = ctx.finish()
        except pynng.Timeout:
            self._release(ctx, reuse=False)
            raise TimeoutError(f"no reply from {self.address} within {timeout} s") from None
        except (pynng.Canceled, pynng.Closed, pynng.ConnectionReset):
            self._release(ctx, reuse=False)
            raise PeerGone(f"lost the connection to {self.address}") from None
        self._release(ctx, reuse=True)
        body = wire.msg_body(msg)
        return body[0], memoryview(body)[1:]

    def _release(self, ctx, reuse: bool) -> None:
        with self._lock:
            self._inflight.discard(ctx)
            if reuse and len(self._idle) < 64:
                self._idle.append(ctx)
                return
        ctx.close()

    def close(self) -> None:
        self._sock.close()
        with self._lock:
            idle, self._idle = self._idle, []
        for ctx in idle:
            ctx.close()
