"""A job's link to the process that started it: one authenticated stream
(:mod:`fiberrl.runtime.net.stream`) over which the job fetches its launch
payload, reports errors, forwards its output and sends heartbeats.

Every job opens this link first: one stream, ~0.5 ms of the job's CPU and
no thread of its own (the job's lifeline watches it).  On the parent's side
one thread reads the links of all its jobs.

Requests are answered in the order sent, one at a time: a request is the op
byte and its body; a reply is the status byte and its payload.
"""
from __future__ import annotations

import select
import threading
import time

from ..net.errors import LinkError, PeerGone
from ..net.listener import Listener
from ..net.dial import connect
from ..net.stream import Stream
from ..net.stream_pump import StreamPump
from ..net.transport import ERROR

# the kernel says a peer hung up without a byte being read (Linux; elsewhere a heartbeat finds out)
_HANG_UP = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)


# how long the links' reader rests between polls: thousands of jobs' beats are then read a few
# dozen to a poll instead of one, and a job's request waits at most this long more
LINGER = 0.005


class ChildLink:
    """One job's link as its parent sees it: when the job last spoke over it (its heartbeat
    every ``lifeline.beat_interval()``) and, once it asked for its task, which process it is."""
    __slots__ = ("stream", "heard", "process_id")

    def __init__(self, stream: Stream):
        self.stream = stream
        self.heard = time.monotonic()
        self.process_id: bytes | None = None


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
        if link is not None:
            self._pump.drop(link.stream, link)

    def _on_closed(self, _stream: Stream, link: ChildLink) -> None:
        if link.process_id is not None and self._named.get(link.process_id) is link:
            del self._named[link.process_id]

    def _on_frames(self, stream: Stream, link: ChildLink, frames) -> None:
        link.heard = time.monotonic()
        for frame in frames:
            try:
                answer = self._handle(frame[0], memoryview(frame)[1:], link) if frame else (ERROR, b"")
            except Exception as exc:  # a bad request must not end the links of every job
                answer = ERROR, repr(exc).encode()
            if answer is None:  # a heartbeat: heard, and not answered
                continue
            status, payload = answer
            try:
                stream.send([bytes((status,)), payload])
            except LinkError:
                return  # the job is gone

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
        self._lock = threading.Lock()
        self._lost = threading.Event()

    def request(self, op: int, body=b"", timeout: float | None = None) -> tuple[int, memoryview]:
        """Send one request and wait for its reply: (status, payload)."""
        with self._lock:
            if self._lost.is_set():
                raise PeerGone(f"the parent at {self.address} is gone")
            try:
                self._stream.send([bytes((op,)), body])
                reply = self._stream.recv() if timeout is None else self._reply_within(timeout)
            except LinkError as exc:
                self._lost.set()
                raise PeerGone(str(exc)) from None
        if not reply:
            raise PeerGone(f"the parent at {self.address} sent an empty reply")
        return reply[0], memoryview(reply)[1:]

    def _reply_within(self, timeout: float) -> bytearray:
        deadline = time.monotonic() + timeout
        poller = select.poll()
        poller.register(self._stream.fileno(), select.POLLIN | _HANG_UP)
        while True:
            # what has arrived may be part of the reply: read what is there, then wait
            # for the stream itself
            frames = self._stream.recv_ready(most=1)
            if frames:
                return frames[0]
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                self._lost.set()
                raise TimeoutError(f"the parent at {self.address} did not answer in {timeout} s")

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
