"""``Ring``: a group of equal peers for distributed training (torch.distributed).

    def setup(node):
        node.init_process_group()           # gloo on CPU, nccl where the member has a GPU

    def train(rank, size):
        ...                                  # collectives over torch.distributed
        return final_parameters

    per_rank = Ring(4, train, setup).run()   # [rank 0's return value, rank 1's, ...]

Every member, rank 0 included, is a job-backed ``Process`` with the ``meta``
resources of ``func``.  Rank 0 proves the rendezvous port free by binding it,
then lets it go before anyone is told of it, so that torch can bind it there
however the member starts torch.distributed: ``node.init_process_group()``,
Fiber's initializer (``MASTER_ADDR``/``MASTER_PORT`` and env://), or a script
written for torchrun: every member's environment carries torchrun's
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``.  If a member raises or dies, ``run()``
stops the others and raises ``RingError`` naming it; so too if a member goes
unheard past ``silence_timeout`` (its host cut off or stalled: the others wait
for it in a collective), after giving it up (``Process.cut_off``).
"""
from __future__ import annotations

import datetime
import logging
import os
import queue
import random
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass

import cloudpickle

from ..backends import listen_host
from ..meta import resources_of
from ..pool.results import with_remote_traceback
from ..processes.process import Process
from .queues import Queue

log = logging.getLogger("fiberrl")

# how often run() looks for a member that died without a word: a dead member
# must not leave the others blocked in a collective for long
_POLL = 0.1
# how long members get to exit on their own (after SIGTERM, or after their
# last result) before they are killed
_GRACE = 3.0
# how long run() waits, once a member reports an error, for a member that
# died silently: that death, not the errors it caused in others, is the cause
_SETTLE = 0.5
# how often run() looks for a member gone unheard
_UNHEARD_CHECK = 1.0


class RingError(RuntimeError):
    """A member of a Ring raised or died; ``rank`` says which one."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


@dataclass
class RingMember:
    """One member as Fiber's ``ring.members[i]`` showed it."""

    rank: int
    ip: str
    port: int | None  # only rank 0 has a port: the rendezvous
    connected: bool = True


class RingNode:
    """What a member's initializer is given: its place in the ring and the
    rendezvous address (``master_addr``, ``master_port``), free for rank 0's
    torch to bind.  After ``init_process_group``, ``store`` is the group's
    ``torch.distributed.TCPStore``, for counters of the members' own (keys under
    ``fiberrl/`` are the Ring's)."""

    def __init__(self, rank: int, size: int, members: list[RingMember], gpu: bool):
        self.rank = rank
        self.size = size
        self.members = members
        self.master_addr = members[0].ip
        self.master_port = members[0].port
        self._gpu = gpu
        self._owns_group = False
        self.store = None

    def init_process_group(self, backend: str | None = None,
                           timeout: float | datetime.timedelta = 300.0) -> None:
        """Join torch.distributed over this ring's rendezvous; the process
        group is destroyed when ``func`` returns."""
        import torch
        import torch.distributed as dist

        if backend is None:
            backend = "nccl" if self._gpu and torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            # members that share a machine's GPUs must not share one device
            torch.cuda.set_device(self.rank % torch.cuda.device_count())
        if not isinstance(timeout, datetime.timedelta):
            timeout = datetime.timedelta(seconds=timeout)
        store = self._store(dist, timeout)
        if backend == "nccl":
            self._refuse_a_shared_gpu(store, torch)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.size, timeout=timeout)
        self.store, self._owns_group = store, True

    def _refuse_a_shared_gpu(self, store, torch) -> None:
        """NCCL refuses two ranks on one GPU with a page of its own (members with meta(gpu=1) on a
        machine of fewer GPUs than members share them); say it in one line, with what to do."""
        gpu = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        here = f"{self.members[self.rank].ip} {gpu}"
        store.set(f"fiberrl/ring/gpu/{self.rank}", here)
        for other in range(self.size):
            if other != self.rank and store.get(f"fiberrl/ring/gpu/{other}").decode() == here:
                first, second = sorted((self.rank, other))
                raise RuntimeError(
                    f"ranks {first} and {second} share GPU {gpu} on {self.members[self.rank].ip}, and NCCL needs a GPU "
                    f"per rank: run at most as many members per machine as it has GPUs, or init_process_group('gloo')")

    def _store(self, dist, timeout: datetime.timedelta):
        return dist.TCPStore(self.master_addr, self.master_port, self.size, is_master=self.rank == 0,
                             timeout=timeout)

    def release_port(self) -> None:
        """Kept for initializers written against it: the port is already free
        and MASTER_ADDR and MASTER_PORT already in the environment."""
        os.environ["MASTER_ADDR"] = self.master_addr
        os.environ["MASTER_PORT"] = str(self.master_port)

    def _close(self) -> None:
        if self._owns_group:
            import torch.distributed as dist
            if dist.is_initialized():  # unless func destroyed it itself
                dist.destroy_process_group()
            self._owns_group = False


