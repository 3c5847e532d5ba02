"""Accepts authenticated streams (:mod:`fiberrl.runtime.net.stream`).

A process listens once per host it is reached on: every service in it (its
hub's queues and pipes, its children's links, each of its pools, a manager's
objects) is a ``Listener`` on that one gate, its address the gate's with
``/<name>`` after it.  A client names the service in its first frame after
the handshake, so every connection passes the same gate and handshake.

One thread per gate runs every connection's handshake up to
the client's proof, without blocking on any of them: a connection that has
proved nothing costs no thread and 40 bytes of buffer, holds its place for
at most ``HANDSHAKE_TIMEOUT`` seconds in all (not per read: a peer that
sends a byte every few seconds is dropped all the same), and when
``MAX_HANDSHAKES`` are waiting one is dropped to make room (the oldest that
has sent nothing, if any).  Only a peer that has proved it holds the run's
secret gets a thread, which sets up its pipe and ring or its MACs and then
serves it.

The gate outlives running out of file descriptors (or kernel buffers): it
stops accepting for a while, backing off up to a second, and goes on; the
connections meanwhile wait in the kernel's backlog.
"""
from __future__ import annotations

import errno
import itertools
import logging
import os
import selectors
import socket
import threading
import time

from . import auth
from .errors import LinkError, PeerMisbehaved
from .stream import _LENGTH, CHALLENGE_BYTES, HANDSHAKE_TIMEOUT, LOCAL_SOCKETS, Stream, _close

log = logging.getLogger("fiberrl.stream")

# connections in the handshake at once, per gate: past it one is dropped.  Far above a
# legitimate burst: 1024 pool workers starting on 2 cores overran 128, and were dropped
MAX_HANDSHAKES = 4096
# a client's nonce or proof, framed as every frame is
_PART_BYTES = _LENGTH.size + auth.NONCE_BYTES
_PART_HEAD = _LENGTH.pack(auth.NONCE_BYTES)
# what accept() says when this process or the system is out of something, for now
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
BACKOFF_FIRST, BACKOFF_MOST = 0.05, 1.0
_ACCEPT, _WAKE = "accept", "wake"
# the longest service name a client may ask for
MAX_SERVICE_NAME = 64


class ListenerError(OSError):
    """A listener cannot take the place it needs."""


class _Handshake:
    """A connection whose peer has not yet proved itself."""

    __slots__ = ("sock", "kind", "deadline", "received", "client_nonce", "server_nonce", "stream")

    def __init__(self, sock: socket.socket, kind: str):
        self.sock, self.kind = sock, kind
        self.deadline = time.monotonic() + HANDSHAKE_TIMEOUT
        self.received = b""
        self.client_nonce = self.server_nonce = None
        self.stream: Stream | None = None  # once proved over TCP: its stream, which has yet to name its service


class Listener:
    """A service of this process on ``host``: the streams that name it are
    given to ``serve(stream)``, on a thread of their own."""

    def __init__(self, host: str, serve, hand_off: bool = False, name: str = "service"):
        """``hand_off``: ``serve`` keeps the stream (a poller reads it) instead
        of serving it on the connection's thread until it ends."""
        self.serve, self.hand_off = serve, hand_off
        key = (os.getpid(), host)
        with _gates_lock:
            gate = _gates.get(key)
            if gate is None or gate.closed:  # the first service on host, or in a forked child
                gate = _gates[key] = _Gate(host)
            self._gate, self.name = gate, gate.add(name, self)
        self.address = f"{gate.address}/{self.name}"

    def close(self) -> None:
        """Take no more streams for this service (those it has go on); the gate
        closes with its last service."""
        with _gates_lock:
            last = self._gate.remove(self.name)
        if last:
            self._gate.close()


_gates: dict[tuple[int, str], _Gate] = {}
_gates_lock = threading.Lock()


