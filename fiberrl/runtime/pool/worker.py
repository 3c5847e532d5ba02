"""The loop every pool worker runs.

Two messages per chunk over the worker's stream to the master: the master's
reply carries the chunks (up to its prefetch when it has a backlog), and the
result of the last chunk of a batch travels in the worker's next request for
work, which the master parks until it has more.  Results of earlier chunks
of a batch are sent as soon as each is done, without an answer.  Chunks run
one after another in the order received, which is how the master knows
which chunk was running when a worker died.
"""
from __future__ import annotations

import struct
import traceback

import cloudpickle

from .. import wire
from ..stream import StreamClosed, connect
from ..transport import OK

W_HELLO, W_GET, W_RESULT, W_RESULT_GET = 20, 21, 22, 23
WORKER_ID = struct.Struct("<q")
# what the master says of each chunk it sends: id, function id, whether the
# function's pickle comes with it, whether its tasks take *args
CHUNK = struct.Struct("<qq??")
# what a worker says of each result it sends: chunk id, whether it succeeded
REPORT = struct.Struct("<q?")


def encode_error(exc: BaseException) -> bytearray:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        return wire.encode((exc, tb))
    except Exception:
        # the exception itself cannot travel: send what it said
        return wire.encode((RuntimeError(f"{type(exc).__name__}: {exc} (the exception could not be pickled)"), tb))


def load_function(blob):
    try:
        return cloudpickle.loads(blob)
    except Exception as exc:
        message = f"the task function could not be loaded in the worker: {exc!r}"

        def unloadable(*_args):
            raise RuntimeError(message)
        return unloadable


def run_chunk(func, args_blob, star: bool) -> tuple[bool, bytearray]:
    try:
        args_list = wire.loads(args_blob)
        values = [func(*args) for args in args_list] if star else [func(args) for args in args_list]
    except BaseException as exc:  # noqa: BLE001 -- a task's SystemExit is its error too
        return False, encode_error(exc)
    try:
        return True, wire.encode(values)
    except Exception as exc:
        return False, encode_error(TypeError(f"the result could not be pickled: {exc!r}"))


def run_worker(master: str, worker_id: int, initializer, initargs) -> None:
    stream = connect(master)

    def ask(op: int, parts=()):
        stream.send([bytes((op,)), *parts])
        reply = stream.recv()
        return reply[0], memoryview(reply)[1:]

    try:
        ask(W_HELLO, [WORKER_ID.pack(worker_id)])
        if initializer is not None:
            initializer(*initargs)
        funcs: dict[int, object] = {}
        status, payload = ask(W_GET)
        while status == OK:  # anything else: the master retires this worker
            parts = wire.split(payload)
            batch = list(CHUNK.iter_unpack(parts[0]))
            blobs = iter(parts[1:])
            for i, (chunk_id, func_id, has_func, star) in enumerate(batch):
                if has_func:
                    funcs[func_id] = load_function(next(blobs))
                ok, blob = run_chunk(funcs[func_id], next(blobs), star)
                report = wire.frames([REPORT.pack(chunk_id, ok), blob])
                if i + 1 < len(batch):
                    stream.send([bytes((W_RESULT,)), *report])
                else:
                    status, payload = ask(W_RESULT_GET, report)
    except StreamClosed:
        pass  # the master is gone; so is the work
    finally:
        stream.close()
