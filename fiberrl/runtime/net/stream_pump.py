"""Reads many streams at once -- a pool's workers, the links of a process's
jobs -- on whichever thread is waiting for a result.

A thread per worker made every result cross two threads before the caller
saw it (the worker's reader, then the caller woken by it); measured on the
1 ms task benchmark each crossing cost ~100 us on a busy machine.  Here a
caller blocked in ``AsyncResult.get`` polls the workers' streams itself and
handles what arrives, so its result reaches it on its own thread.  While no
caller waits (callbacks only, or the caller is busy elsewhere), a background
thread does the reading, so new work still reaches workers and lost workers
are still noticed.

On Linux each stream is armed one-shot in one epoll set: however many
threads poll, a stream is read by one of them at a time and its frames are
handled in order.  Elsewhere only the background thread reads.

What may take long (a pool's result runs its caller's callback) a handler
leaves for ``later``: it runs on the same thread once the stream's frames
are handled and the stream is armed again.  Once a handler or what it left
has held a thread reading for ``RELIEF_AFTER``, a relief thread reads until
it returns: the jobs' links a pool carries still have their pings answered
(the one whose result runs the callback too), and the workers their work.
"""
from __future__ import annotations

import logging
import os
import select
import selectors
import threading
import time

from .errors import LinkError
from .stream import Stream

log = logging.getLogger("fiberrl")
# frames read from one stream at a time, before the pump looks at the others
BATCH = 64
# how long after a caller stopped reading the background thread waits before
# taking over: a caller that comes straight back (the next get of a wave)
# finds the streams still its own
TAKEOVER_GRACE = 0.001
# once a caller has read this long without a break, the background thread sleeps until it leaves instead of
# looking every TAKEOVER_GRACE (a caller blocked on a long map woke it a thousand times a second)
PARK_AFTER = 0.01
# how often a guest reader (see StreamPump.wait) looks whether another thread completed its result
GUEST_SLICE = 0.01
# seconds a handler may hold the thread reading before the relief thread reads the other streams: well
# inside the quarter of heartbeat_timeout in which a job asks its parent for an answer (7.5 s at the default)
RELIEF_AFTER = 0.5


class _OneShotEpoll:
    shared = True

    def __init__(self):
        self._epoll = select.epoll()

    def add(self, fd: int, persistent: bool = False) -> None:
        self._epoll.register(fd, select.EPOLLIN | (0 if persistent else select.EPOLLONESHOT))

    def rearm(self, fd: int) -> None:
        self._epoll.modify(fd, select.EPOLLIN | select.EPOLLONESHOT)

    def remove(self, fd: int) -> None:
        self._epoll.unregister(fd)

    def poll(self, timeout: float | None) -> list[int]:
        return [fd for fd, _ in self._epoll.poll(-1 if timeout is None else timeout)]

    def close(self) -> None:
        self._epoll.close()


class _Selector:
    shared = False  # no one-shot arming: one reader only

    def __init__(self):
        self._selector = selectors.DefaultSelector()

    def add(self, fd: int, persistent: bool = False) -> None:
        self._selector.register(fd, selectors.EVENT_READ)

    def rearm(self, fd: int) -> None:
        pass

    def remove(self, fd: int) -> None:
        self._selector.unregister(fd)

    def poll(self, timeout: float | None) -> list[int]:
        return [key.fd for key, _ in self._selector.select(timeout)]

    def close(self) -> None:
        self._selector.close()


