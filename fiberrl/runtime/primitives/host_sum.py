"""``HostSum``: the sum of a CPU tensor over a Ring's members when they all share one host, through shared
memory, for collectives too small and too frequent for gloo.

PPO's learners all-reduce their gradients at every minibatch step.  For an MLP of 11,000 floats, gloo over
loopback costs about 0.5 ms alone and 2.2 ms within a step (two members on a 2-core machine), more than the
step itself; this costs about 0.01 ms.  Every member writes its tensor into its own slot and publishes a
counter; once every counter has reached this call's, each member adds the slots up in rank order, so all of
them hold the same sum to the last bit (with two members, the same bits as gloo's).  The slots are
double-buffered: a member can be at most one call ahead of the slowest, whose slots it never writes.

A member waiting for the others spins briefly, then yields its core, then sleeps between looks; each member
holds a lock on a byte of the file, which its kernel drops when it dies, so the others raise at once
(``HostSumError`` naming it) instead of waiting out ``timeout``.

The memory is rank 0's memfd, which the others open through ``/proc/<pid>/fd``: it has no name in a file
system, so it goes with the last member that holds it, however the members end (a file in ``/dev/shm`` was
left behind when rank 0 was killed while the others opened it).  ``join`` gives every member None, and the
caller keeps to torch.distributed, where the members do not share a host and its processes (a container of
its own sees none of the others') or the machine is not x86-64: the counter is published by a plain store
after the slot's plain stores, which x86-64 keeps in order and weaker memory models do not.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import platform
import secrets
import time

import numpy as np

# each member's counter on a cache line of its own, so that members spinning on theirs do not share one
_LINE = 64
# the file begins with a token that proves it is the one rank 0 made; each member's lock is a byte after it
_TOKEN_BYTES = 16
# a member waiting spins this long, then yields the core at every look, then sleeps between looks
_SPIN_S, _YIELD_S, _SLEEP_S = 50e-6, 2e-3, 50e-6
# how often a member still waiting looks whether the late ones are alive
_ALIVE_CHECK_S = 0.05


class HostSumError(RuntimeError):
    """A member died before it reached a sum, or did not reach it within the timeout; ``rank`` is the first."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


