"""Authenticated framed streams: every connection of the runtime (a pool's
workers, managers, queues and pipes, a job's link to its parent).

A stream is a plain socket read by the thread that waits for it: frames of
``length (8 bytes) | body`` after a mutual HMAC challenge
(:mod:`fiberrl.runtime.net.auth`), so nothing is read from a peer that has not
proved it holds the run's secret.  A frame passes through no other thread
on its way: a request's round trip takes ~18 us.

On Linux a listener also binds an abstract Unix socket whose name only the
run can compute from its TCP address (:func:`auth.local_name`), and
``connect`` tries it first: a peer in the same network namespace (the same
host, for local and Slurm jobs) then skips the TCP stack, whose loopback
send costs ~20 us against ~2.5 us here.  Elsewhere the name does not exist
and the connection goes over TCP.  Either way the peer must pass the same
handshake, bound to the kind of connection and the listener's address;
over a Unix socket both sides also check the other runs as their user, and
over TCP every frame after the handshake carries a MAC under the session's
keys (:class:`auth.FrameSigner`), which a party on the network path cannot
forge.  The listener's side of the handshake is in :mod:`.listener`, the
client's in :mod:`.dial`.  Over a Unix socket, once both have passed it, each
side hands the other the read end of a pipe its frames then go through,
and a ring of shared memory its large frames then lie in
(:mod:`fiberrl.runtime.net.shared_frames`); the socket is closed.

Why a pipe: a Unix stream socket wakes a reader blocked on it whenever the
peer consumes what the reader sent (the "write space" wakeup shares the
socket's wait queue; a pipe's readers and writers wait apart), and its calls
cost more.  gymnasium's AsyncVectorEnv, moved from its socket pairs to
pipes, stepped 1.06-1.08x as fast on Breakout and 1.18x on CartPole with
2 to 8 envs here (0.89x with one: that spare wakeup keeps the learner's
virtual CPU from going to sleep between a call and its reply).
A pipe's reader does not see it end while a process forked from the writer
still holds the write end (a socket's shutdown ends it regardless), so
``close`` writes a last word that says so.
"""
from __future__ import annotations

import array
import fcntl
import logging
import os
import select
import socket
import stat
import struct
import sys
import threading

from . import auth, shared_frames
from .errors import LinkClosed, LinkError, PeerGone, PeerMisbehaved

log = logging.getLogger("fiberrl.stream")

_LENGTH = struct.Struct("<Q")
HANDSHAKE_TIMEOUT = 10.0
# a server's challenge: its nonce and its proof
CHALLENGE_BYTES = 2 * auth.NONCE_BYTES
# larger frames are refused: a corrupt length must not allocate the machine's memory
MAX_FRAME = 1 << 36
READ_BUFFER = 1 << 16
# a stream's read buffer starts this small and grows to READ_BUFFER once its frames or its reads
# need it: a master holds two streams a worker, most of which only ever carry small frames
# (heartbeats, requests for work), and 64 KiB each made 128 KiB of its memory a worker
FIRST_READ_BUFFER = 1 << 12
SMALL_FRAME = 1 << 14
LOCAL_SOCKETS = sys.platform == "linux"
# TCP keepalive (idle seconds, seconds between probes, probes): a peer whose host vanished (cut off
# and given up, powered off) sends no FIN, and an idle connection of its (a queue's) would stay open,
# and what the hub keeps for it held, for ever.  One with data in flight is given up only when TCP's
# resends are (~15 minutes): TCP_USER_TIMEOUT would end it sooner, but it also ends a connection to a
# peer that is alive and only reads slowly (measured: a send blocked 10 s on a reader that was not
# reading was dropped), where a blocked send must wait as long as it takes.
KEEPALIVE = (15, 5, 3)
# flags in a frame's length word: the body is where the frame lies in the
# peer's ring; the frame hands over the sender's ring and pipe (or declines
# them); the sender has closed the stream
IN_RING = 1 << 63
RING_OFFER = 1 << 62
CLOSING = 1 << 61
_FLAGS = IN_RING | RING_OFFER | CLOSING
# what an offer carries, in the length bits of its word; its fds come in this order
OFFER_RING, OFFER_PIPE = 1, 2
_FD_SPACE = socket.CMSG_SPACE(4 * array.array("i").itemsize) if hasattr(socket, "CMSG_SPACE") else 0