class StreamPump:
    """``on_frames(stream, key, frames)`` for what each stream sends and
    ``on_closed(stream, key)`` once when it ends, on the thread that read it."""

    def __init__(self, on_frames, on_closed, name: str, linger: float = 0.0):
        """``linger``: seconds the background thread rests after each poll, so that what many
        streams send in the meantime is read in one poll (for streams whose frames may wait)."""
        self._on_frames, self._on_closed = on_frames, on_closed
        self._linger = linger
        self._poller = _OneShotEpoll() if hasattr(select, "epoll") else _Selector()
        self._streams: dict[int, tuple[Stream, object]] = {}
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._poller.add(self._wake_read, persistent=True)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._caller: int | None = None  # the thread ident of the caller reading now
        self._caller_since = self._caller_left = 0.0
        self._parked = False  # the background thread sleeps until the caller leaves
        self._event_waiters = 0  # callers waiting for another caller's reading
        self._closed = False
        # .fds: the streams this thread is handling frames of; .later: what their handlers left for after;
        # .in_later: how deep this thread is in running what was left
        self._handling = threading.local()
        self._let_go: set[int] = set()  # ids of streams released while ``add`` handled their first frames
        self._handler_since: dict[int, float] = {}  # by thread: when the handler it runs began
        self._began = threading.Event()  # a handler began since the relief thread last looked
        self._ending = threading.Event()
        self._thread = threading.Thread(target=self._background, name=name, daemon=True)
        self._thread.start()
        self._relief = None
        if self._poller.shared:  # elsewhere one thread only may read
            self._relief = threading.Thread(target=self._relieve, name=f"{name}-relief", daemon=True)
            self._relief.start()

    def add(self, stream: Stream, key) -> None:
        # what arrived with the handshake may already sit in the stream's buffer, where
        # epoll cannot see it: handle it here, before any poller may read the stream
        while True:
            try:
                frames = stream.recv_ready(most=BATCH)
            except LinkError:
                stream.close()
                self._on_closed(stream, key)
                return
            if frames:
                self._on_frames(stream, key, frames)
            with self._lock:
                if id(stream) in self._let_go:  # a handler of those frames gave it to another reader
                    self._let_go.discard(id(stream))
                    return
            if len(frames) < BATCH:
                break
        fd = stream.fileno()
        with self._lock:
            if self._closed:
                stream.close()
                return
            if fd >= 0:  # else closed meanwhile (by a handler of those frames, or another thread)
                self._streams[fd] = (stream, key)
                self._poller.add(fd)
                return
        stream.close()
        self._on_closed(stream, key)

    def wait(self, done, timeout: float | None) -> bool | None:
        """Read and handle frames on this thread until ``done()`` or ``timeout``
        (False); None where this thread cannot read (another caller does and
        this thread runs no callback, or the platform allows one reader only):
        then wait for ``done`` otherwise."""
        me = threading.get_ident()
        in_callback = bool(getattr(self._handling, "fds", ()) or getattr(self._handling, "in_later", 0))
        with self._lock:
            if not self._poller.shared or self._closed:
                return None
            guest = self._caller not in (None, me)
            if guest and not in_callback:
                return None
            # a guest: a callback that waits, run by the thread that was reading while
            # another caller reads too (the background thread); what the caller waits
            # for may come only once it returns, so it reads alongside, one-shot arming
            # keeping each stream to one reader, and looks at its result every slice
            nested = self._caller == me
            if not guest and not nested:
                self._caller, self._caller_since = me, time.monotonic()
        # called from a callback while this thread handles a stream's frames: that
        # stream is disarmed until they are handled, yet the result waited for may
        # come over it (the task went to the worker whose result ran the callback)
        for fd in getattr(self._handling, "fds", ()):
            self._rearm(fd)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not done():
                if self._closed:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if guest:
                    remaining = GUEST_SLICE if remaining is None else min(remaining, GUEST_SLICE)
                self._poll_once(remaining)
            return True
        finally:
            if not nested and not guest:
                with self._lock:
                    self._caller = None
                    self._caller_left = time.monotonic()
                    if self._event_waiters or self._parked:
                        self._changed.notify_all()  # they need a reader now

    def result_ready(self) -> None:
        """A result was completed: wake the caller reading, unless this is it
        (a worker loss or a terminate completes results on other threads)."""
        caller = self._caller
        if caller is not None and caller != threading.get_ident():
            self._wake()

    def waiting_on_another(self, delta: int) -> None:
        """Count a caller that waits on its result while another caller reads."""
        with self._lock:
            self._event_waiters += delta

    def _background(self) -> None:
        while True:
            with self._lock:
                while not self._closed and self._poller.shared:
                    if self._caller is not None:
                        if time.monotonic() - self._caller_since < PARK_AFTER:
                            self._changed.wait(TAKEOVER_GRACE)  # gets in a row: it may leave any moment
                            continue
                        self._parked = True
                        self._changed.wait()  # it wakes this thread as it leaves
                        self._parked = False
                    elif not self._event_waiters and time.monotonic() - self._caller_left < TAKEOVER_GRACE:
                        self._changed.wait(TAKEOVER_GRACE)
                    else:
                        break
                if self._closed:
                    return
            self._poll_once(None)
            if self._caller is not None:
                self._wake()  # what it read may be what the caller waits for
            if self._linger:
                time.sleep(self._linger)

    def later(self, call) -> None:
        """Run ``call`` on this thread once the frames it handles are handled and their stream is
        armed again (it may take long: a result's callback); at once where it handles none."""
        pending = getattr(self._handling, "later", None)
        if pending is None:
            call()
        else:
            pending.append(call)

    def _run_later(self, calls: list) -> None:
        outermost = self._held_from()
        self._handling.in_later = getattr(self._handling, "in_later", 0) + 1
        try:
            for call in calls:
                try:
                    call()
                except Exception:
                    log.exception("a call left for after a stream's frames failed")
        finally:
            self._handling.in_later -= 1
            self._held_until(outermost)

    def _held_from(self) -> bool:
        """Note that this thread, reading, runs a handler from now (unless it already did)."""
        me = threading.get_ident()
        if me in self._handler_since:
            return False
        self._handler_since[me] = time.monotonic()
        if not self._began.is_set():
            self._began.set()
        return True

    def _held_until(self, outermost: bool) -> None:
        if outermost:
            del self._handler_since[threading.get_ident()]

    def _relieve(self) -> None:
        """Read while a handler has held the thread reading for over RELIEF_AFTER (one-shot arming
        keeps the stream it handles, and any other, to one reader)."""
        me = threading.get_ident()
        while True:
            self._began.wait()  # asleep while nothing is handled: no wake-ups in an idle process
            self._began.clear()
            # and a look at most every RELIEF_AFTER while handlers come and go: not a wake-up each
            if self._ending.wait(RELIEF_AFTER):
                return
            while not self._closed:
                held = [since for ident, since in list(self._handler_since.items()) if ident != me]
                if not held:
                    break
                waited = time.monotonic() - min(held)
                if waited < RELIEF_AFTER:
                    if self._ending.wait(RELIEF_AFTER - waited):
                        return
                    continue
                self._poll_once(RELIEF_AFTER)
            if self._closed:
                return

    def _poll_once(self, timeout: float | None) -> None:
        try:
            ready = self._poller.poll(timeout)
        except (OSError, ValueError):
            return  # closed under us
        for fd in ready:
            if fd == self._wake_read:
                if not self._closed:  # once closed it stays readable, to release every poller
                    try:
                        os.read(self._wake_read, 4096)
                    except OSError:
                        pass
                continue
            entry = self._streams.get(fd)
            if entry is None:
                continue
            stream, key = entry
            later = []
            if self._serve_ready(fd, stream, key, later):
                self._rearm(fd)
            if later:
                self._run_later(later)

    def _serve_ready(self, fd: int, stream: Stream, key, later: list) -> bool:
        """Handle every frame that has arrived on ``stream``, what its handlers leave for later
        into ``later``; False if it closed."""
        while True:
            try:
                frames = stream.recv_ready(most=BATCH)
            except LinkError:
                self._drop(fd, stream, key)
                return False
            if frames:
                handling = self._handling.__dict__.setdefault("fds", [])
                handling.append(fd)
                outer_later = getattr(self._handling, "later", None)
                self._handling.later = later
                outermost = self._held_from()
                try:
                    self._on_frames(stream, key, frames)
                except Exception:
                    log.exception("handling a message from %s failed", stream.peer)
                finally:
                    handling.pop()
                    self._handling.later = outer_later
                    self._held_until(outermost)
                if self._streams.get(fd, (None,))[0] is not stream:
                    return False  # released or dropped by a handler of those frames: no longer read here
            if len(frames) < BATCH:
                # the rest, if any, is still in the kernel, where the poller sees it; a full batch
                # may have left frames in the stream's own buffer, which it does not
                return True

    def drop(self, stream: Stream, key) -> None:
        """End ``stream`` from this side: ``on_closed`` runs as if its peer had ended it (once,
        whichever ends it first), and frames that arrive after are never read."""
        self._drop(stream.fileno(), stream, key)

    def release(self, stream: Stream) -> None:
        """Stop reading ``stream`` without ending it (another reader takes it over: a job's link
        that carries a pool's protocol too).  Called by a handler of its frames, before anything
        else reads it: frames already read are the handler's to pass on."""
        with self._lock:
            fd = stream.fileno()
            entry = self._streams.get(fd)
            if entry is None or entry[0] is not stream:  # still in ``add``: it stops there
                self._let_go.add(id(stream))
                return
            del self._streams[fd]
            try:
                self._poller.remove(fd)
            except (OSError, ValueError, KeyError):
                pass

    def _rearm(self, fd: int) -> None:
        try:
            self._poller.rearm(fd)
        except (OSError, ValueError):
            pass  # dropped meanwhile

    def _drop(self, fd: int, stream: Stream, key) -> None:
        with self._lock:
            entry = self._streams.get(fd)
            if entry is None or entry[0] is not stream:
                return  # dropped already (its number may be another stream's by now)
            del self._streams[fd]
            try:
                self._poller.remove(fd)
            except (OSError, ValueError, KeyError):
                pass
        stream.close()
        self._on_closed(stream, key)

    def _wake(self) -> None:
        with self._lock:
            if self._wake_write < 0:
                return  # closed: its number may belong to another file by now
            try:
                os.write(self._wake_write, b"x")
            except OSError:
                pass  # full: a wake is already pending

    def close(self) -> None:
        """Stop reading and close every stream (without reporting them closed)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._ending.set()
            self._began.set()
            streams, self._streams = list(self._streams.values()), {}
            self._changed.notify_all()
            try:
                os.write(self._wake_write, b"x")
            except OSError:
                pass  # full: a wake is already pending
        for thread in (self._thread, self._relief):
            if thread is not None and thread is not threading.current_thread():
                thread.join(10)
        for stream, _ in streams:
            stream.close()
        with self._lock:
            self._poller.close()
            os.close(self._wake_read)
            os.close(self._wake_write)
            self._wake_write = -1
