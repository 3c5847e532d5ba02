"""The wire protocol between a pool's master and its workers: what each
message is and how its frames are laid out, imported by both sides.

A worker's message is one frame: its first byte the op code (``W_*``), the
rest its body.  The master's answer is one frame: a status byte
(:data:`OK`, or :data:`CLOSED`: no more work, retire) and its parts.

- ``W_HELLO`` + :data:`WORKER_ID`: the worker's first word; answered OK if
  the pool still wants it.
- ``W_GET`` [+ :data:`CHUNK_ID`]: asks for work (parked until there is
  some); with a chunk id it also says it starts that chunk.
- ``W_START`` + :data:`CHUNK_ID`: it starts a chunk (unanswered).
- ``W_LOAD`` + :data:`CHUNK_ID`: it loads the function of its next chunk,
  one it has not run yet (unanswered).
- ``W_LEAVE``: it was told to stop (preemption.py) and will leave once
  the chunk it runs, if any, is done: what else it holds goes elsewhere
  (unanswered).
- ``W_RESULT`` + frames [:data:`REPORT` * n, one result blob each]:
  results (unanswered); ``W_RESULT_GET``: the same, and asks for work.

The answer to a request for work (a batch) is frames: first one byte,
whether more work is waiting, then a :data:`CHUNK` per chunk; then for each
chunk its function's pickle where the chunk says it comes with it, and its
arguments' pickle.
"""
from __future__ import annotations

import struct
import threading

from ..net.errors import LinkError
from ..net.stream import Stream
from ..net.transport import CLOSED, OK

W_HELLO, W_GET, W_RESULT, W_RESULT_GET, W_START, W_LOAD, W_LEAVE = 20, 21, 22, 23, 24, 25, 26
WORKER_ID = CHUNK_ID = struct.Struct("<q")
# a batch's first part: one byte, whether more work is waiting, then for each
# chunk: its id, function id, whether the function's pickle comes with it,
# whether its tasks take *args
CHUNK = struct.Struct("<qq??")
# what a worker says of each result it sends: chunk id, whether it succeeded, the chunk's wall seconds and
# the share of them its thread was running or waiting for a core (NaN where the kernel does not say)
REPORT = struct.Struct("<q?dd")


class WorkerRequest:
    """One request read from a worker's stream; answered exactly once (a
    posted result, W_RESULT, wants no answer)."""

    __slots__ = ("_stream", "op", "body", "stream_id", "_answered")

    def __init__(self, stream: Stream, stream_id: int, frame: bytearray):
        self._stream = stream
        self.op = frame[0]
        self.body = memoryview(frame)[1:]
        self.stream_id = stream_id
        self._answered = threading.Lock()

    def claim(self) -> bool:
        """Reserve the right to answer; False if someone else already did."""
        return self._answered.acquire(blocking=False)

    def reply(self, status: int, *parts) -> None:
        if self.op == W_RESULT or not self.claim():
            return
        try:
            self._stream.send([bytes((status,)), *parts])
        except LinkError:
            pass  # the worker is gone; its loss is being handled


def send_replies(replies) -> None:
    """Send (request, status, parts) answers, as the dispatch policy decided them."""
    for request, status, parts in replies:
        request.reply(status, *parts)


__all__ = ["CHUNK", "CHUNK_ID", "CLOSED", "OK", "REPORT", "W_GET", "W_HELLO", "W_LEAVE", "W_LOAD", "W_RESULT",
           "W_RESULT_GET", "W_START", "WORKER_ID", "WorkerRequest", "send_replies"]
