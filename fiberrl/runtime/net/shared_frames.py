"""Large frames of a same-host stream, through shared memory.

A frame sent over a Unix socket or pipe is copied into the kernel and out
again: ~19 us for 100 KB measured here, against ~2 us for two ``memcpy``.
So each side of a stream between processes of one host
(:mod:`fiberrl.runtime.net.stream`) writes
its large frames into a ring of shared memory it created (a memfd, handed
to the peer over the socket once both have proved they hold the run's
secret) and sends only where the frame lies; the peer copies it out and
marks it read.

The ring holds frames in the order they were sent.  The reader's mark,
a native 8-byte counter written in one store, tells the writer what it may
reuse; a frame that does not fit (the reader is behind, or it is larger
than the ring) goes through the stream itself, so a sender never waits
for space.  When every frame has been read the writer starts again at the
beginning, so the memory in use is the most ever in flight, not the ring.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys
import weakref

RING_BYTES = 16 << 20
# the reader's mark: bytes read so far, in the first page; frames start on the second
_MARK = struct.Struct("Q")  # native: packed and read with one 8-byte store and load
_DATA = mmap.PAGESIZE
# where a frame lies: its position in the ring, its size, and the mark once it is read
WHERE = struct.Struct("<QQQ")
AVAILABLE = sys.platform == "linux" and hasattr(os, "memfd_create")
# a ring larger than this from a peer is refused
MAX_RING_BYTES = 1 << 30

if AVAILABLE:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.mmap.restype = ctypes.c_void_p
    _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                           ctypes.c_long]
    _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def _map_shared(owner, fd: int, length: int) -> memoryview:
    """A shared mapping of a memfd, as a byte memoryview, unmapped when ``owner`` is collected.

    Not Python's ``mmap``, which keeps a duplicate of the fd open for as
    long as the mapping lives: one per ring would add up to hundreds in a
    pool's master.  Nor unmapped by a ``close`` another thread could race
    while copying: no view of it outlives a call of its owner.
    """
    address = _libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if address is None or address == ctypes.c_void_p(-1).value:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot map a shared frame ring: {os.strerror(err)}")
    weakref.finalize(owner, _libc.munmap, address, length)
    return memoryview((ctypes.c_ubyte * length).from_address(address)).cast("B")


class RingWriter:
    """The sending side: owns the ring, writes frames into it."""

    def __init__(self, size: int = RING_BYTES):
        self.fd = os.memfd_create("fiberrl-stream", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, _DATA + size)  # sparse: pages exist once written
            self._map = _map_shared(self, self.fd, _DATA + size)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size
        self._head = 0  # bytes written so far, with the padding skipped at the end
        self._pos = 0  # where the next frame goes

    def put(self, views, nbytes: int) -> bytes | None:
        """Write the frame made of ``views``; where it lies, or None if it does not fit."""
        in_flight = self._head - min(_MARK.unpack_from(self._map, 0)[0], self._head)
        pos = 0 if in_flight == 0 else self._pos  # all read: start again at the beginning
        skip = self.size - pos if pos + nbytes > self.size else 0
        if in_flight + skip + nbytes > self.size:
            return None
        if skip:
            pos = 0
        offset = _DATA + pos
        for view in views:
            self._map[offset:offset + view.nbytes] = view
            offset += view.nbytes
        self._head += skip + nbytes
        self._pos = pos + nbytes
        return WHERE.pack(pos, nbytes, self._head)

    def detach(self) -> None:
        """The fd, once handed to the peer (or not), is no longer needed here."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class RingReader:
    """The receiving side: maps the peer's ring, copies frames out."""

    def __init__(self, fd: int):
        try:
            length = os.fstat(fd).st_size
            if not _DATA < length <= _DATA + MAX_RING_BYTES:
                raise ValueError(f"a shared frame ring of {length} bytes")
            self._map = _map_shared(self, fd, length)
        finally:
            os.close(fd)
        self.size = length - _DATA

    def take(self, where, size: int) -> bytearray:
        """The frame of ``size`` bytes at ``where`` (as :meth:`RingWriter.put` said), copied out
        and marked read."""
        pos, nbytes, mark = WHERE.unpack(where)
        if nbytes != size or pos + nbytes > self.size:
            raise ValueError(f"a frame of {size} bytes said to lie at {pos}+{nbytes} in a ring of {self.size}")
        frame = bytearray(self._map[_DATA + pos:_DATA + pos + nbytes])
        _MARK.pack_into(self._map, 0, mark)
        return frame
