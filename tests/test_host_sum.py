"""HostSum: Ring members of one host summing tensors through shared memory (what PPO's learners use for their
gradients), against numpy's sums, through uneven timing, with a member killed, and where members cannot share."""
from __future__ import annotations

import functools
import glob
import os
import signal
import threading
import time

import numpy as np
import pytest

import fiberrl.runtime as mp
from fiberrl.runtime.primitives.host_sum import HostSum, HostSumError


def _join(node):
    global _node
    _node = node
    node.init_process_group("gloo")


def _values(rank: int, call: int, dtype) -> np.ndarray:
    return np.random.default_rng([rank, call]).standard_normal(1000).astype(dtype)


def _sums(calls: int, dtype: str, rank: int, size: int) -> list:
    """``calls`` sums of this member's values, each member late by a different random pause each time."""
    import torch
    summed = HostSum.join(_node.store, rank, size, 1000 * np.dtype(dtype).itemsize, "test")
    assert summed is not None
    pauses = np.random.default_rng(rank).exponential(0.002, calls)
    results = []
    for call in range(calls):
        time.sleep(pauses[call])
        tensor = torch.from_numpy(_values(rank, call, dtype).copy())
        summed.all_reduce(tensor)
        results.append(tensor.numpy().copy())
    with pytest.raises(ValueError):
        summed.all_reduce(torch.zeros(1001, dtype=getattr(torch, dtype)))
    summed.close()
    return results


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_members_of_one_host_get_the_same_sum_as_numpys_in_rank_order_call_after_call(dtype):
    calls, size = 60, 3
    per_rank = mp.Ring(size, functools.partial(_sums, calls, dtype), _join).run()
    for call in range(calls):
        expected = _values(0, call, dtype)
        for rank in range(1, size):
            expected = expected + _values(rank, call, dtype)
        for rank in range(size):  # the same bits on every member
            np.testing.assert_array_equal(per_rank[rank][call], expected)
    # nothing in /dev/shm: the memory was rank 0's memfd, gone with the members
    assert not glob.glob("/dev/shm/fiberrl-host-sum-*")


def _one_dies(rank: int, size: int) -> None:
    import torch
    summed = HostSum.join(_node.store, rank, size, 64, "test")
    summed.all_reduce(torch.ones(4))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    summed.all_reduce(torch.ones(4))  # the others raise HostSumError here


def test_a_member_killed_before_a_sum_is_named_by_the_others_at_once():
    with pytest.raises(mp.RingError) as caught:
        mp.Ring(3, _one_dies, _join).run()
    # the others raised too; the Ring names the member that died, the cause
    assert caught.value.rank == 1, caught.value


def _rank_0_killed_while_the_others_join(rank: int, size: int) -> None:
    if rank == 0:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
    else:
        time.sleep(2)  # rank 0 dies waiting for this one to open its memory
    HostSum.join(_node.store, rank, size, 64, "test")


def test_rank_0_killed_while_the_others_join_leaves_nothing_behind():
    """Killed between making the memory and the others' opening it, rank 0 left a file in /dev/shm: now
    there is none to leave."""
    before = set(glob.glob("/dev/shm/*"))
    with pytest.raises(mp.RingError) as caught:
        mp.Ring(2, _rank_0_killed_while_the_others_join, _join).run()
    assert caught.value.rank == 0, caught.value
    assert set(glob.glob("/dev/shm/*")) <= before


def _survivor_sees(rank: int, size: int):
    """Rank 0 with a HostSum whose rank 1 has died (its lock dropped): the error names it."""
    import torch
    summed = HostSum.join(_node.store, rank, size, 64, "test")
    if rank == 1:
        summed.close()  # closing its file drops its lock, as its death would
        return None
    began = time.monotonic()
    with pytest.raises(HostSumError) as caught:
        summed.all_reduce(torch.ones(4))
    return caught.value.rank, str(caught.value), time.monotonic() - began


def test_the_waiting_member_raises_naming_the_member_gone_within_a_fraction_of_a_second():
    rank, message, waited = mp.Ring(2, _survivor_sees, _join).run()[0]
    assert rank == 1 and message == "Ring member rank 1 died before sum 1", message
    assert waited < 1.0


def _cannot_open(rank: int, size: int):
    # a member on another host (or in a container of its own) cannot open rank 0's file: this one is told it
    # cannot, in place of running it elsewhere
    if rank == 1:
        HostSum._open = staticmethod(lambda *args: None)
    return HostSum.join(_node.store, rank, size, 64, "test")


def test_members_that_cannot_all_open_the_file_all_get_none_and_leave_nothing_behind():
    assert mp.Ring(2, _cannot_open, _join).run() == [None, None]
    assert not glob.glob("/dev/shm/fiberrl-host-sum-*")
