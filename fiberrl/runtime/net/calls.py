"""Calls over one authenticated stream, answered in any order: each call
carries an id, each reply the id of the call it answers.

    call:  op (1 byte) | call id (8) | token (8) | payload
    reply: call id (8) | payload

A call id of 0 asks for no reply.  Used by the proxies of a manager and by
the clients of a hub (queues and pipes).
"""
from __future__ import annotations

import itertools
import struct
import threading
import time

from .errors import LinkError
from .dial import connect
from .stream import HANDSHAKE_TIMEOUT

HEAD = struct.Struct("<BQq")
CALL_ID = struct.Struct("<Q")


class CallStream:
    """Calls over one stream to a server (a manager, a hub).

    Calls are sent at once; replies carry their call's id.  Whichever thread
    is waiting (a handle may be collected on another thread) reads the stream
    itself, with no reader thread to hop through, and files replies meant for
    others where they will find them.
    """

    def __init__(self, address: str, timeout: float = HANDSHAKE_TIMEOUT):
        self.stream = connect(address, timeout=timeout)
        self._ids = itertools.count(1)
        self._replies: dict[int, bytearray] = {}
        self._abandoned: set[int] = set()  # calls whose caller stopped waiting: their replies are dropped
        self._cond = threading.Condition()
        self._reading = False  # a thread is reading the stream
        self._waiting = 0  # threads waiting for the reader to file their reply
        self.error: BaseException | None = None

    def call(self, op: int, token: int, parts=(), reply: bool = True) -> int:
        call_id = next(self._ids) if reply else 0
        try:
            self.stream.send([HEAD.pack(op, call_id, token), *parts])
        except LinkError as exc:
            self.error = self.error or _without_frames(exc)
            raise
        return call_id

    def reply(self, call_id: int, timeout: float | None = None, abandon: bool = True) -> memoryview:
        """The reply to ``call_id``; TimeoutError if it has not come within ``timeout`` s, after
        which its reply is dropped when it comes unless ``abandon`` is false (the caller will ask again)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                while True:
                    frame = self._replies.pop(call_id, None)
                    if frame is not None:
                        return memoryview(frame)[CALL_ID.size:]
                    if self.error is not None:
                        raise _without_frames(self.error)  # raising the kept one would give it frames
                    if not self._reading:
                        break
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        if abandon:
                            self._abandoned.add(call_id)
                        raise TimeoutError
                    self._waiting += 1
                    try:
                        self._cond.wait(left)
                    finally:
                        self._waiting -= 1
                self._reading = True
            frame, answers = None, None
            try:
                frame = self._read_one(deadline)
                answers = CALL_ID.unpack_from(frame)[0]
            except TimeoutError:
                if abandon:
                    with self._cond:
                        self._abandoned.add(call_id)
                raise
            finally:
                with self._cond:
                    self._reading = False
                    if answers is not None and answers != call_id:
                        if answers in self._abandoned:
                            self._abandoned.discard(answers)
                        else:
                            self._replies[answers] = frame  # another thread's: filed for it
                    if self._waiting:
                        self._cond.notify_all()
            if answers == call_id:
                return memoryview(frame)[CALL_ID.size:]

    def _read_one(self, deadline) -> bytearray:
        if deadline is not None and not self.stream.readable(max(0.0, deadline - time.monotonic())):
            raise TimeoutError
        try:
            return self.stream.recv()
        except LinkError as exc:
            self.error = _without_frames(exc)
            raise


def _without_frames(exc: LinkError) -> LinkError:
    """The error to keep: a traceback would keep its frames, and the callers' objects
    in them (a proxy whose release is what failed), alive as long as the connection."""
    return type(exc)(*exc.args)
