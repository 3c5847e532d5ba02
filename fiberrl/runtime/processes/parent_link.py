"""A job's link to the process that started it: one authenticated stream
(:mod:`fiberrl.runtime.net.stream`) over which the job fetches its launch
payload, reports errors, forwards its output and sends heartbeats.

Every job opens this link first: one stream, ~0.5 ms of the job's CPU and
no thread of its own (the job's lifeline watches it).  On the parent's side
one thread reads the links of all its jobs.

Requests are answered in the order sent, one at a time: a request is the op
byte and its body; a reply is :data:`REPLY`, the status byte and its payload.

A link may carry the protocol of a service of its parent as well (``CARRY``,
naming the service's address): a pool's worker speaks to its pool over its
link, so the master holds one stream a worker, not two.  Once the parent
says yes, the service's reader reads the link (its own frames, and the
link's requests, which it passes to :meth:`ChildLinks.answer`), and the job
reads both kinds of frame from it: whichever of its threads waits reads,
and files what is the other's where it finds it (replies over the link
begin with :data:`REPLY`, a byte no status of a service is).
"""
from __future__ import annotations

import os
import select
import threading
import time
from collections import deque

from ..net.errors import LinkError, PeerGone
from ..net.listener import Listener
from ..net.dial import connect
from ..net.stream import Stream
from ..net.stream_pump import StreamPump
from ..net.transport import ERROR, MISSING, OK

# the kernel says a peer hung up without a byte being read (Linux; elsewhere a heartbeat finds out)
_HANG_UP = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)


# the first byte of every reply over a link; the frames of a service the link carries begin otherwise
REPLY = 0xFF
# a job's request: from now on the link also carries the service at the address in the body (answered
# OK, or MISSING where the parent has no such service); the op codes of the link's other requests are the hub's
CARRY = 8

# how long the links' reader rests between polls: thousands of jobs' beats are then read a few
# dozen to a poll instead of one, and a job's request waits at most this long more
LINGER = 0.005


class ChildLink:
    """One job's link as its parent sees it: when the job last spoke over it (its heartbeat
    every ``lifeline.beat_interval()``), once it asked for its task which process it is, and once
    a service of the parent reads it (``CARRY``) how that service ends it."""
    __slots__ = ("stream", "heard", "process_id", "end")

    def __init__(self, stream: Stream):
        self.stream = stream
        self.heard = time.monotonic()
        self.process_id: bytes | None = None
        self.end = None


def _last_heard(link: ChildLink) -> float:
    """When the job last spoke: now, if what it sent waits to be read.  A parent too busy to read
    its links for a while (thousands of jobs starting at once) must not take its jobs for silent."""
    try:
        return time.monotonic() if link.stream.readable(0) else link.heard
    except (OSError, ValueError, LinkError):  # closed meanwhile: its end is being handled
        return link.heard


