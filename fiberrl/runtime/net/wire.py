"""Serialisation of Python objects into the frames of streams.

Objects are pickled at protocol 5 (cloudpickle where plain pickle cannot
pickle them, or would refer to a ``__main__`` the receiver cannot import); buffers that support
out-of-band transfer (numpy arrays among them) are written after the pickle
stream instead of being copied into it.  On receive the whole message is
copied once into a bytearray, so arrays come back writable, as they do from
``multiprocessing``.

numpy arrays are reduced to (buffer, dtype string, shape) rather than by
numpy's own ``__reduce_ex__``, which pickles the dtype object: that halves
the cost of a message carrying a small array (an observation), ~4.6 us
against ~2.1 us measured here.
"""
from __future__ import annotations

import collections
import copyreg
import importlib
import io
import os
import pickle
import struct
import sys
import threading
import types

import cloudpickle

_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
_ONE_PART = _COUNT.pack(1)
# buffers up to this size are copied into the pickle stream: cheaper than framing them apart
IN_BAND = 4096
# a thread's pickler is replaced after a pickle stream longer than this.  The C pickler's memo table
# never shrinks, and clearing it costs its largest size: after one chunk of 31,250 tuples (437 KB) every
# later message of the thread took 175 us to pickle instead of 0.7 (a pool of 9,000 workers spent 3.5x
# the master's CPU a task after a pool of 16 had run in the process).  A stream this short memoised at
# most ~500 objects (~1 us a clear); a new pickler costs ~1 us
FRESH_PICKLER_AFTER = 1024


def _array(buffer, dtype: str, shape: tuple):
    numpy = sys.modules.get("numpy") or importlib.import_module("numpy")
    array = numpy.frombuffer(buffer, dtype).reshape(shape)
    # a read-only array arrives in a read-only buffer; multiprocessing gives a writable copy
    return array if array.flags.writeable else array.copy()


def _reduce_array(array):
    dtype = array.dtype
    if dtype.isbuiltin == 1 and not dtype.hasobject and array.flags.c_contiguous:
        return _array, (pickle.PickleBuffer(array), dtype.str, array.shape)
    return array.__reduce_ex__(5)  # structured, object or strided: numpy's own way


def _multiprocessings_reducers() -> dict:
    """What multiprocessing's own pickler adds: its connections and sockets travel
    as descriptors duplicated through its resource sharer (which plain pickle would
    copy as bare numbers, naming another file in the receiver), dict views as lists."""
    import multiprocessing.connection  # noqa: F401 -- registers the connection's reducer
    from multiprocessing.reduction import ForkingPickler
    return ForkingPickler._extra_reducers


class _Pickler:
    """One thread's pickler with the array reducer, reused: making a Pickler
    per message costs more than the reducer saves on messages without arrays."""

    def __init__(self, ndarray):
        table = {**copyreg.dispatch_table, **_multiprocessings_reducers()}
        if ndarray is not None:
            table[ndarray] = _reduce_array

        class Pickler(pickle.Pickler):
            dispatch_table = table
        self._pickler_class = Pickler
        self.buffers: list = []
        self._fresh()
        self.ndarray = ndarray
        self.busy = False

    def _fresh(self) -> None:
        self.file = io.BytesIO()
        self.pickler = self._pickler_class(self.file, protocol=5, buffer_callback=self._keep)

    def _keep(self, buffer) -> bool:
        if buffer.raw().nbytes <= IN_BAND:
            return True
        self.buffers.append(buffer)
        return False

    def dumps(self, obj) -> tuple[bytes, list]:
        self.busy = True  # a reducer that itself sends a message gets a pickler of its own
        try:
            self.pickler.dump(obj)
            return self.file.getvalue(), self.buffers
        finally:
            # keep nothing of the message: the memo, the buffers and the stream hold its objects
            self.buffers = []
            if self.file.tell() > FRESH_PICKLER_AFTER:
                self._fresh()
            else:
                self.pickler.clear_memo()
                self.file.seek(0)
                self.file.truncate()
            self.busy = False


_picklers = threading.local()


def _pickle(obj) -> tuple[bytes, list]:
    numpy = sys.modules.get("numpy")
    ndarray = None if numpy is None else numpy.ndarray
    pickler = getattr(_picklers, "pickler", None)
    if pickler is None or pickler.ndarray is not ndarray:  # numpy imported since
        pickler = _picklers.pickler = _Pickler(ndarray)
    elif pickler.busy:  # pickling a message from inside another's reducer
        pickler = _Pickler(ndarray)
    return pickler.dumps(obj)


def main_importable() -> bool:
    """Whether this process's main module is one its jobs import (a script's
    file or a module run with -m), as multiprocessing's spawn does: its
    functions and classes then travel by name, and a job looks them up in its
    own import of it (where plain ``pickle`` finds them as well)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    path = getattr(main, "__file__", None)
    return spec is not None or (path is not None and os.path.isfile(path))


def _named_in_main(obj) -> bool:
    """A function or class defined at the top of ``__main__``, found there by its name."""
    if not isinstance(obj, (types.FunctionType, type)) or getattr(obj, "__module__", None) != "__main__":
        return False
    name = getattr(obj, "__qualname__", "")
    return "." not in name and getattr(sys.modules["__main__"], name, None) is obj


class _MainByName(cloudpickle.Pickler):
    """cloudpickle, but what is named at the top of an importable ``__main__`` goes
    by name, as multiprocessing sends it; lambdas, closures and what a job
    cannot import still go by value."""

    dispatch_table = collections.ChainMap(_multiprocessings_reducers(), cloudpickle.Pickler.dispatch_table)

    def reducer_override(self, obj):
        if _named_in_main(obj) and main_importable():
            return NotImplemented  # pickle's own way: by reference
        return super().reducer_override(obj)


def cloudpickle_dumps(obj, buffer_callback=None) -> bytes:
    file = io.BytesIO()
    _MainByName(file, protocol=5, buffer_callback=buffer_callback).dump(obj)
    return file.getvalue()


def dumps(obj) -> list:
    """Serialise ``obj`` into a list of buffers to be concatenated on the wire:
    the pickle stream and its out-of-band buffers, framed by :func:`frames`."""
    try:
        # the C pickler is several times faster; what it cannot pickle, or
        # would send by name from a __main__ the receiver cannot import, goes
        # through cloudpickle, which sends it by value
        stream, buffers = _pickle(obj)
        if b"__main__" in stream and not main_importable():
            raise pickle.PicklingError("refers to __main__")
    except Exception:
        buffers = []
        stream = cloudpickle_dumps(obj, buffer_callback=buffers.append)
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
