"""Serialisation of Python objects into nng messages, and the raw nng calls
pynng does not expose (context timeouts, message headers).

Objects are pickled at protocol 5 (cloudpickle where plain pickle would
refer to ``__main__`` or cannot pickle them); buffers that support
out-of-band transfer (numpy arrays among them) are written after the pickle
stream instead of being copied into it.  On receive the whole message is
copied once into a bytearray, so arrays come back writable, as they do from
``multiprocessing``.
"""
from __future__ import annotations

import pickle
import struct

import cloudpickle
from pynng import ffi, lib
from pynng.exceptions import check_err

_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
_ONE_PART = _COUNT.pack(1)


def dumps(obj) -> list:
    """Serialise ``obj`` into a list of buffers to be concatenated on the wire:
    the pickle stream and its out-of-band buffers, framed by :func:`frames`."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        # the C pickler is several times faster; what it would send by
        # reference from __main__ (or cannot pickle at all) goes through
        # cloudpickle, which sends it by value
        stream = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        if b"__main__" in stream:
            raise pickle.PicklingError("refers to __main__")
    except Exception:
        buffers.clear()
        stream = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    if not buffers:  # the common small case, without frames()'s general bookkeeping
        return [_ONE_PART + _LENGTH.pack(len(stream)), stream]
    return frames([stream, *(b.raw() for b in buffers)])


def loads(data):
    """Inverse of :func:`dumps` over one contiguous, preferably writable buffer."""
    stream, *buffers = split(data)
    return pickle.loads(stream, buffers=buffers)


def encode(obj) -> bytearray:
    """Serialise into one contiguous buffer (for storing or nesting)."""
    parts = dumps(obj)
    if len(parts) == 2:
        out = bytearray(parts[0])
        out += parts[1]
        return out
    return join(parts)


def join(parts) -> bytearray:
    out = bytearray(sum(memoryview(p).nbytes for p in parts))
    offset = 0
    for p in parts:
        n = memoryview(p).nbytes
        out[offset:offset + n] = memoryview(p).cast("B")
        offset += n
    return out


def frames(parts) -> list:
    """Prefix ``parts`` with their count and lengths so :func:`split` can cut them apart."""
    views = [memoryview(p).cast("B") for p in parts]
    header = [_COUNT.pack(len(views))]
    header.extend(_LENGTH.pack(v.nbytes) for v in views)
    return [b"".join(header), *views]


def split(data) -> list:
    """Inverse of :func:`frames`: views on the parts, without copying."""
    view = memoryview(data)
    (count,) = _COUNT.unpack_from(view, 0)
    offset = _COUNT.size + count * _LENGTH.size
    out = []
    for i in range(count):
        (n,) = _LENGTH.unpack_from(view, _COUNT.size + i * _LENGTH.size)
        out.append(view[offset:offset + n])
        offset += n
    return out


# --- nng messages -----------------------------------------------------------

def new_msg(parts, header: bytes = b""):
    """Allocate an nng message holding ``parts`` back to back (one copy)."""
    views = [memoryview(p).cast("B") for p in parts]
    total = sum(v.nbytes for v in views)
    msg_p = ffi.new("nng_msg **")
    check_err(lib.nng_msg_alloc(msg_p, total))
    msg = msg_p[0]
    body = ffi.cast("char *", lib.nng_msg_body(msg))
    offset = 0
    for v in views:
        if v.nbytes:
            ffi.memmove(body + offset, ffi.from_buffer(v), v.nbytes)
            offset += v.nbytes
    if header:
        check_err(lib.nng_msg_header_append(msg, header, len(header)))
    return msg


def msg_body(msg) -> bytearray:
    """Copy a received message's body into a writable buffer and free it."""
    try:
        size = lib.nng_msg_len(msg)
        return bytearray(ffi.buffer(lib.nng_msg_body(msg), size))
    finally:
        lib.nng_msg_free(msg)


def msg_header(msg) -> bytes:
    return bytes(ffi.buffer(lib.nng_msg_header(msg), lib.nng_msg_header_len(msg)))


def sock_send(sock, msg) -> None:
    """Send on a socket, freeing ``msg`` on failure."""
    rv = lib.nng_sendmsg(sock, msg, 0)
    if rv != 0:
        lib.nng_msg_free(msg)
        check_err(rv)


def sock_recv(sock):
    msg_p = ffi.new("nng_msg **")
    check_err(lib.nng_recvmsg(sock, msg_p, 0))
    return msg_p[0]


class Context:
    """One outstanding request on a Req0 socket, with a receive timeout."""

    def __init__(self, sock):
        ctx_p = ffi.new("nng_ctx *")
        check_err(lib.nng_ctx_open(ctx_p, sock))
        self._ctx = ctx_p[0]
        aio_p = ffi.new("nng_aio **")
        check_err(lib.nng_aio_alloc(aio_p, ffi.NULL, ffi.NULL))
        self._aio = aio_p[0]

    def send(self, msg) -> None:
        lib.nng_aio_set_timeout(self._aio, -2)  # NNG_DURATION_DEFAULT
        lib.nng_aio_set_msg(self._aio, msg)
        lib.nng_ctx_send(self._ctx, self._aio)
        lib.nng_aio_wait(self._aio)
        rv = lib.nng_aio_result(self._aio)
        if rv != 0:
            lib.nng_msg_free(msg)
            check_err(rv)

    def start_recv(self, timeout_ms: int = -1) -> None:
        """Begin waiting for the reply without blocking; ``timeout_ms < 0`` waits forever."""
        lib.nng_aio_set_timeout(self._aio, timeout_ms if timeout_ms >= 0 else -1)
        lib.nng_ctx_recv(self._ctx, self._aio)

    def done(self) -> bool:
        return not lib.nng_aio_busy(self._aio)

    def finish(self):
        """Wait for the reply begun by :meth:`start_recv` and return it."""
        lib.nng_aio_wait(self._aio)
        check_err(lib.nng_aio_result(self._aio))
        return lib.nng_aio_get_msg(self._aio)

    def cancel(self) -> None:
        lib.nng_aio_cancel(self._aio)

    def close(self) -> None:
        lib.nng_aio_free(self._aio)
        lib.nng_ctx_close(self._ctx)