class Ring:
    """``processes`` peers, each running ``initializer(node, *initargs)`` and
    then ``func(rank, size)``; ``run()`` returns their results in rank order."""

    def __init__(self, processes: int, func, initializer=None, initargs=()):
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"Ring(processes={processes!r}): expected an int >= 1")
        if not callable(func):
            raise ValueError(f"Ring(func={func!r}): func must be callable as func(rank, size)")
        if initializer is not None and not callable(initializer):
            raise ValueError(f"Ring(initializer={initializer!r}): initializer must be callable or None")
        self.size = processes
        self.func = func
        self.initializer = initializer
        self.initargs = tuple(initargs)
        self._resources = resources_of(func) or resources_of(initializer)
        self._ran = False
        self._members: list[Process] = []

    def pids(self) -> list[int | None]:
        """The members' pids in rank order, once ``run()`` has started them (the backend's job ids
        where a job has no pid here)."""
        return [p.pid for p in self._members]

    def run(self) -> list:
        if self._ran:
            raise RuntimeError("a Ring runs once; create a new Ring to run again")
        self._ran = True
        results, roster = Queue(), Queue()
        members: list[Process] = self._members
        finished = False
        try:
            for rank in range(self.size):
                p = Process(target=_member, name=f"Ring-{rank}",
                            args=(rank, self.size, self.func, self.initializer, self.initargs,
                                  self._resources.get("gpu"), results, roster))
                p._resources = self._resources
                p.start()
                members.append(p)
            values = self._collect(members, results, roster)
            finished = True
            return values
        finally:
            _stop(members, patient=finished)

    def _collect(self, members: list[Process], results: Queue, roster: Queue) -> list:
        hosts: dict[int, tuple] = {}
        values: dict[int, object] = {}
        failed: dict[int, RingError] = {}  # in the order they were reported
        dead: dict[int, RingError] = {}  # exited without a word
        first_failure = None
        next_check = time.monotonic() + _UNHEARD_CHECK

        def handle(message) -> None:
            kind, rank, *rest = message
            if kind == "hello":
                hosts[rank] = tuple(rest)
                if len(hosts) == self.size:
                    table = [(r, *hosts[r]) for r in range(self.size)]
                    for _ in range(self.size):
                        roster.put(table)
            elif kind == "done":
                try:
                    values[rank] = cloudpickle.loads(rest[0])
                except Exception as exc:
                    failed[rank] = RingError(f"Ring member rank {rank}'s return value cannot be unpickled here: "
                                             f"{type(exc).__name__}: {exc}", rank)
                    failed[rank].__cause__ = exc
            else:
                failed[rank] = _failure(rank, *rest)

        def drain() -> None:
            while True:
                try:
                    handle(results.get(block=False))
                except queue.Empty:
                    return

        while len(values) < self.size:
            try:
                handle(results.get(timeout=_POLL))
            except queue.Empty:
                pass
            for rank, p in enumerate(members):
                if rank in values or rank in failed or rank in dead or p.exitcode is None:
                    continue
                drain()  # a member flushes what it put before it exits: read it before calling it dead
                if rank not in values and rank not in failed:
                    dead[rank] = RingError(f"Ring member rank {rank} {_describe_exit(p.exitcode)} "
                                           "before returning", rank)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + _UNHEARD_CHECK
                for rank, p in enumerate(members):
                    if rank not in values and rank not in dead and p.exitcode is None and p.unheard():
                        try:
                            p.cut_off()
                        except Exception as exc:  # the backend cannot reach it either: its lifeline ends it
                            log.warning("could not kill the job of Ring member rank %d: %s", rank, exc)
                        dead[rank] = RingError(f"Ring member rank {rank} has not been heard for over "
                                               f"silence_timeout: its host is cut off or stalled", rank)
            if failed and first_failure is None:
                first_failure = time.monotonic()
            settled = (first_failure is not None and time.monotonic() - first_failure >= _SETTLE
                       or len(values) + len(failed) + len(dead) == self.size)
            if dead or (failed and settled):
                # a member that died takes the others' collectives down with it: it is the cause
                cause = next(iter(dead.values())) if dead else next(iter(failed.values()))
                raise _with_others(cause, sorted(set(failed) | set(dead)))
        return [values[r] for r in range(self.size)]


