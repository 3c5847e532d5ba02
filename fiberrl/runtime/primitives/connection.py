"""``Pipe()`` with the ``multiprocessing`` API: two connection objects that
may be handed to any processes of the run.

Each direction is a channel hosted by the creating process.  ``recv`` raises
``EOFError`` once everything sent has been read and every handle that can
send on that direction is closed, in whatever process it lives: the owner
counts writer handles as the kernel counts a pipe's write descriptors.  A
handle pickled for another process counts from the moment it is pickled
until that process takes it (or, for a process's arguments, until the
process ends without taking it), so the usual ``child_end.close()`` in the
parent right after ``start()`` does not cut the child off, and a child that
exits does not end the pipe for another process that still holds an end.
"""
from __future__ import annotations

import logging
import multiprocessing.connection
import os
import queue
import threading
import time
import weakref

from ..processes.handover import handed_over
from ..processes.handover import writers as _writers
from ..processes.hub import current_hub
from .channel import ChannelClosed, ChannelRef, new_channel

# how often wait() looks at its fiberrl connections while it watches file descriptors too
WAIT_SLICE = 0.01
_NOTHING = object()
_EOF = object()


class _Ownership:
    """Held by the creator's two ends; when both are gone the channels go."""


class Connection:
    def __init__(self, inbox: ChannelRef | None, outbox: ChannelRef | None, owner: _Ownership | None = None,
                 token: bytes | None = None):
        self._inbox = inbox
        self._outbox = outbox
        self._owner = owner
        self._closed = False
        self._buffered = _NOTHING
        self._release = None
        self._forked_hold: tuple[ChannelRef, bytes] | None = None
        if outbox is not None:
            try:
                outbox.hold(token)
            except OSError as exc:  # its creator is gone or unreachable: sending will say so
                logging.getLogger("fiberrl").debug("a pipe's end could not be counted by its creator: %s", exc)
            # a handle dropped without close() is closed, as multiprocessing closes its descriptor
            self._release = weakref.finalize(self, _release_quietly, outbox)
            _writers.add(self)

    def __reduce__(self):
        token = None
        if self._outbox is not None and not self._closed:
            token = os.urandom(16)
            try:
                self._outbox.pend(token)
            except OSError:
                token = None  # its creator is gone: there is nothing left to count it
            if token is not None:
                handed_over(self._outbox, token)
        return Connection, (self._inbox, self._outbox, None, token)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def readable(self) -> bool:
        return self._inbox is not None

    @property
    def writable(self) -> bool:
        return self._outbox is not None

    def _check(self, readable=False, writable=False):
        if self._closed:
            raise OSError("handle is closed")
        if readable and self._inbox is None:
            raise OSError("connection is write-only")
        if writable and self._outbox is None:
            raise OSError("connection is read-only")

    def send(self, obj) -> None:
        self._check(writable=True)
        if self._forked_hold is not None:
            # a forked copy's first send: tie its hold to this process's own connection, so the
            # pipe ends after what it sent arrives; waited for, so it cannot be overtaken by
            # the parent's noticing this process end
            self._outbox.hold(self._forked_hold[1], wait=True)
            self._forked_hold = None
        self._outbox.put(obj)

    def send_bytes(self, buf, offset: int = 0, size: int | None = None) -> None:
        view = memoryview(buf).cast("B")
        end = len(view) if size is None else offset + size
        if offset < 0 or end > len(view) or offset > end:
            raise ValueError("offset and size out of range for the buffer")
        self.send(bytes(view[offset:end]))

    def _next(self, timeout):
        if self._buffered is not _NOTHING:
            item, self._buffered = self._buffered, _NOTHING
            return item
        try:
            return self._inbox.get(timeout)
        except ChannelClosed:
            return _EOF

    def recv(self):
        self._check(readable=True)
        item = self._next(None)
        if item is _EOF:
            self._buffered = _EOF
            raise EOFError
        return item

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        item = self.recv()
        if not isinstance(item, (bytes, bytearray)):
            raise TypeError(f"recv_bytes() received a {type(item).__name__}, sent with send(), not send_bytes()")
        if maxlength is not None and len(item) > maxlength:
            raise OSError("message too long")
        return bytes(item)

    def poll(self, timeout: float | None = 0.0) -> bool:
        """True if there is something to read (or the other end closed)."""
        self._check(readable=True)
        if self._buffered is not _NOTHING:
            return True
        try:
            self._buffered = self._next(timeout)
        except queue.Empty:
            return False
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._forked_hold is not None:  # a forked copy never used: give back the fork's hold
            self._release.detach()
            _give_back_quietly(*self._forked_hold)
        elif self._release is not None:
            self._release()
        _writers.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def Pipe(duplex: bool = True) -> tuple[Connection, Connection]:
    """Return two connected ends; with ``duplex=False`` the first only
    receives and the second only sends."""
    forward, _ = new_channel()
    owner = _Ownership()
    ids = [forward.obj_id]
    if duplex:
        backward, _ = new_channel()
        ids.append(backward.obj_id)
        ends = Connection(backward, forward, owner), Connection(forward, backward, owner)
    else:
        ends = Connection(forward, None, owner), Connection(None, forward, owner)
    hub = current_hub()
    weakref.finalize(owner, lambda: [hub.unhost(i) for i in ids])
    return ends


