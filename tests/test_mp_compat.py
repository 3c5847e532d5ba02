"""The rest of multiprocessing's module-level API: shared objects made with
``mp.Lock()``, ``mp.Value()``... (served by a manager the process starts on
first use), start methods and contexts, its exceptions and its logger."""
import ctypes
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import fiberrl.runtime as mp
from fiberrl.runtime.connection import wait
from fiberrl.runtime.primitives.synchronize import shutdown_manager

pytestmark = pytest.mark.slow  # the tests here start processes


@pytest.fixture(autouse=True)
def stop_the_shared_objects_manager():
    yield
    shutdown_manager()  # it would live until exit, and the suite checks each test leaves no process


def add_under_lock(counter, total, times):
    for _ in range(times):
        with counter.get_lock():
            counter.value += 1
    with total.get_lock():
        total[0] += times
        total[1:3] = [7, 8]


def test_value_and_array_with_their_locks_lose_no_update_between_processes():
    counter = mp.Value("i", 0)
    total = mp.Array(ctypes.c_double, 3)
    workers = [mp.Process(target=add_under_lock, args=(counter, total, 25)) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    assert counter.value == 75
    assert total[:] == [75.0, 7.0, 8.0] and len(total) == 3 and list(total) == total[:]
    assert mp.Value(ctypes.c_double, 1.5, lock=False).value == 1.5
    assert mp.RawArray("i", [1, 2])[:].tolist() == [1, 2]  # raw: the manager's array itself
    with pytest.raises(TypeError, match="not a ctypes type of a number"):
        mp.Value(ctypes.c_char_p, b"x")


def wait_then_report(ready, go, barrier, queue):
    ready.set()
    assert go.wait(30)
    barrier.wait(30)
    queue.put("through")
    queue.task_done()


def test_events_barriers_locks_and_joinable_queues_work_between_processes():
    ready, go, barrier, queue = mp.Event(), mp.Event(), mp.Barrier(3), mp.JoinableQueue()
    workers = [mp.Process(target=wait_then_report, args=(ready, go, barrier, queue)) for _ in range(2)]
    for w in workers:
        w.start()
    assert ready.wait(30) and not go.is_set()
    go.set()
    barrier.wait(30)  # the third party: every worker got here too
    assert sorted(queue.get(timeout=30) for _ in workers) == ["through", "through"]
    for w in workers:
        w.join(30)
    assert [w.exitcode for w in workers] == [0, 0]
    lock, rlock, semaphore = mp.Lock(), mp.RLock(), mp.BoundedSemaphore(2)
    assert lock.acquire() and not lock.acquire(False)
    lock.release()
    with rlock, rlock:  # re-entrant
        pass
    assert semaphore.acquire() and semaphore.acquire() and not semaphore.acquire(False)
    condition = mp.Condition()
    with condition:
        assert condition.wait(0.01) is False
    with pytest.raises(TypeError, match="needs a lock made by fiberrl.runtime.Lock"):
        mp.Condition(threading.Lock())


def set_under_condition(condition, flag):
    with condition:
        flag.value = 1
        condition.notify_all()


def test_a_condition_on_a_lock_of_ones_own_holds_that_lock_and_wakes_other_processes():
    lock, flag = mp.Lock(), mp.Value("i", 0, lock=False)
    condition = mp.Condition(lock)
    with condition:
        assert not lock.acquire(False)
        setter = mp.Process(target=set_under_condition, args=(condition, flag))
        setter.start()
        assert condition.wait_for(lambda: flag.value == 1, timeout=30)
    setter.join(30)
    assert setter.exitcode == 0


def slow(x):
    time.sleep(x)
    return x


def test_a_pools_timeout_is_multiprocessings_and_the_builtin_one():
    with mp.Pool(1) as pool:
        result = pool.apply_async(slow, (2,))
        with pytest.raises(multiprocessing.TimeoutError):
            result.get(0.05)
        with pytest.raises(TimeoutError):
            result.get(0.05)
        try:
            result.get(0.05)
        except mp.TimeoutError as exc:
            assert "not ready after 0.05 s" in str(exc)
        assert result.get(30) == 2


def test_contexts_and_start_methods_are_this_api():
    ctx = mp.get_context("spawn")
    assert ctx is mp and ctx.Process is mp.Process and ctx.Pool is mp.Pool
    assert mp.get_context() is mp and mp.get_context("fork") is mp
    mp.set_start_method("forkserver", force=True)
    assert mp.get_start_method() == "spawn" and mp.get_all_start_methods() == ["spawn"]
    with pytest.raises(ValueError, match="cannot find context for 'threads'"):
        mp.get_context("threads")
    mp.freeze_support()
    assert mp.ProcessError is multiprocessing.ProcessError
    assert mp.AuthenticationError is multiprocessing.AuthenticationError
    logger = mp.log_to_stderr(logging.INFO)
    assert logger is mp.get_logger() and logger.name == "fiberrl" and logger.level == logging.INFO
    mp.log_to_stderr()
    assert sum(getattr(h, "_fiberrl_stderr", False) for h in logger.handlers) == 1  # once, however often asked


def sleep_then_send(seconds, conn):
    time.sleep(seconds)
    conn.send("woke")


def test_sentinels_and_pipes_are_waited_on_together():
    reader, writer = mp.Pipe(duplex=False)
    quick = mp.Process(target=time.sleep, args=(0.2,))
    sender = mp.Process(target=sleep_then_send, args=(1.0, writer))
    for p in (quick, sender):
        p.start()
    assert wait([quick.sentinel, sender.sentinel, reader], timeout=0.05) == []
    assert wait([quick.sentinel, sender.sentinel, reader], timeout=30) == [quick.sentinel]
    assert quick.exitcode == 0
    assert wait([sender.sentinel, reader], timeout=30)[0] is reader
    assert reader.recv() == "woke"
    assert wait([sender.sentinel], timeout=30) == [sender.sentinel]
    assert multiprocessing.connection.wait([sender.sentinel], 0) == [sender.sentinel]  # multiprocessing's own too
    sender.join()
    sender.close()
    with pytest.raises(ValueError, match="closed"):
        _ = sender.sentinel


MAIN_ALIASING = """
import pickle
import fiberrl.runtime as mp

class Point:
    def __init__(self, x):
        self.x = x

def double(x):
    return 2 * x

def in_the_child(q):
    import __main__
    # what a multiprocessing spawn child can do: its target's module is the parent's script,
    # imported again, so plain pickle finds the script's functions and classes by name
    again = pickle.loads(pickle.dumps(double))
    point = pickle.loads(pickle.dumps(Point(3)))
    q.put((again(21), point.x, double is __main__.double, isinstance(point, __main__.Point)))

if __name__ == "__main__":
    q = mp.Queue()
    p = mp.Process(target=in_the_child, args=(q,))
    p.start()
    print(q.get(timeout=60))
    p.join(60)
    with mp.Pool(1) as pool:
        print(pool.map(double, [1, 2]), pool.apply(lambda: (lambda y: y + 1)(1)))
    print(type(Point(1)) is Point)
"""


def test_a_main_scripts_functions_pickle_by_name_in_a_child_as_with_spawn(tmp_path, script_env):
    script = tmp_path / "main_aliasing.py"
    script.write_text(MAIN_ALIASING)
    out = subprocess.run([sys.executable, str(script)], env=script_env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["(42, 3, True, True)", "[2, 4] 2", "True"]


def put_doubled(q, x):
    q.put(2 * x)


def send_hello(conn):
    conn.send("hello")


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_a_plain_multiprocessing_child_uses_a_queue_and_a_pipe_of_the_run(method):
    """multiprocessing hands its children its authkey, which a process of the run makes
    the run's secret: the child proves itself with it (checked against the run's id)."""
    ctx = multiprocessing.get_context(method)
    q = mp.Queue()
    p = ctx.Process(target=put_doubled, args=(q, 21))
    p.start()
    assert q.get(timeout=30) == 42
    p.join(30)
    reader, writer = mp.Pipe(duplex=False)
    p = ctx.Process(target=send_hello, args=(writer,))
    p.start()
    assert reader.poll(30) and reader.recv() == "hello"
    p.join(30)


def put_and_end(q, x):
    q.put(x)  # and end at once: multiprocessing's fork child then leaves by os._exit


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_what_a_plain_multiprocessing_child_puts_just_before_it_ends_arrives(method):
    # its process ends past atexit; a third of these puts were lost with their fork children
    ctx = multiprocessing.get_context(method)
    q = mp.Queue()
    for i in range(20):
        p = ctx.Process(target=put_and_end, args=(q, i))
        p.start()
        p.join(30)
        assert p.exitcode == 0
    assert sorted(q.get(timeout=10) for _ in range(20)) == list(range(20))


def send_after(conn, item, delay):
    time.sleep(delay)
    conn.send(item)


def sleep_then_note(seconds, path):
    time.sleep(seconds)
    with open(path, "w") as fh:
        fh.write("woke")


def close_and_linger(conn, linger):
    conn.close()
    time.sleep(linger)


def test_forked_multiprocessing_children_hold_their_copies_of_a_pipes_end(tmp_path):
    """As with a pipe's descriptors: each forked child's copy counts until it sends and
    exits, closes it, or ends unused; the parent closing its own right after start()
    ends nothing."""
    ctx = multiprocessing.get_context("fork")
    reader, writer = mp.Pipe(duplex=False)
    woke = tmp_path / "woke"
    children = [ctx.Process(target=send_after, args=(writer, i, 0.4 * i)) for i in range(3)]
    children.append(ctx.Process(target=sleep_then_note, args=(1.5, woke)))  # never uses its copy
    for p in children:
        p.start()
    writer.close()
    got = []
    while True:
        try:
            got.append(reader.recv())
        except EOFError:
            break
    assert got == [0, 1, 2]
    assert woke.exists(), "the pipe ended before the idle child did: its copy did not hold it open"
    for p in children:
        p.join(30)
    reader, writer = mp.Pipe(duplex=False)
    p = ctx.Process(target=close_and_linger, args=(writer, 5.0))
    p.start()
    writer.close()
    assert reader.poll(3)  # both copies closed: EOF while the child still lives
    with pytest.raises(EOFError):
        reader.recv()
    p.join(30)


def write_later(path):
    time.sleep(1.0)
    with open(path, "w") as fh:
        fh.write("done")


def start_a_multiprocessing_child(path):
    multiprocessing.get_context("spawn").Process(target=write_later, args=(path,)).start()


def test_a_jobs_multiprocessing_children_are_joined_when_it_ends(tmp_path):
    """As in multiprocessing: a process's non-daemonic children are waited for at its end."""
    marker = tmp_path / "written"
    p = mp.Process(target=start_a_multiprocessing_child, args=(str(marker),))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert marker.read_text() == "done"


def fail_in_task(_):
    raise ValueError("in the task")


def answer_over_a_listener(address):
    from fiberrl.runtime.connection import Client
    with Client(address) as conn:  # multiprocessing's default authkey: the run's secret
        conn.send(conn.recv() * 2)


def test_what_multiprocessings_own_suite_found_missing():
    """From CPython's test._test_multiprocessing run against fiberrl
    (experiments/compat/cpython_mp_suite.py): each a thing a user's code may do."""
    # a non-blocking acquire with a timeout, which multiprocessing accepts and ignores
    semaphore = mp.Semaphore(0)
    assert semaphore.acquire(False, 0.1) is False
    # the main process is alive, and has no exit code yet
    assert mp.current_process().is_alive() and mp.current_process().exitcode is None
    # a Value's lock=None is a lock of its own, lock=False none, and anything without acquire() is refused
    assert mp.Value("i", 5, lock=None).get_lock() is not None
    assert not hasattr(mp.Value("i", 5, lock=False), "get_lock")
    with pytest.raises(AttributeError, match="has no method 'acquire'"):
        mp.Value("i", 5, lock="navalue")
    # a task's remote traceback is multiprocessing's class
    import multiprocessing.pool
    with mp.Pool(1) as pool, pytest.raises(ValueError) as raised:
        pool.map(fail_in_task, [1])
    assert type(raised.value.__cause__) is multiprocessing.pool.RemoteTraceback
    # multiprocessing.connection's Listener and Client between processes of the run
    from fiberrl.runtime.connection import Listener
    with Listener(("127.0.0.1", 0)) as listener:
        p = mp.Process(target=answer_over_a_listener, args=(listener.address,))
        p.start()
        with listener.accept() as conn:
            conn.send(21)
            assert conn.recv() == 42
        p.join(30)
    assert p.exitcode == 0


def sends_its_logger_level(conn):
    conn.send(multiprocessing.get_logger().getEffectiveLevel())
    conn.close()


def test_a_multiprocessing_pipe_end_given_to_a_process_is_the_same_pipe_there():
    """multiprocessing's connections travel as descriptors duplicated through its
    resource sharer, as its own pickler sends them; plain pickle copied the bare
    descriptor number, and the child wrote into whatever file had it there."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    logger = multiprocessing.get_logger()
    before = logger.level
    logger.setLevel(32)
    try:
        p = mp.Process(target=sends_its_logger_level, args=(writer,))
        p.start()
        assert reader.poll(30), "nothing came through the pipe"
        assert reader.recv() == 32
        p.join(30)
        assert p.exitcode == 0
        # and inside a message on the run's queue
        q = mp.Queue()
        reader, writer = multiprocessing.Pipe(duplex=False)
        p = mp.Process(target=sends_what_it_is_given, args=(q,))
        p.start()
        q.put(writer)
        assert reader.poll(30) and reader.recv() == "through the pipe"
        p.join(30)
    finally:
        logger.setLevel(before)


def sends_what_it_is_given(q):
    conn = q.get(timeout=30)
    conn.send("through the pipe")
    conn.close()


def writes_into_shared_memory(block, data):
    from multiprocessing import shared_memory
    attached = shared_memory.SharedMemory(block) if isinstance(block, str) else block
    attached.buf[:len(data)] = data
    attached.close()


def makes_shared_memory(q):
    from multiprocessing import shared_memory
    block = shared_memory.SharedMemory(create=True, size=64)
    block.buf[:3] = b"abc"
    q.put(block.name)
    block.close()


def test_shared_memory_outlives_the_children_that_attach_to_it_or_make_it():
    """A job on its parent's host uses the parent's resource tracker, as a
    multiprocessing spawn child does: one with its own unlinked, as it ended,
    every block it had attached to (Python registers a block on attach)."""
    from multiprocessing import shared_memory
    block = shared_memory.SharedMemory(create=True, size=512)
    try:
        for given, data in ((block.name, b"howdy"), (block, b"HELLO")):
            p = mp.Process(target=writes_into_shared_memory, args=(given, data))
            p.start()
            p.join(30)
            assert p.exitcode == 0 and bytes(block.buf[:5]) == data
    finally:
        block.close()
        block.unlink()  # FileNotFoundError here if a child's tracker had unlinked it
    q = mp.Queue()
    p = mp.Process(target=makes_shared_memory, args=(q,))
    p.start()
    name = q.get(timeout=30)
    p.join(30)
    made = shared_memory.SharedMemory(name)  # still there once its maker has ended
    assert bytes(made.buf[:3]) == b"abc"
    made.close()
    made.unlink()


class Point(ctypes.Structure):
    _fields_ = [("x", ctypes.c_double), ("y", ctypes.c_double)]


class Segment(ctypes.Structure):
    _fields_ = [("ends", Point * 2), ("label", ctypes.c_char * 8)]


def modify(n, x, s, points, segment):
    # the Python documentation's sharedctypes example, and a nested structure
    n.value **= 2
    x.value **= 2
    s.value = s.value.upper()
    for a in points:
        a.x **= 2
        a.y **= 2
    segment.ends[1].y = 7.5
    segment.label = b"moved"


def test_shared_char_arrays_and_structures_as_multiprocessing_sharedctypes_makes_them():
    from fiberrl.runtime.sharedctypes import Array, RawValue, Value
    lock = mp.Lock()
    n = Value("i", 7)
    x = Value(ctypes.c_double, 1.0 / 3.0, lock=False)
    s = Array("c", b"hello world", lock=lock)
    points = Array(Point, [(1.875, -6.25), (-5.75, 2.0), (2.375, 9.5)], lock=lock)
    segment = RawValue(Segment)
    p = mp.Process(target=modify, args=(n, x, s, points, segment))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert (n.value, x.value, s.value) == (49, 1.0 / 9.0, b"HELLO WORLD")
    assert [(a.x, a.y) for a in points] == [(3.515625, 39.0625), (33.0625, 4.0), (5.640625, 90.25)]
    assert (segment.ends[1].y, segment.ends[0].y, segment.label) == (7.5, 0.0, b"moved")
    # a char array reads as ctypes' does
    assert (s[0], s[-1], s[:5], len(s), s.raw) == (b"H", b"D", b"HELLO", 11, b"HELLO WORLD")
    with pytest.raises(IndexError):
        s[11]
    s.value = b"hi"
    assert s.raw == b"hi\x00LO WORLD" and s.value == b"hi"
    assert s.get_lock() is lock and points[-1].x == 5.640625
    copy = points[1].get_copy()
    assert isinstance(copy, Point) and (copy.x, copy.y) == (33.0625, 4.0)
    with pytest.raises(AttributeError):
        points[0].z


def notifies_then_interrupts(condition, pid):
    with condition:
        condition.notify()
    time.sleep(0.5)
    os.kill(pid, signal.SIGINT)


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt, as in a terminal.  A Python started with SIGINT
    ignored (a shell's background job: `cmd &` in a script) installs no handler for it."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_in_a_condition_wait_gives_the_lock_back_at_once(ctrl_c_raises):
    """As multiprocessing's Condition (CPython's test_wait_result): the wait raises
    KeyboardInterrupt holding the lock, and the with block's release does not wait
    behind the manager's side of the wait (its 60 s)."""
    condition = mp.Condition()
    with condition:
        p = mp.Process(target=notifies_then_interrupts, args=(condition, os.getpid()))
        p.start()
        assert condition.wait(60) is True
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            condition.wait(60)
    assert time.monotonic() - started < 10
    p.join(30)
    with condition:  # it still works: nothing waits on its own
        assert condition.wait(0.1) is False