def _keep_alive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), KEEPALIVE):
        if hasattr(socket, option):  # Linux's names; elsewhere the system's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class Stream:
    """One authenticated connection; ``send`` is thread-safe, ``recv`` is for one reader at a time."""

    def __init__(self, sock: socket.socket, peer: str | None = None):
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _keep_alive(sock)
        self.sock = sock
        self._send_lock = threading.Lock()
        # frames are read through this buffer: a small one costs one system call, not two
        self._buf = bytearray(FIRST_READ_BUFFER)
        self._view = memoryview(self._buf)
        self._start = self._end = 0
        self._large: tuple[bytearray, int] | None = None
        self._drained = False
        # shared memory for large frames, once the peer has proved itself (Unix sockets only)
        self._ring_out: shared_frames.RingWriter | None = None
        self._ring_in: shared_frames.RingReader | None = None
        self._offer_due = False  # the peer's ring offer is on its way: fds may come with any read
        self._offer_allowed = False
        self._offer_taken = False
        self._fds: list[int] = []
        # once offered and taken: this side's frames are written to _pipe_out, the peer's read from _pipe_in
        self._pipe_out: int | None = None
        self._pipe_in: int | None = None
        self._pipe_poll = None  # a poll of _pipe_in, for reads that must not block
        # over TCP, once the handshake is done: MACs of the frames sent and received
        self._signer: auth.FrameSigner | None = None
        self._checker: auth.FrameSigner | None = None
        self._close_lock = threading.Lock()
        self._closed_here = False
        # the largest frame taken from the peer when a read names no limit
        self.max_frame = MAX_FRAME
        if peer is not None:
            self.peer = peer
            return
        try:
            host, port = sock.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except (OSError, ValueError):
            self.peer = "an unconnected peer"

    def send(self, parts) -> None:
        """Send one frame made of ``parts`` (contiguous buffers); large parts are not copied."""
        size = 0
        for part in parts:
            size += len(part) if type(part) is bytes else memoryview(part).nbytes
        if self._signer is not None:
            self._send_signed(parts, size)
            return
        if size <= SMALL_FRAME:  # one copy costs less than a scatter list
            data = _LENGTH.pack(size) + b"".join(parts)
            try:
                with self._send_lock:
                    self._write([data])
            except OSError as exc:
                raise self._lost(exc) from None
            return
        views = [memoryview(p).cast("B") for p in parts]
        try:
            with self._send_lock:
                # placed in the ring under the lock: frames must lie in the order they are sent
                ring = self._ring_out
                where = ring.put(views, size) if ring is not None else None
                if where is not None:
                    self._write([_LENGTH.pack(IN_RING | size) + where])
                    return
                views.insert(0, memoryview(_LENGTH.pack(size)))
                self._write(views)
        except OSError as exc:
            raise self._lost(exc) from None

    def _send_signed(self, parts, size: int) -> None:
        """Send one frame with its MAC after it (signed under the lock: frames are numbered in the order sent)."""
        head = _LENGTH.pack(size + auth.MAC_BYTES)
        try:
            if size <= SMALL_FRAME:
                # a small frame in one buffer: parts sent apart may leave as segments of their own, and
                # one buffer is signed in 1.5 us where a MAC over parts takes 9 (a new cipher context)
                body = b"".join(parts)
                with self._send_lock:
                    self._write([head + body + self._signer.sign([body])])
                return
            views = [memoryview(p).cast("B") for p in parts]
            with self._send_lock:
                tag = self._signer.sign(views)
                self._write([head, *views, tag])
        except OSError as exc:
            raise self._lost(exc) from None

    def sign_frames(self, signer: auth.FrameSigner, checker: auth.FrameSigner) -> None:
        """From now on every frame sent carries a MAC, and every frame received must."""
        self._signer, self._checker = signer, checker

    def _opened(self, frame: bytearray) -> bytearray:
        """A frame received, its MAC checked and taken off (where frames carry one)."""
        checker = self._checker
        if checker is None:
            return frame
        if len(frame) < auth.MAC_BYTES:
            raise PeerMisbehaved(f"{self.peer} sent a frame too short to carry its MAC")
        tag = bytes(frame[-auth.MAC_BYTES:])
        del frame[-auth.MAC_BYTES:]
        if not checker.check(frame, tag):
            log.warning("closing the stream with %s: a frame's MAC does not match (a party without the "
                        "run's secret is on the connection)", self.peer)
            raise PeerMisbehaved(f"{self.peer} sent a frame whose MAC does not match: "
                                 "a party without the run's secret is on the connection")
        return frame

    def _write(self, parts: list) -> None:
        """Write ``parts`` whole, to this side's pipe once there is one, else to the socket
        (with the send lock held)."""
        fd = self._pipe_out
        while parts:
            sent = os.writev(fd, parts) if fd is not None else self.sock.sendmsg(parts)
            while parts and sent >= len(parts[0]):
                sent -= len(parts[0])
                parts.pop(0)
            if sent:
                parts[0] = parts[0][sent:]

    def recv(self, limit: int | None = None) -> bytearray:
        """The next frame's body, in a fresh writable buffer; PeerMisbehaved if it
        exceeds ``limit`` (by default ``max_frame``)."""
        return self._next_frame(self.max_frame if limit is None else limit, wait=True)

    def recv_ready(self, limit: int | None = None, most: int = 64) -> list[bytearray]:
        """The frames that have arrived (up to ``most``), read without blocking: for a poller."""
        frames = []
        self._drained = False
        limit = self.max_frame if limit is None else limit
        while len(frames) < most:
            frame = self._next_frame(limit, wait=False)
            if frame is None:
                break
            frames.append(frame)
        return frames

    def _next_frame(self, limit: int, wait: bool, until_offer: bool = False) -> bytearray | None:
        """The next frame; None if ``wait`` is false and it has not fully arrived, or
        if ``until_offer`` and the peer's offer was the next frame."""
        while True:
            if self._large is not None:  # a frame larger than the read buffer, read into its own
                body, got = self._large
                view = memoryview(body)
                while got < len(body):
                    n = self._recv_into(view[got:], wait)
                    if n is None:
                        self._large = (body, got)
                        return None
                    got += n
                self._large = None
                view.release()  # the frame may be cut to take its MAC off
                return self._opened(body)
            held = self._end - self._start
            if held >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(self._buf, self._start)
                flags = 0
                most = limit if self._checker is None else limit + auth.MAC_BYTES
                if length & _FLAGS:
                    flags, size = length & _FLAGS, length & ~_FLAGS
                    if flags == CLOSING:
                        raise PeerGone(f"{self.peer} closed the connection")
                    length = shared_frames.WHERE.size if flags == IN_RING else 0
                    if size > limit:
                        raise PeerMisbehaved(f"{self.peer} sent a frame of {size} bytes: refused")
                elif length > most:
                    raise PeerMisbehaved(f"{self.peer} sent a frame of {length} bytes: refused")
                begin = self._start + _LENGTH.size
                if held - _LENGTH.size >= length:
                    self._start = begin + length
                    if not flags:
                        return self._opened(bytearray(self._view[begin:self._start]))
                    ring = self._ring_in
                    if flags == IN_RING and ring is not None:
                        try:
                            return ring.take(self._view[begin:self._start], size)
                        except ValueError as exc:
                            raise PeerMisbehaved(f"{self.peer} sent a frame outside its ring: {exc}") from None
                    self._take_offer(flags, size)
                    if until_offer:
                        return None
                    continue
                if _LENGTH.size + length > len(self._buf) and len(self._buf) < READ_BUFFER:
                    self._grow(_LENGTH.size + length)
                    continue
                if _LENGTH.size + length > len(self._buf):
                    body = bytearray(length)
                    body[:self._end - begin] = self._view[begin:self._end]
                    self._large = (body, self._end - begin)
                    self._start = self._end = 0
                    continue
            if self._start:  # make room at the end for the rest of the frame
                self._buf[:held] = self._view[self._start:self._end]
                self._start, self._end = 0, held
            room = len(self._buf) - self._end
            n = self._recv_into(self._view[self._end:], wait)
            if n is None:
                return None
            self._end += n
            if n == room and len(self._buf) < READ_BUFFER:  # more may be waiting: read more at once next time
                self._grow(2 * len(self._buf))

    def _grow(self, size: int) -> None:
        """A larger read buffer (at most READ_BUFFER), holding what the old one held unread."""
        size = min(READ_BUFFER, max(size, 2 * len(self._buf)))
        held = self._end - self._start
        buf = bytearray(size)
        buf[:held] = self._view[self._start:self._end]
        self._buf, self._view = buf, memoryview(buf)
        self._start, self._end = 0, held

    def _recv_into(self, view, wait: bool) -> int | None:
        if not wait and self._drained:
            return None  # a short read just now: asking again would only say so
        try:
            n = self._read_some(view, wait)
        except BlockingIOError as exc:
            if not wait:
                return None
            raise self._lost(exc) from None
        except OSError as exc:
            raise self._lost(exc) from None
        if n is None:
            return None
        if not n:
            raise PeerGone(f"{self.peer} closed the connection")
        self._drained = n < view.nbytes
        return n

    def _read_some(self, view, wait: bool) -> int | None:
        """Read into ``view`` from the peer's pipe once there is one, else from the socket."""
        fd = self._pipe_in
        if fd is not None:
            # a blocking read returns what has come, so one that must not block asks first
            return os.readv(fd, [view]) if wait or self._pipe_poll.poll(0) else None
        flags = 0 if wait else socket.MSG_DONTWAIT
        return self._recv_with_fds(view, flags) if self._offer_due else self.sock.recv_into(view, 0, flags)

    def _recv_with_fds(self, view, flags: int) -> int:
        """Read as ``recv_into`` does, keeping file descriptors that come with the bytes
        (a plain read would close them)."""
        n, ancillary, _, _ = self.sock.recvmsg_into([view], _FD_SPACE, flags)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
                self._fds.extend(fds)
        return n

    def _take_offer(self, flags: int, kinds: int) -> None:
        """The peer's ring and pipe (or its word that it has neither) have come."""
        fds, self._fds, self._offer_due = self._fds, [], False
        if (flags != RING_OFFER or not self._offer_allowed or self._offer_taken
                or kinds & ~(OFFER_RING | OFFER_PIPE) or len(fds) != bin(kinds).count("1")):
            for fd in fds:
                os.close(fd)
            raise PeerMisbehaved(f"{self.peer} sent an offer it may not send now")
        self._offer_taken = True
        pipe = fds[-1] if kinds & OFFER_PIPE else None
        try:
            if kinds & OFFER_RING:
                try:
                    self._ring_in = shared_frames.RingReader(fds[0])
                except (OSError, ValueError) as exc:
                    raise PeerMisbehaved(f"{self.peer} sent a ring that cannot be mapped: {exc}") from None
            if pipe is not None:
                self._take_pipe(pipe)
                pipe = None
        finally:
            if pipe is not None:
                os.close(pipe)

    def _take_pipe(self, fd: int) -> None:
        if self._end > self._start:
            raise PeerMisbehaved(f"{self.peer} sent more on the socket after handing over its pipe")
        try:
            is_read_end = (stat.S_ISFIFO(os.fstat(fd).st_mode)
                           and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY)
        except OSError:
            is_read_end = False
        if not is_read_end:
            raise PeerMisbehaved(f"{self.peer} handed over something other than the read end of a pipe")
        os.set_inheritable(fd, False)
        self._pipe_poll = select.poll()
        self._pipe_poll.register(fd, select.POLLIN)
        self._pipe_in = fd

    def offer_ring(self) -> None:
        """Hand the peer (which has proved itself) a ring for this side's large frames and
        a pipe for all its frames from now on; only over a Unix socket, to a peer that expects it."""
        ring = None
        if shared_frames.AVAILABLE:
            try:
                ring = shared_frames.RingWriter()
            except OSError as exc:  # no shared memory to be had: large frames take the socket
                log.debug("no shared frame ring for %s: %s", self.peer, exc)
        # two fds per stream where the socket was one; a pipe's 64 KiB is left as it is (larger
        # ones count against the user's pipe-user-pages-soft, past which new pipes get 8 KiB)
        try:
            pipe_read, pipe_write = os.pipe()
        except OSError as exc:  # out of fds: this side's frames stay on the socket
            log.debug("no pipe for %s: %s", self.peer, exc)
            pipe_read = pipe_write = None
        fds = ([ring.fd] if ring is not None else []) + ([pipe_read] if pipe_read is not None else [])
        kinds = (OFFER_RING if ring is not None else 0) | (OFFER_PIPE if pipe_read is not None else 0)
        try:
            with self._send_lock:
                if fds:
                    socket.send_fds(self.sock, [_LENGTH.pack(RING_OFFER | kinds)], fds)
                else:
                    self.sock.sendall(_LENGTH.pack(RING_OFFER))
                self._pipe_out, pipe_write = pipe_write, None
        except OSError as exc:
            raise self._lost(exc) from None
        finally:
            if ring is not None:
                ring.detach()
            for fd in (pipe_read, pipe_write):
                if fd is not None:
                    os.close(fd)
        self._ring_out = ring

    def await_ring(self) -> None:
        """Over a Unix socket: the peer's ring offer may come with any read from now on."""
        self._offer_due = True

    def trust_ring(self) -> None:
        """The peer has proved itself: its ring offer is taken (before, it ends the stream)."""
        self._offer_allowed = True

    def take_offer(self) -> None:
        """Read the peer's offer, which comes before any frame of its own."""
        while self._offer_due:
            if self._next_frame(auth.NONCE_BYTES, wait=True, until_offer=True) is not None:
                raise PeerMisbehaved(f"{self.peer} sent a frame before its offer")

    def handshake_done(self) -> None:
        """From now on the stream blocks without limit; where both ways go through
        pipes, the socket has done its work and is closed."""
        self.sock.settimeout(None)
        if self._pipe_in is not None and self._pipe_out is not None:
            self.sock.close()

    def fileno(self) -> int:
        """What to poll for this stream's incoming frames."""
        fd = self._pipe_in
        return fd if fd is not None else self.sock.fileno()

    def readable(self, timeout: float | None) -> bool:
        """Whether a frame has started to arrive within ``timeout`` seconds."""
        if self._end > self._start:
            return True
        poller = select.poll()  # not select(): a pool's master may hold fds past 1024
        poller.register(self.fileno(), select.POLLIN)
        return bool(poller.poll(None if timeout is None else timeout * 1000))

    def _lost(self, exc: OSError) -> LinkError:
        if self._closed_here:
            return LinkClosed(f"this process closed its connection to {self.peer}")
        return PeerGone(f"connection to {self.peer} lost: {exc}")

    def close(self) -> None:
        self._closed_here = True
        with self._close_lock:
            pipe_in, pipe_out, self._pipe_in, self._pipe_out = self._pipe_in, self._pipe_out, None, None
        if pipe_out is not None:
            self._say_closing(pipe_out)
            os.close(pipe_out)
        if pipe_in is not None:
            os.close(pipe_in)
        _close(self.sock)
        self._ring_out = self._ring_in = None  # unmapped once no thread is copying through them
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def _say_closing(self, fd: int) -> None:
        """Tell the peer, which would not see the pipe's end while a process forked
        from this one holds it; not if a sender is in the middle of a frame, nor if the
        pipe is full (the peer has stopped reading)."""
        if not self._send_lock.acquire(blocking=False):
            return
        try:
            os.set_blocking(fd, False)
            os.write(fd, _LENGTH.pack(CLOSING))
        except OSError:
            pass
        finally:
            self._send_lock.release()


def _close(sock: socket.socket) -> None:
    """Close now, waking any thread blocked on the socket."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