class _Gate:
    """Accepts streams on ``host`` for the services added to it."""

    def __init__(self, host: str):
        self._services: dict[str, Listener] = {}
        self._names = itertools.count(1)
        self._secret = auth.run_secret()
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self._sock.listen(128)
        bound_host, port = self._sock.getsockname()[:2]
        self.address = f"{bound_host}:{port}"
        self._local = self._listen_locally() if LOCAL_SOCKETS else None
        self._channels = {kind: auth.channel(kind, self.address) for kind in ("tcp", "unix")}
        self._pending: dict[socket.socket, _Handshake] = {}  # oldest first
        self._paused: dict[socket.socket, float] = {}  # listening sockets resting after accept() failed
        self._backoff = BACKOFF_FIRST
        self._closed = False
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._selector.register(self._wake_read, selectors.EVENT_READ, _WAKE)
        for sock in (self._sock, self._local):
            if sock is not None:
                sock.setblocking(False)
                self._selector.register(sock, selectors.EVENT_READ, _ACCEPT)
        self._thread = threading.Thread(target=self._run, name="fiberrl-stream-gate", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closed

    def add(self, name: str, service: Listener) -> str:
        unique = f"{name}-{next(self._names)}"
        self._services[unique] = service
        return unique

    def remove(self, name: str) -> bool:
        """Whether that was the last service: then the gate is closed (under the same lock as
        adding, so no service joins a gate that is closing)."""
        self._services.pop(name, None)
        if self._services or self._closed:
            return False
        self._closed = True
        return True

    def _listen_locally(self) -> socket.socket | None:
        local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            local.bind(auth.local_name(self.address))
            local.listen(128)
            return local
        except OSError as exc:
            local.close()
            if exc.errno == errno.EADDRINUSE:
                # the name is the run's own: a holder outside it cannot have computed it
                self._sock.close()
                log.error("the local socket name of the listener at %s is held by another process", self.address)
                raise ListenerError(exc.errno, f"the local socket name of the listener at {self.address} is held "
                                               "by another process; refusing to listen beside it") from None
            log.debug("no local socket for %s: %s", self.address, exc)
            return None

    # --- the gate ---------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closed:
                for key, _ in self._selector.select(self._until_next_deadline()):
                    try:
                        self._on_ready(key)
                    except Exception:  # the gate must outlive whatever one connection does
                        log.exception("the listener at %s failed to handle a connection", self.address)
                        if isinstance(key.data, _Handshake):
                            self._forget(key.data)
                self._drop_expired()
                self._resume_accepting()
        finally:
            for handshake in list(self._pending.values()):
                self._forget(handshake)
            self._selector.close()
            for sock in (self._sock, self._local, self._wake_read, self._wake_write):
                if sock is not None:
                    _close(sock)

    def _on_ready(self, key) -> None:
        if key.data is _ACCEPT:
            self._accept_all(key.fileobj)
        elif key.data is _WAKE:
            self._wake_read.recv(64)
        else:
            self._advance(key.data)

    def _until_next_deadline(self) -> float | None:
        # the oldest handshake's deadline comes first (not a list of them all: thousands may wait)
        times = [next(iter(self._pending.values())).deadline] if self._pending else []
        times += self._paused.values()
        return max(0.0, min(times) - time.monotonic()) if times else None

    def _accept_all(self, listening: socket.socket) -> None:
        for _ in range(64):  # then let the others waiting in the handshake have their turn
            try:
                sock, _ = listening.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _EXHAUSTED:
                    self._rest(listening, exc)
                    return
                if self._closed:
                    return
                continue  # that connection was aborted before it was accepted; the next may not be
            self._backoff = BACKOFF_FIRST
            self._begin(sock)

    def _rest(self, listening: socket.socket, exc: OSError) -> None:
        """Stop accepting on ``listening`` for a while: the connections wait in the backlog."""
        log.warning("the listener at %s cannot accept a connection now (%s); trying again in %.2f s",
                    self.address, exc.strerror or exc, self._backoff)
        self._selector.unregister(listening)
        self._paused[listening] = time.monotonic() + self._backoff
        self._backoff = min(BACKOFF_MOST, self._backoff * 2)

    def _resume_accepting(self) -> None:
        now = time.monotonic()
        for listening, when in list(self._paused.items()):
            if when <= now:
                del self._paused[listening]
                self._selector.register(listening, selectors.EVENT_READ, _ACCEPT)

    def _begin(self, sock: socket.socket) -> None:
        kind = "unix" if sock.family == socket.AF_UNIX else "tcp"
        if kind == "unix":
            trusted, who = auth.peer_trusted(sock)
            if not trusted:
                log.warning("refused a local connection to %s from %s, not this run's user", self.address, who)
                sock.close()
                return
        if len(self._pending) >= MAX_HANDSHAKES:
            log.debug("dropped a connection to %s still in its handshake: %d are waiting",
                      self.address, len(self._pending))
            self._forget(self._to_drop())
        sock.setblocking(False)
        handshake = _Handshake(sock, kind)
        self._pending[sock] = handshake
        self._selector.register(sock, selectors.EVENT_READ, handshake)

    def _to_drop(self) -> _Handshake:
        """The oldest handshake whose peer has sent nothing, else the oldest: a client of
        the run sends its nonce as soon as it is connected, a flood's peers need not."""
        for handshake in self._pending.values():
            if not handshake.received and handshake.client_nonce is None:
                return handshake
        return next(iter(self._pending.values()))

    def _advance(self, handshake: _Handshake) -> None:
        """Read what has come of the client's nonce or proof, and answer it once whole."""
        if handshake.stream is not None:
            self._name(handshake)
            return
        try:
            data = handshake.sock.recv(_PART_BYTES - len(handshake.received))
        except BlockingIOError:
            return
        except OSError as exc:
            log.debug("a connection to %s closed during its handshake (%s)", self.address, exc)
            self._forget(handshake)
            return
        if not data:
            self._forget(handshake)
            return
        handshake.received += data
        if handshake.received[:_LENGTH.size] != _PART_HEAD[:len(handshake.received)]:
            return self._refuse(handshake, "a handshake frame of the wrong size")
        if len(handshake.received) < _PART_BYTES:
            return
        part, handshake.received = handshake.received, b""
        channel = self._channels[handshake.kind]
        if handshake.client_nonce is None:
            self._challenge(handshake, part[_LENGTH.size:], channel)
        elif auth.verify(auth.client_proof(self._secret, handshake.server_nonce, handshake.client_nonce, channel),
                         part[_LENGTH.size:]):
            self._admit(handshake)
        else:
            self._refuse(handshake, "wrong proof")

    def _challenge(self, handshake: _Handshake, client_nonce: bytes, channel: bytes) -> None:
        handshake.client_nonce, handshake.server_nonce = client_nonce, auth.new_nonce()
        proof = auth.server_proof(self._secret, client_nonce, handshake.server_nonce, channel)
        challenge = _LENGTH.pack(CHALLENGE_BYTES) + handshake.server_nonce + proof
        try:
            sent = handshake.sock.send(challenge)  # a fresh socket's buffer takes it whole
        except OSError:
            sent = 0
        if sent != len(challenge):
            self._forget(handshake)

    def _refuse(self, handshake: _Handshake, why: str) -> None:
        log.warning("closed a stream to %s that failed authentication (%s)", self.address, why)
        self._forget(handshake)

    def _forget(self, handshake: _Handshake) -> None:
        self._pending.pop(handshake.sock, None)
        try:
            self._selector.unregister(handshake.sock)
        except (KeyError, ValueError):
            pass
        if handshake.stream is not None:
            handshake.stream.close()
        else:
            handshake.sock.close()

    def _drop_expired(self) -> None:
        now = time.monotonic()
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if oldest.deadline > now:
                return
            log.debug("dropped a connection to %s whose handshake took over %s s", self.address, HANDSHAKE_TIMEOUT)
            self._forget(oldest)

    def _admit(self, handshake: _Handshake) -> None:
        """The peer has proved itself.  Over TCP its MACs are set up here, and the gate waits for the
        name of the service it asks for (as for its proof, without blocking): a service that keeps
        its streams takes it on this thread (a thread each cost the master of thousands of workers
        ~0.7 ms a connection).  A stream to any other service, or over a Unix socket (whose pipe
        and ring are set up in blocking steps), gets a thread of its own."""
        if handshake.kind == "tcp":
            stream = self._finish(handshake)
            if stream is None:
                self._pending.pop(handshake.sock, None)
                self._selector.unregister(handshake.sock)
                return
            handshake.stream = stream
            self._name(handshake)
            return
        del self._pending[handshake.sock]
        self._selector.unregister(handshake.sock)
        threading.Thread(target=self._finish_and_serve, args=(handshake,), name="fiberrl-stream",
                         daemon=True).start()

    def _name(self, handshake: _Handshake) -> None:
        """A proved TCP stream's service name, if it has come: the stream goes to that service."""
        stream = handshake.stream
        try:
            asked = stream.recv_ready(limit=MAX_SERVICE_NAME, most=1)
        except PeerMisbehaved as exc:
            log.warning("closed a stream from %s that misbehaved after its proof (%s)", stream.peer, exc)
            self._forget(handshake)
            return
        except (OSError, LinkError) as exc:
            log.debug("a stream from %s closed as it named its service (%s)", stream.peer, exc)
            self._forget(handshake)
            return
        if not asked:
            return  # not yet: the selector says when more comes
        self._pending.pop(handshake.sock, None)
        self._selector.unregister(handshake.sock)
        service = self._service(stream, asked[0])
        if service is None:
            return
        if service.hand_off:
            service.serve(stream)
        else:
            threading.Thread(target=self._serve, args=(stream, service), name="fiberrl-stream", daemon=True).start()

    def _finish(self, handshake: _Handshake) -> Stream | None:
        """The stream of a proved peer, its pipe and ring (Unix) or MACs (TCP) set up; None if it failed."""
        sock = handshake.sock
        sock.setblocking(True)
        sock.settimeout(HANDSHAKE_TIMEOUT)
        stream = Stream(sock, peer="a local process" if handshake.kind == "unix" else None)
        try:
            if handshake.kind == "unix":
                stream.await_ring()
                stream.trust_ring()
                stream.offer_ring()
                stream.take_offer()
            else:
                stream.sign_frames(*auth.session_signers(self._secret, handshake.client_nonce, handshake.server_nonce,
                                                         self._channels["tcp"], is_client=False))
            stream.handshake_done()
        except PeerMisbehaved as exc:
            log.warning("closed a stream from %s that misbehaved after its proof (%s)", stream.peer, exc)
            stream.close()
            return None
        except (OSError, LinkError) as exc:
            # most often a job killed while it connected (a pool terminated as its workers start)
            log.debug("a stream from %s closed during its handshake (%s)", stream.peer, exc)
            stream.close()
            return None
        return stream

    def _service(self, stream: Stream, asked: bytes) -> Listener | None:
        """The service a stream named, or None (the stream closed)."""
        name = bytes(asked).decode("ascii", "replace")
        service = self._services.get(name)
        if service is None:  # gone (a pool terminated as its workers connect) or never here
            log.debug("a stream from %s asked for %r, which %s does not serve", stream.peer, name, self.address)
            stream.close()
        return service

    # --- a proved peer's thread -------------------------------------------
    def _finish_and_serve(self, handshake: _Handshake) -> None:
        stream = self._finish(handshake)
        if stream is not None:
            self._serve(stream, None)

    def _serve(self, stream: Stream, service: Listener | None) -> None:
        """Serve ``stream`` (``service``: the one it named; None: read its name first)."""
        if service is None:
            try:
                asked = stream.recv(limit=MAX_SERVICE_NAME)
            except PeerMisbehaved as exc:
                log.warning("closed a stream from %s that misbehaved after its proof (%s)", stream.peer, exc)
                stream.close()
                return
            except (OSError, LinkError) as exc:
                log.debug("a stream from %s closed before it named its service (%s)", stream.peer, exc)
                stream.close()
                return
            service = self._service(stream, asked)
            if service is None:
                return
        if service.hand_off:
            service.serve(stream)
            return
        try:
            service.serve(stream)
        except LinkError:
            pass
        finally:
            stream.close()

    def close(self) -> None:
        self._closed = True
        try:
            self._wake_write.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