def _with_others(error: RingError, ranks: list[int]) -> RingError:
    others = [r for r in ranks if r != error.rank]
    if others:
        error.args = (f"{error.args[0]} (rank{'s' if len(others) > 1 else ''} "
                      f"{', '.join(map(str, others))} failed too)",)
    return error


def _failure(rank: int, summary: str, tb: str, pickled_exc: bytes | None) -> RingError:
    cause: BaseException | None = None
    if pickled_exc is not None:
        try:
            cause = cloudpickle.loads(pickled_exc)
        except Exception:
            pass
    if not isinstance(cause, BaseException):
        cause = RuntimeError(summary)
    error = RingError(f"Ring member rank {rank} failed: {summary}", rank)
    error.__cause__ = with_remote_traceback(cause, tb)
    return error


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"exited with code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exited with code {code}"


def _stop(members: list[Process], patient: bool) -> None:
    """Leave no member behind: terminate, then kill those that do not go."""
    if patient:
        _join_all(members, _GRACE)  # they have sent their results and are on their way out
    for p in members:
        if p.exitcode is None:
            p.terminate()
    _join_all(members, _GRACE)
    for p in members:
        if p.exitcode is None:
            p.kill()
    _join_all(members, 10.0)


def _join_all(members: list[Process], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in members:
        p.join(max(0.0, deadline - time.monotonic()))


_FIXED_PORTS_END = 10000  # well-known and commonly configured service ports stay untouched
_PORT_TRIES = 64


def _listen(host: str, backlog: int) -> socket.socket:
    """A socket on a port below the kernel's ephemeral range where one is free:
    rank 0's rendezvous port is unheld from the moment it is advertised until
    torch binds it, and a port inside the range can meanwhile become some
    connection's local port, the worst being a member's own retried connect to
    it (TCP self-connect), which then holds it against rank 0."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low = _ephemeral_low()
    if low > _FIXED_PORTS_END:
        for port in random.sample(range(_FIXED_PORTS_END, low), min(_PORT_TRIES, low - _FIXED_PORTS_END)):
            try:
                return socket.create_server((host, port), family=family, backlog=backlog)
            except OSError:
                continue
    return socket.create_server((host, 0), family=family, backlog=backlog)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default and the IANA dynamic range's start


def _free_port(host: str) -> int:
    """A port torch can bind on ``host``: bound to prove it free, and let go
    before it is advertised, so that no member's connect can ever reach a
    socket that is about to close (the port is outside the ephemeral range, so
    nothing takes it meanwhile unless it binds it by number)."""
    with _listen(host, 1) as reservation:
        return reservation.getsockname()[1]


def _torchrun_env(rank: int, members: list[RingMember]) -> dict[str, str]:
    """torchrun's contract, so that env:// rendezvous and scripts written for
    torchrun work unchanged; a member's host is the address it listens on."""
    same_host = [m.rank for m in members if m.ip == members[rank].ip]
    return {"RANK": str(rank), "WORLD_SIZE": str(len(members)),
            "LOCAL_RANK": str(same_host.index(rank)), "LOCAL_WORLD_SIZE": str(len(same_host)),
            "MASTER_ADDR": members[0].ip, "MASTER_PORT": str(members[0].port)}


def _member(rank, size, func, initializer, initargs, gpu, results: Queue, roster: Queue) -> None:
    """What each member runs, in its own job."""
    try:
        host = listen_host()
        results.put(("hello", rank, host, _free_port(host) if rank == 0 else None))
        members = [RingMember(r, ip, port) for r, ip, port in roster.get()]
        os.environ.update(_torchrun_env(rank, members))
        if gpu is None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
            gpu = bool(visible) and visible != "-1"
        node = RingNode(rank, size, members, bool(gpu))
        if initializer is not None:
            initializer(node, *initargs)
        value = func(rank, size)
        node._close()
        try:
            payload = cloudpickle.dumps(value, protocol=5)
        except Exception as exc:
            raise TypeError(f"rank {rank}'s return value cannot be pickled: {type(exc).__name__}: {exc}") from None
        results.put(("done", rank, payload))
    except BaseException as exc:
        try:
            pickled_exc = cloudpickle.dumps(exc, protocol=5)
        except Exception:
            pickled_exc = None
        summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        results.put(("failed", rank, summary, traceback.format_exc(), pickled_exc))
        sys.exit(1)


__all__ = ["Ring", "RingError", "RingMember", "RingNode"]
