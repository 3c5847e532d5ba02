"""Queues and pipes shared by several processes, over real sockets."""
import gc
import os
import queue
import threading
import time

import numpy as np
import pytest

import fiberrl.runtime as mp
from fiberrl.runtime.processes.hub import get_hub

pytestmark = pytest.mark.slow  # the tests here start processes

N_PER_WRITER = 200


def writer(q, wid, n):
    for i in range(n):
        q.put((wid, i))


def reader(q, out, n):
    got = [q.get(timeout=60) for _ in range(n)]
    out.put(got)


def echo_arrays(inbox, outbox):
    while True:
        item = inbox.get()
        if item is None:
            return
        item *= 2  # received arrays are writable
        outbox.put(item)


def test_many_writers_many_readers_keep_order_per_writer():
    q, out = mp.Queue(), mp.Queue()
    writers, readers = 3, 3
    total = writers * N_PER_WRITER
    procs = [mp.Process(target=writer, args=(q, w, N_PER_WRITER)) for w in range(writers)]
    procs += [mp.Process(target=reader, args=(q, out, total // readers)) for _ in range(readers)]
    for p in procs:
        p.start()
    chunks = [out.get(timeout=120) for _ in range(readers)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    items = [x for chunk in chunks for x in chunk]
    assert sorted(items) == sorted((w, i) for w in range(writers) for i in range(N_PER_WRITER))
    for chunk in chunks:  # each reader sees every writer's items in the order written
        for w in range(writers):
            seq = [i for (ww, i) in chunk if ww == w]
            assert seq == sorted(seq)
    assert q.empty()


def test_get_timeout_and_nonblocking():
    q = mp.Queue()
    # nothing is put until long after the get's 0.3 s: only its timeout can end it (one that ignored
    # its timeout would take this item, rather than hang the suite)
    rescue = threading.Timer(30, q.put, args=("put long after the timeout",))
    rescue.start()
    try:
        t = time.monotonic()
        with pytest.raises(queue.Empty):
            q.get(timeout=0.3)
        assert time.monotonic() - t > 0.25  # and not before it
    finally:
        rescue.cancel()
    with pytest.raises(queue.Empty):
        q.get_nowait()
    q.put(1)
    assert q.get_nowait() == 1


def remote_get_with_timeout(q, out):
    t = time.monotonic()
    try:
        q.get(timeout=0.5)
        out.put("got something")
    except queue.Empty:
        out.put(time.monotonic() - t)
    q.put("late")  # the queue still works after a remote timeout


def test_remote_get_timeout_then_queue_still_works():
    q, out = mp.Queue(), mp.Queue()
    p = mp.Process(target=remote_get_with_timeout, args=(q, out))
    p.start()
    waited = out.get(timeout=30)
    assert isinstance(waited, float) and 0.45 < waited < 10
    assert q.get(timeout=30) == "late"
    p.join(30)


def fill_bounded(q, out):
    q.put(1)
    q.put(2)
    try:
        q.put(3, timeout=0.3)
        out.put("no Full")
    except queue.Full:
        out.put("full")
    q.put(4)  # blocks until the parent makes room


def test_bounded_queue_put_timeout_and_blocking():
    q, out = mp.Queue(maxsize=2), mp.Queue()
    p = mp.Process(target=fill_bounded, args=(q, out))
    p.start()
    assert out.get(timeout=30) == "full"
    assert q.full()
    assert [q.get(timeout=30) for _ in range(3)] == [1, 2, 4]
    p.join(30)
    assert p.exitcode == 0
    local = mp.Queue(maxsize=1)
    local.put_nowait(0)
    with pytest.raises(queue.Full):
        local.put_nowait(1)
    with pytest.raises(queue.Full):
        local.put(1, timeout=0.1)


def test_numpy_arrays_round_trip_writable():
    inbox, outbox = mp.Queue(), mp.Queue()
    p = mp.Process(target=echo_arrays, args=(inbox, outbox))
    p.start()
    big = np.arange(1 << 18, dtype=np.float64)  # 2 MiB
    inbox.put(big)
    inbox.put(np.eye(3, dtype=np.int32))
    got_big, got_eye = outbox.get(timeout=30), outbox.get(timeout=30)
    inbox.put(None)
    p.join(30)
    np.testing.assert_array_equal(got_big, big * 2)
    np.testing.assert_array_equal(got_eye, np.eye(3, dtype=np.int32) * 2)
    assert got_big.flags.writeable


def pass_queue_on(carrier):
    inner = carrier.get(timeout=30)
    inner.put("through a queue")


def test_queue_sent_through_a_queue_and_simple_queue():
    carrier, inner = mp.SimpleQueue(), mp.Queue()
    p = mp.Process(target=pass_queue_on, args=(carrier,))
    p.start()
    carrier.put(inner)
    assert inner.get(timeout=30) == "through a queue"
    p.join(30)
    assert carrier.empty()


def test_closed_queue_handle_refuses_use():
    q = mp.Queue()
    q.close()
    with pytest.raises(ValueError):
        q.put(1)


def ping_pong(conn, n):
    for _ in range(n):
        conn.send(conn.recv() + 1)
    conn.close()


def test_duplex_pipe_ping_pong_then_eof():
    a, b = mp.Pipe()
    p = mp.Process(target=ping_pong, args=(b, 50))
    p.start()
    b.close()  # the parent's copy; the child keeps its own
    x = 0
    for _ in range(50):
        a.send(x)
        x = a.recv() + 1
    assert x == 100
    with pytest.raises(EOFError):
        a.recv()
    assert a.poll(0)  # EOF counts as readable, as in multiprocessing
    p.join(30)


def send_when_told(conn, told):
    told.recv()
    conn.send_bytes(b"xxhelloxx", 2, 5)


def test_simplex_pipe_poll_timeout_and_bytes():
    r, w = mp.Pipe(duplex=False)
    with pytest.raises(OSError):
        r.send(1)
    with pytest.raises(OSError):
        w.recv()
    told, tell = mp.Pipe(duplex=False)
    p = mp.Process(target=send_when_told, args=(w, told))
    p.start()
    assert r.poll(0) is False
    t = time.monotonic()
    assert r.poll(0.1) is False  # nothing comes before the child is told
    assert time.monotonic() - t >= 0.09
    tell.send("now")
    assert r.poll(30) is True
    assert r.recv_bytes() == b"hello"
    p.join(30)
    r.close()
    with pytest.raises(OSError):
        r.recv()


def pipe_between_children_sender(conn):
    conn.send({"from": "sibling"})


def pipe_between_children_receiver(conn, out):
    out.put(conn.recv())


def test_pipe_ends_in_two_children():
    a, b = mp.Pipe()
    out = mp.Queue()
    ps = [mp.Process(target=pipe_between_children_sender, args=(a,)),
          mp.Process(target=pipe_between_children_receiver, args=(b, out))]
    for p in ps:
        p.start()
    assert out.get(timeout=30) == {"from": "sibling"}
    for p in ps:
        p.join(30)


def send_and_close(conn, item, delay):
    time.sleep(delay)
    conn.send(item)
    conn.close()


def send_and_exit(conn, item):
    conn.send(item)


def test_a_pipe_ends_only_when_every_process_holding_its_write_end_closed_it():
    r, w = mp.Pipe(duplex=False)
    quick = mp.Process(target=send_and_exit, args=(w, "quick"))
    closer = mp.Process(target=send_and_close, args=(w, "closer", 0.5))
    slow = mp.Process(target=send_and_close, args=(w, "slow", 1.5))
    for p in (quick, closer, slow):
        p.start()
    w.close()
    got = []
    while True:
        try:
            got.append(r.recv())
        except EOFError:
            break
    # the quick one exited and the closer closed its end long before the slow one sent
    assert got == ["quick", "closer", "slow"]
    for p in (quick, closer, slow):
        p.join(30)


class _FailsToUnpickle:
    def __reduce__(self):
        return os._exit, (7,)  # the child dies taking its arguments, before it holds the pipe's end


def take_nothing(conn, _):
    conn.send("never")


def test_a_childs_pipe_end_is_released_if_it_dies_before_taking_it():
    r, w = mp.Pipe(duplex=False)
    p = mp.Process(target=take_nothing, args=(w, _FailsToUnpickle()))
    p.start()
    w.close()
    assert r.poll(30)
    with pytest.raises(EOFError):
        r.recv()
    p.join(30)
    assert p.exitcode == 7


def test_a_pipe_end_kept_open_in_the_parent_keeps_the_pipe_open():
    r, w = mp.Pipe(duplex=False)
    p = mp.Process(target=send_and_exit, args=(w, "x"))
    p.start()
    assert r.recv() == "x"
    p.join(30)
    assert not r.poll(0.5)  # as in multiprocessing: the parent's own w still could send
    w.close()
    assert r.poll(10)
    with pytest.raises(EOFError):
        r.recv()


def blocked_reader(q, started):
    started.put(os.getpid())
    q.get()  # parked in the queue's owner when killed


def test_item_not_lost_to_a_reader_that_died_waiting():
    q, started = mp.Queue(), mp.Queue()
    victim = mp.Process(target=blocked_reader, args=(q, started))
    victim.start()
    started.get(timeout=30)
    time.sleep(0.5)  # let its get reach the owner and park
    victim.kill()
    victim.join(30)
    time.sleep(0.2)
    q.put("survives")
    out = mp.Queue()
    p = mp.Process(target=reader, args=(q, out, 1))
    p.start()
    assert out.get(timeout=30) == ["survives"]
    p.join(30)


def count_work(q_in, q_out, ident):
    while q_in.get() != "quit":
        q_out.put(ident)


def test_items_are_spread_over_concurrent_readers_evenly():
    """Fiber's test_queue_balance with only the import changed (fiber.queues ->
    fiberrl.runtime.queues): 4 readers of 2,400 items.  Fiber asserts 600 each;
    the tolerance is for a reader that needs more than the test's second to
    make its first request on a loaded machine."""
    from collections import Counter

    from fiberrl.runtime.queues import SimpleQueuePush
    inqueue, outqueue = SimpleQueuePush(), SimpleQueuePush()
    workers = [mp.Process(target=count_work, args=(inqueue, outqueue, i), daemon=True) for i in range(4)]
    for p in workers:
        p.start()
    time.sleep(1)  # as Fiber's test: all readers are waiting
    for _ in range(2400):
        inqueue.put("work")
    counts = Counter(outqueue.get(timeout=60) for _ in range(2400))
    for _ in range(4):
        inqueue.put("quit")
    for p in workers:
        p.join(30)
    assert sorted(counts) == [0, 1, 2, 3]
    assert all(abs(n - 600) <= 60 for n in counts.values()), counts


def count_work_slowly_if_first(q_in, q_out, ident):
    with pytest.raises(queue.Empty):
        q_in.get(block=False)  # the first request makes a reader one of the queue's
    q_out.put("ready")
    while q_in.get() != "quit":
        if ident == 0:
            time.sleep(0.005)
        q_out.put(ident)


def test_a_push_queue_deals_equal_shares_to_a_slow_reader_and_fast_ones():
    from collections import Counter

    from fiberrl.runtime.queues import SimpleQueuePush
    inqueue, outqueue = SimpleQueuePush(), mp.SimpleQueue()
    workers = [mp.Process(target=count_work_slowly_if_first, args=(inqueue, outqueue, i), daemon=True)
               for i in range(3)]
    for p in workers:
        p.start()
    assert [outqueue.get() for _ in range(3)] == ["ready"] * 3
    for _ in range(300):
        inqueue.put("work")
    counts = Counter(outqueue.get() for _ in range(300))
    for _ in range(3):
        inqueue.put("quit")
    for p in workers:
        p.join(30)
    assert counts == {0: 100, 1: 100, 2: 100}


def take_one_then(q_in, q_out, then):
    asked = time.monotonic()  # no later than the queue's owner sees this reader ask
    q_out.put((q_in.get(), asked))
    if then == "sleep":
        time.sleep(60)


def test_what_a_push_queue_dealt_to_a_reader_that_exits_or_stops_asking_goes_to_the_others():
    from fiberrl.runtime.primitives.dealing_channel import IDLE_SECONDS
    from fiberrl.runtime.queues import SimpleQueuePush
    outqueue = mp.SimpleQueue()
    for then in ("exit", "sleep"):
        inqueue = SimpleQueuePush()
        inqueue.put("first")
        reader = mp.Process(target=take_one_then, args=(inqueue, outqueue, then), daemon=True)
        reader.start()
        item, asked = outqueue.get()
        assert item == "first"
        if then == "exit":
            reader.join(30)
        with pytest.raises(queue.Empty):
            inqueue.get(timeout=0.1)  # this process reads too now: half of what follows is its own
        for i in range(10):
            inqueue.put(i)
        assert sorted(inqueue.get(timeout=10) for _ in range(10)) == list(range(10))
        if then == "sleep":  # the sleeper's five were taken only once it had not asked for IDLE_SECONDS
            assert time.monotonic() - asked > IDLE_SECONDS
            reader.terminate()
            reader.join(30)


def drains_until_stop(tasks, results):
    for item in iter(tasks.get, "STOP"):
        time.sleep(0.05)
        results.put(item * 2)


def test_a_queue_its_creator_let_go_of_lives_on_while_other_processes_use_it():
    """Python's own mp_workers example: the main process puts the last tasks and
    "STOP", and drops its queue while the workers still read it."""
    orphans = set(get_hub()._orphans)  # another test's, held by a job that vanished, if any
    results = mp.Queue()
    tasks = mp.Queue()
    p = mp.Process(target=drains_until_stop, args=(tasks, results))
    p.start()
    tasks.put(0)
    assert results.get(timeout=30) == 0  # the worker has used the queue
    for i in range(1, 6):
        tasks.put(i)
    tasks.put("STOP")
    del tasks
    gc.collect()
    assert sorted(results.get(timeout=30) for _ in range(5)) == [2, 4, 6, 8, 10]
    p.join(30)
    assert p.exitcode == 0
    assert get_hub()._orphans <= orphans  # gone with the last process that used it