class HostSum:
    """Sums of CPU tensors of at most ``nbytes`` over ``size`` members of one host; see the module."""

    def __init__(self, fd: int, buffer: mmap.mmap, rank: int, size: int, nbytes: int, timeout: float):
        self._fd, self._buffer = fd, buffer
        self.rank, self.size, self.nbytes, self.timeout = rank, size, nbytes, timeout
        self._counters = np.ndarray((size, _LINE // 8), np.int64, buffer, _LINE)[:, 0]
        self._slots = np.ndarray((2, size, _stride(nbytes)), np.uint8, buffer, _LINE * (1 + size))
        self._calls = 0

    @classmethod
    def join(cls, store, rank: int, size: int, nbytes: int, tag: str, timeout: float = 300.0) -> HostSum | None:
        """Every member calls this together; all get a HostSum, or all None (see the module).  ``store`` is the
        group's torch.distributed store; ``tag`` names this sum among others of the same group."""
        key = f"fiberrl/host_sum/{tag}"
        if rank == 0:
            opened, token = cls._create(size, nbytes)
            store.set(f"{key}/name", f"{_processes()} {os.getpid()} {opened[0]} {token.hex()}" if opened else "")
        else:
            opened, published = None, store.get(f"{key}/name").decode()
            if published:
                processes, pid, fd, token = published.split()
                if processes == _processes():  # elsewhere, its pid is another process's, or none
                    opened = cls._open(f"/proc/{pid}/fd/{fd}", bytes.fromhex(token), rank)
        store.set(f"{key}/opened/{rank}", "1" if opened is not None else "0")
        everyone = all(store.get(f"{key}/opened/{r}") == b"1" for r in range(size))
        if not everyone:
            if opened is not None:
                opened[1].close()
                os.close(opened[0])
            return None
        return cls(*opened, rank, size, nbytes, timeout)

    @staticmethod
    def _create(size: int, nbytes: int) -> tuple[tuple[int, mmap.mmap] | None, bytes]:
        """Rank 0's memfd, mapped and its lock held; None where there can be none."""
        token = secrets.token_bytes(_TOKEN_BYTES)
        if platform.machine().lower() not in ("x86_64", "amd64") or not hasattr(os, "memfd_create"):
            return None, token
        try:
            fd = os.memfd_create("fiberrl-host-sum", os.MFD_CLOEXEC)
        except OSError:
            return None, token
        try:
            os.ftruncate(fd, _LINE * (1 + size) + 2 * size * _stride(nbytes))
            os.pwrite(fd, token, 0)
            buffer = mmap.mmap(fd, 0)
        except OSError:
            os.close(fd)
            return None, token
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _TOKEN_BYTES)
        except OSError:
            buffer.close()
            os.close(fd)
            return None, token
        return (fd, buffer), token

    @staticmethod
    def _open(path: str, token: bytes, rank: int) -> tuple[int, mmap.mmap] | None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
        except OSError:  # rank 0 is gone, or its processes are not this one's to open
            return None
        try:
            buffer = mmap.mmap(fd, 0)
            if buffer[:_TOKEN_BYTES] != token:
                buffer.close()
                raise ValueError("not rank 0's file")
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _TOKEN_BYTES + rank)
        except (OSError, ValueError):
            os.close(fd)
            return None
        return fd, buffer

    def all_reduce(self, tensor) -> None:
        """``tensor`` (a contiguous CPU tensor) becomes the sum of every member's, as ``dist.all_reduce``."""
        values = tensor.numpy()
        raw = values.reshape(-1).view(np.uint8)
        if raw.size > self.nbytes:
            raise ValueError(f"a sum of {raw.size} bytes over a HostSum of {self.nbytes}")
        self._calls += 1
        slots = self._slots[self._calls % 2]
        slots[self.rank, :raw.size] = raw
        self._counters[self.rank] = self._calls
        self._wait()
        np.copyto(values, slots[0, :raw.size].view(values.dtype).reshape(values.shape))
        for other in range(1, self.size):
            values += slots[other, :raw.size].view(values.dtype).reshape(values.shape)

    def _wait(self) -> None:
        counters, calls = self._counters, self._calls
        began = time.perf_counter()
        next_check = began + _ALIVE_CHECK_S
        while counters.min() < calls:
            now = time.perf_counter()
            if now - began < _SPIN_S:
                continue
            if now - began < _YIELD_S:
                os.sched_yield()
                continue
            time.sleep(_SLEEP_S)
            if now >= next_check:
                next_check = now + _ALIVE_CHECK_S
                late = [rank for rank in range(self.size) if counters[rank] < calls]
                gone = [rank for rank in late if not self._alive(rank)]
                if gone:
                    raise HostSumError(f"Ring member rank {gone[0]} died before sum {calls}", gone[0])
                if now - began > self.timeout:
                    raise HostSumError(f"Ring member rank {late[0]} did not reach sum {calls} within "
                                       f"{self.timeout:.0f} s", late[0])

    def _alive(self, rank: int) -> bool:
        """Whether member ``rank`` still holds its lock: its kernel drops it when it dies."""
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _TOKEN_BYTES + rank)
        except OSError:
            return True
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, _TOKEN_BYTES + rank)
        return False

    def close(self) -> None:
        self._counters = self._slots = None
        self._buffer.close()
        os.close(self._fd)


def _stride(nbytes: int) -> int:
    """A slot's bytes: ``nbytes`` rounded up to a cache line, so that every slot is aligned for any dtype."""
    return -(-nbytes // _LINE) * _LINE


def _processes() -> str:
    """Which processes a pid names here: this kernel (its boot) and pid namespace."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:  # no way to tell: none other matches it
        return f"unknown-{secrets.token_hex(8)}"
