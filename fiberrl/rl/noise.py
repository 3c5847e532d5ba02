"""A table of Gaussian noise built from a seed once per host and shared by
every process on that host.

ES perturbations are slices of this table, so a worker is told an index
instead of being sent a vector.  The table lives in a file on shared memory
(``/dev/shm``), mapped read-only by every process that uses it: the first
process on a host generates it (others wait on a lock rather than generate
it twice), later ones map it in milliseconds.  Every host generates the
same numbers from the same seed.

Runs that use the same table at the same time on one host (a sweep's runs,
a population's members) share it: each run holds it (a shared lock on its
``.users`` file) and the last to let go removes it, so a table is 1 GB of a
host's memory however many runs use it, and is drawn once while any does.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

FLOAT_BYTES = np.dtype(np.float32).itemsize
_GENERATE_BLOCK = 1 << 24  # numbers drawn per call, each block from a seed of its own


def _shared_dir(nbytes: int) -> str:
    """``/dev/shm`` when it has room (it is small in containers), else the temp dir."""
    shm = "/dev/shm"
    try:
        stat = os.statvfs(shm)
        if os.access(shm, os.W_OK) and stat.f_bavail * stat.f_frsize > nbytes * 1.1:
            return shm
    except OSError:
        pass
    return tempfile.gettempdir()


def table_path(seed: int, size: int) -> str:
    """Where this host keeps the table of ``size`` numbers from ``seed``."""
    return os.path.join(_shared_dir(size * FLOAT_BYTES), f"fiberrl-noise-{seed}-{size}.f32")


def _fill(table: np.ndarray, seed: int) -> None:
    """Fill ``table`` with N(0, 1) numbers from ``seed``: block ``i`` from the
    ``i``-th child of the seed's SeedSequence, so blocks are drawn on all
    cores at once (numpy lets go of the GIL) and the numbers do not depend on
    how many there are."""
    blocks = range(0, len(table), _GENERATE_BLOCK)
    seeds = np.random.SeedSequence(seed).spawn(len(blocks))

    def draw(i: int) -> None:
        block = table[blocks[i]:blocks[i] + _GENERATE_BLOCK]
        np.random.Generator(np.random.PCG64(seeds[i])).standard_normal(out=block, dtype=np.float32)

    with ThreadPoolExecutor(max(1, min(len(blocks), os.cpu_count() or 1))) as threads:
        list(threads.map(draw, range(len(blocks))))


class NoiseTable:
    """``size`` float32 numbers from N(0, 1), a pure function of ``seed``.  ``hold``: this process is one
    of the table's users on this host (a run, not its workers), and ``release()`` lets go of it."""

    def __init__(self, seed: int, size: int, hold: bool = False):
        if size < 1:
            raise ValueError(f"the noise table needs at least one number, got size={size}")
        self.seed, self.size = int(seed), int(size)
        self.path = table_path(self.seed, self.size)
        self.created = False
        # held before looking for the table: a last user removing it finishes first
        self._users = self._hold() if hold else None
        try:
            if not self._complete():
                self._generate_once()
            self.noise = np.memmap(self.path, dtype=np.float32, mode="r", shape=(self.size,))
        except BaseException:
            self.release()  # e.g. no room for it: one user fewer
            raise

    def _hold(self) -> int:
        """A shared lock on the table's ``.users`` file, held until ``release()`` (or this process ends)."""
        users = self.path + ".users"
        while True:
            fd = os.open(users, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                if os.fstat(fd).st_ino == os.stat(users).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)  # its last user removed it while this one waited: hold the table made anew

    def release(self) -> None:
        """Let go of a held table; the last user on this host removes it (1 GB of its memory by default)."""
        fd, self._users = self._users, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.unlink()
        except BlockingIOError:
            pass  # another run on this host still uses it
        finally:
            os.close(fd)

    def _complete(self) -> bool:
        try:
            return os.path.getsize(self.path) == self.size * FLOAT_BYTES
        except OSError:
            return False

    def _generate_once(self) -> None:
        with open(self.path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self._complete():  # another process on this host made it while we waited
                return
            partial = f"{self.path}.{os.getpid()}.partial"
            try:
                with open(partial, "wb") as out:
                    out.truncate(self.size * FLOAT_BYTES)
                table = np.memmap(partial, dtype=np.float32, mode="r+", shape=(self.size,))
                _fill(table, self.seed)
                table.flush()
                del table
                os.replace(partial, self.path)  # readers only ever see a whole table
                self.created = True
            finally:
                if os.path.exists(partial):
                    os.unlink(partial)

    def get(self, index: int, dim: int) -> np.ndarray:
        return self.noise[index:index + dim]

    def sample_index(self, rng: np.random.Generator, dim: int, count: int) -> np.ndarray:
        if dim > self.size:
            raise ValueError(f"the noise table holds {self.size} numbers but a perturbation needs {dim}; "
                             "raise algo.noise_size")
        return rng.integers(0, self.size - dim + 1, size=count)

    def unlink(self) -> None:
        """Remove the file; processes that mapped it keep their mapping."""
        for path in (self.path, self.path + ".lock", self.path + ".users"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def __reduce__(self):
        # travels as its recipe: the receiver maps (or builds) its own host's copy
        return NoiseTable, (self.seed, self.size)