class ChildLinks:
    """The parent's side: accepts its jobs' links and answers their requests
    with ``handle(op, body, link) -> (status, payload)`` (None: no answer), on one thread for all."""

    def __init__(self, host: str, handle):
        self._handle = handle
        self._extra: list[Listener] = []
        self._named: dict[bytes, ChildLink] = {}
        self._carriers: dict[str, object] = {}  # services a link may carry, by address
        self._pump = StreamPump(self._on_frames, self._on_closed, "fiberrl-child-links", linger=LINGER)
        self._listener = Listener(host, self._adopt, hand_off=True, name="children")
        self.address = self._listener.address

    def listen(self, host: str) -> str:
        """Also accept links on ``host`` (a process whose jobs run on another backend)."""
        listener = Listener(host, self._adopt, hand_off=True, name="children")
        self._extra.append(listener)
        return listener.address

    def _adopt(self, stream: Stream) -> None:
        self._pump.add(stream, ChildLink(stream))

    def name(self, link: ChildLink, process_id: bytes) -> None:
        """``link`` is the job of process ``process_id`` (it asked for that process's task)."""
        link.process_id = process_id
        self._named[process_id] = link

    def heard(self, process_id: bytes) -> float | None:
        """When the job of ``process_id`` last spoke (``time.monotonic``); None while it has no link."""
        link = self._named.get(process_id)
        return None if link is None else _last_heard(link)

    def unheard_since(self, when: float) -> set[bytes]:
        """The processes whose jobs have not spoken since ``when``."""
        return {process_id for process_id, link in list(self._named.items())
                if link.heard < when and _last_heard(link) < when}

    def hang_up(self, process_id: bytes) -> None:
        """End the link of ``process_id``'s job: once it can hear, the job sees its parent gone
        and exits (its lifeline), so a job given up for lost cannot come back."""
        link = self._named.get(process_id)
        if link is None:
            return
        if link.end is not None:
            link.end()
        else:
            self._pump.drop(link.stream, link)

    def carry(self, address: str, take) -> None:
        """Let links carry the service at ``address``: ``take(stream, link)`` is given each link
        that asks to, and reads it from then on; it returns how to end that link (a callable),
        and calls :meth:`ended` once the link has ended."""
        self._carriers[address] = take

    def stop_carrying(self, address: str) -> None:
        self._carriers.pop(address, None)

    def ended(self, link: ChildLink) -> None:
        """A link read by a service has ended."""
        if link.process_id is not None and self._named.get(link.process_id) is link:
            del self._named[link.process_id]

    def _on_closed(self, _stream: Stream, link: ChildLink) -> None:
        self.ended(link)

    def _on_frames(self, stream: Stream, link: ChildLink, frames) -> None:
        for i, frame in enumerate(frames):
            if frame and frame[0] == CARRY:
                self.answer(stream, link, frames[:i])
                take = self._carriers.get(bytes(frame[1:]).decode("utf-8", "replace"))
                if take is None:
                    self._send(stream, MISSING, b"")
                    return self.answer(stream, link, frames[i + 1:])
                # the job sends nothing of the service before this answer, and its link's next
                # request only after it: the rest of this batch, if any, is the link's, answered here
                self._pump.release(stream)
                link.end = take(stream, link)
                self._send(stream, OK, b"")
                return self.answer(stream, link, frames[i + 1:])
        self.answer(stream, link, frames)

    def answer(self, stream: Stream, link: ChildLink, frames) -> None:
        """Answer the link's requests among ``frames`` (and count the job heard)."""
        link.heard = time.monotonic()
        for frame in frames:
            try:
                answer = self._handle(frame[0], memoryview(frame)[1:], link) if frame else (ERROR, b"")
            except Exception as exc:  # a bad request must not end the links of every job
                answer = ERROR, repr(exc).encode()
            if answer is None:  # a heartbeat: heard, and not answered
                continue
            if not self._send(stream, *answer):
                return  # the job is gone

    @staticmethod
    def _send(stream: Stream, status: int, payload) -> bool:
        try:
            stream.send([bytes((REPLY, status)), payload])
            return True
        except LinkError:
            return False

    def close(self) -> None:
        for listener in [self._listener, *self._extra]:
            listener.close()
        self._pump.close()