def wait(object_list, timeout: float | None = None) -> list:
    """``multiprocessing.connection.wait``: those of ``object_list`` that are
    ready, waiting up to ``timeout`` s for one (None: as long as it takes).
    A fiberrl ``Connection`` is ready when it has something to read or its
    other end closed; anything multiprocessing's ``wait`` takes (a process's
    ``sentinel``, a socket, a file descriptor) when it is readable."""
    ours = [obj for obj in object_list if isinstance(obj, Connection)]
    others = [obj for obj in object_list if not isinstance(obj, Connection)]
    if not ours:
        return multiprocessing.connection.wait(others, timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        ready = [conn for conn in ours if conn.poll(0)]
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if ready or left == 0:
            return ready + (multiprocessing.connection.wait(others, 0) if others else [])
        # our connections have no descriptor to select on: wait on one kind a slice at a time
        step = WAIT_SLICE if left is None else min(WAIT_SLICE, left)
        if others:
            ready = multiprocessing.connection.wait(others, step)
            if ready:
                return [conn for conn in ours if conn.poll(0)] + ready
        elif len(ours) == 1:
            return ours if ours[0].poll(left) else []
        else:
            ours[0].poll(step)


def _release_quietly(outbox: ChannelRef) -> None:
    if current_hub() is None:
        return  # the process is ending: its connection's end releases what it held
    try:
        outbox.release()
    except ConnectionError:
        pass  # the creator is gone; nobody is left to tell


def _give_back_quietly(outbox: ChannelRef, token: bytes) -> None:
    try:
        outbox.unpend(token)
    except ConnectionError:
        pass  # the creator is gone, and the pipe with it


class _ForkedCopies:
    """A forked child holds copies of this process's writer handles, as it would
    hold copies of a pipe's write descriptors: each counts in the pipe's owner
    until the child (and whatever it forked in turn) ends or closes it.  The
    child inherits the write end of a small OS pipe; its read end, here, sees
    EOF when the last process holding it is gone, and the holds are given back."""

    def __init__(self):
        self._fork = None

    def before(self) -> None:
        self._fork = None
        try:
            writers = [conn for conn in list(_writers) if not conn._closed]
            if not writers:
                return
            handed = []
            for conn in writers:
                token = os.urandom(16)
                try:
                    conn._outbox.pend(token)
                except ConnectionError:
                    continue  # its creator is gone: nothing left to hold
                handed.append((conn, token))
            self._fork = (*os.pipe(), handed)
        except Exception:
            logging.getLogger("fiberrl").exception("pipe ends held across fork not counted")

    def in_parent(self) -> None:
        if self._fork is None:
            return
        watch, held_by_child, handed = self._fork
        self._fork = None
        os.close(held_by_child)
        threading.Thread(target=self._give_back_at_eof, args=(watch, [(c._outbox, t) for c, t in handed]),
                         name="fiberrl-forked-ends", daemon=True).start()

    def in_child(self) -> None:
        if self._fork is None:
            return
        watch, _held_by_this_process_until_it_ends, handed = self._fork
        self._fork = None
        os.close(watch)
        for conn, token in handed:
            conn._forked_hold = (conn._outbox, token)

    @staticmethod
    def _give_back_at_eof(watch: int, handed) -> None:
        try:
            while os.read(watch, 1):
                pass
        finally:
            os.close(watch)
            for outbox, token in handed:
                _give_back_quietly(outbox, token)


_forked_copies = _ForkedCopies()
os.register_at_fork(before=_forked_copies.before, after_in_parent=_forked_copies.in_parent,
                    after_in_child=_forked_copies.in_child)


# multiprocessing.connection's sockets between programs, as they are: a process of the run
# authenticates them with multiprocessing's authkey, which is the run's secret (auth.run_secret)
Listener = multiprocessing.connection.Listener
Client = multiprocessing.connection.Client
families = multiprocessing.connection.families
deliver_challenge = multiprocessing.connection.deliver_challenge
answer_challenge = multiprocessing.connection.answer_challenge

__all__ = ["Client", "Connection", "Listener", "Pipe", "answer_challenge", "deliver_challenge", "families", "wait"]