class ParentLink:
    """The job's side.  Thread-safe; ``PeerGone`` once the parent is gone.  A
    request that times out ends the link: its late reply would answer the next."""

    def __init__(self, address: str, connect_timeout: float):
        self.address = address
        try:
            self._stream = connect(address, timeout=connect_timeout)
        except (LinkError, OSError) as exc:
            raise PeerGone(f"cannot reach the parent at {address}: {exc}") from None
        self._lock = threading.Lock()  # one request at a time: sent, and its reply read
        self._lost = threading.Event()
        # the stream is read by whichever thread waits for a frame (a request's reply, or the carried
        # service's next frame), which files what is the other's here
        self._read = threading.Condition()
        self._reading = False
        self._replies: deque[bytearray] = deque()
        self._carried: deque[bytearray] = deque()
        self._error: LinkError | None = None

    def request(self, op: int, body=b"", timeout: float | None = None) -> tuple[int, memoryview]:
        """Send one request and wait for its reply: (status, payload)."""
        with self._lock:
            if self._lost.is_set():
                raise PeerGone(f"the parent at {self.address} is gone")
            try:
                self._stream.send([bytes((op,)), body])
                reply = self._next(True, timeout)
            except LinkError as exc:
                self._lost.set()
                raise PeerGone(str(exc)) from None
            except TimeoutError:
                self._lost.set()
                raise TimeoutError(f"the parent at {self.address} did not answer in {timeout} s") from None
        if len(reply) < 2 or reply[0] != REPLY:
            raise PeerGone(f"the parent at {self.address} sent a malformed reply")
        return reply[1], memoryview(reply)[2:]

    def _next(self, reply: bool, timeout: float | None) -> bytearray:
        """The next reply (``reply``) or frame of the carried service, read by this thread unless
        another reads: then it waits for that thread to file it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wanted = self._replies if reply else self._carried
        while True:
            with self._read:
                while True:
                    if wanted:
                        return wanted.popleft()
                    if self._error is not None:
                        raise type(self._error)(*self._error.args)
                    if not self._reading:
                        break
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError
                    self._read.wait(left)
                self._reading = True
            frame = None
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if left is not None and not self._stream.readable(left):
                    raise TimeoutError
                frame = self._stream.recv()
            except LinkError as exc:
                with self._read:
                    self._error = exc
                raise
            finally:
                with self._read:
                    self._reading = False
                    if frame is not None:
                        (self._replies if frame[:1] == _REPLY_BYTE else self._carried).append(frame)
                    self._read.notify_all()

    def tell(self, op: int, body=b"") -> None:
        """Send one message that wants no answer."""
        with self._lock:
            if self._lost.is_set():
                raise PeerGone(f"the parent at {self.address} is gone")
            try:
                self._stream.send([bytes((op,)), body])
            except LinkError as exc:
                self._lost.set()
                raise PeerGone(str(exc)) from None

    def carry(self, address: str, timeout: float) -> "CarriedStream | None":
        """The link, carrying the parent's service at ``address`` too (``CARRY``); None where the
        parent has no such service (any more)."""
        status, _ = self.request(CARRY, address.encode(), timeout=timeout)
        return CarriedStream(self) if status == OK else None

    def wait_lost(self, timeout: float) -> bool:
        """Block until the parent hangs up or ``timeout`` passes; True if it did."""
        if self._lost.is_set():
            return True
        poller = select.poll()
        try:
            poller.register(self._stream.fileno(), _HANG_UP)
        except (OSError, ValueError):  # closed
            return True
        if poller.poll(timeout * 1000):
            self._lost.set()
        return self._lost.is_set()

    @property
    def alive(self) -> bool:
        return not self._lost.is_set()

    def close(self) -> None:
        self._lost.set()
        self._stream.close()


_REPLY_BYTE = bytes((REPLY,))


class CarriedStream:
    """The frames of a service a job's link carries, as the service's code would use a stream of
    its own: ``send``, ``recv``; ``close`` leaves the link to the job's lifeline."""

    def __init__(self, link: ParentLink):
        self._link = link

    def send(self, parts) -> None:
        self._link._stream.send(parts)

    def recv(self) -> bytearray:
        return self._link._next(False, None)

    def close(self) -> None:
        pass


# this job's link to its parent (set by the job's entry point), for the services it may carry,
# with the process it is this job's in (a process forked from the job is not the job)
_this_job: tuple[int, ParentLink] | None = None


def set_job_link(link: ParentLink) -> None:
    global _this_job
    _this_job = os.getpid(), link


def job_link() -> ParentLink | None:
    """This job's link to its parent; None in a process that is no job of fiberrl's."""
    job = _this_job
    return job[1] if job is not None and job[0] == os.getpid() else None
