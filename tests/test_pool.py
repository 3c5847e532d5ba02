"""Pool: the multiprocessing.Pool API, errors, scheduling and resizing."""
import itertools
import os
import resource
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import fiberrl.runtime as mp
from conftest import wait_until

pytestmark = pytest.mark.slow  # the tests here start processes


def square(x):
    return x * x


def add(a, b):
    return a + b


def fail_on(x, bad=3):
    if x == bad:
        raise ValueError(f"task got {x}")
    return x


def pid_after(seconds):
    time.sleep(seconds)
    return os.getpid()


def init_marker(value):
    global MARKER
    MARKER = value


def read_marker(_):
    return MARKER


def nested_sum(n):
    with mp.Pool(2) as inner:
        return sum(inner.map(square, range(n)))


def wait_for(path: str, timeout: float) -> bool:
    """Until ``path`` exists (True), or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def pid_when_let_go(folder: str, name: str, patience: float = 60.0):
    """A task that says it started (``<name>.started`` in ``folder``) and runs until the test lets it go
    (``<name>.go``): its pid, and whether it was let go (False: it gave up after ``patience`` seconds).
    What happens while it runs is then so by order, not by how fast the machine is."""
    open(os.path.join(folder, name + ".started"), "w").close()
    return os.getpid(), wait_for(os.path.join(folder, name + ".go"), patience)


def test_map_apply_starmap_imap_and_results():
    with mp.Pool(3) as pool:
        assert pool.map(square, range(50)) == [x * x for x in range(50)]
        assert pool.map(square, range(50), chunksize=7) == [x * x for x in range(50)]
        assert pool.map(square, []) == []
        assert pool.starmap(add, [(1, 2), (3, 4)]) == [3, 7]
        assert pool.apply(add, (2,), {"b": 5}) == 7
        assert list(pool.imap(square, range(20), chunksize=3)) == [x * x for x in range(20)]
        assert sorted(pool.imap_unordered(square, range(20))) == sorted(x * x for x in range(20))
        assert pool.map(lambda x: x + 1, [1, 2]) == [2, 3]

        r = pool.apply_async(pid_after, (0.5,))
        assert not r.ready()
        with pytest.raises(ValueError):
            r.successful()
        with pytest.raises(TimeoutError):
            r.get(timeout=0.05)
        r.wait(30)
        assert r.ready() and r.successful() and isinstance(r.get(), int)

        seen = []
        done = threading.Event()
        pool.map_async(square, range(5), callback=lambda v: (seen.append(v), done.set()))
        assert done.wait(30) and seen == [[0, 1, 4, 9, 16]]


def test_close_join_and_use_after_close():
    pool = mp.Pool(2)
    results = pool.map_async(pid_after, [0.2] * 6)
    pool.close()
    with pytest.raises(ValueError):
        pool.apply_async(square, (1,))
    other = mp.Pool(1)
    with pytest.raises(ValueError):
        other.join()  # still running
    other.terminate()
    pool.join()
    assert len(results.get(1)) == 6
    assert mp.active_children() == []


def test_initializer_runs_in_every_worker_and_function_sent_once():
    with mp.Pool(2, initializer=init_marker, initargs=("ready",)) as pool:
        assert set(pool.map(read_marker, range(8), chunksize=1)) == {"ready"}


def test_several_pools_and_nested_pools():
    with mp.Pool(2) as a, mp.Pool(2) as b:
        ra = a.map_async(square, range(10))
        rb = b.map_async(nested_sum, [3, 4])
        assert ra.get(60) == [x * x for x in range(10)]
        assert rb.get(120) == [5, 14]


def test_exception_reraised_with_remote_traceback_and_not_retried(tmp_path):
    with mp.Pool(2) as pool:
        with pytest.raises(ValueError, match="task got 3") as info:
            pool.map(fail_on, range(6), chunksize=1)
        assert "fail_on" in str(info.value.__cause__)  # the worker's traceback
        errors = []
        r = pool.apply_async(fail_on, (3,), error_callback=errors.append)
        with pytest.raises(ValueError):
            r.get(30)
        assert not r.successful() and isinstance(errors[0], ValueError)
        it = pool.imap(fail_on, range(5))
        assert [next(it), next(it), next(it)] == [0, 1, 2]
        with pytest.raises(ValueError):
            next(it)
        assert list(it) == [4]  # the iterator goes on after a failed task
        stats = pool.statistics()
        assert stats.tasks_resubmitted == 0 and stats.worker_restarts == 0


def test_unpicklable_arguments_and_results_name_the_task_and_pool_goes_on():
    lock = threading.Lock()
    with mp.Pool(2) as pool:
        with pytest.raises(TypeError, match=r"task 2 of map\(square\): its arguments cannot be pickled"):
            pool.map(square, [1, 2, lock, 4], chunksize=1)
        with pytest.raises(TypeError, match="the result could not be pickled"):
            pool.apply(threading.Lock)
        with pytest.raises(TypeError, match="the function cannot be pickled"):
            pool.apply_async(lambda: lock)
        assert pool.map(square, range(4)) == [0, 1, 4, 9]


def test_imap_is_lazy_over_an_endless_generator():
    pulled = itertools.count()

    def endless():
        for i in itertools.count():
            next(pulled)
            yield i

    with mp.Pool(2) as pool:
        first = list(itertools.islice(pool.imap(square, endless()), 10))
        assert first == [x * x for x in range(10)]
        time.sleep(0.5)
        assert next(pulled) < 200, "imap read far ahead of what was consumed"


def test_resize_grows_and_shrinks_a_running_pool():
    with mp.Pool(4) as pool:
        assert pool.apply(square, (3,), ) == 9
        deadline = time.monotonic() + 60
        while pool.statistics().workers_alive < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.statistics().workers_alive == 4
        pool.resize(1)
        deadline = time.monotonic() + 60
        while pool.statistics().workers_alive > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.statistics().workers_alive == 1
        assert pool.map(square, range(10)) == [x * x for x in range(10)]
        pool.resize(3)
        pids = set(pool.map(pid_after, [0.3] * 9, chunksize=1))
        assert len(pids) >= 2  # the new workers take tasks too
        assert pool.statistics().worker_restarts == 0


def test_no_idle_worker_while_another_has_a_backlog(tmp_path):
    """The slow task runs until the quick ones are all done: one queued behind it would wait until
    the slow one gave up, and the map with it."""
    with mp.Pool(3) as pool:
        assert wait_until(lambda: pool.statistics().workers_alive == 3, 60)
        slow = pool.apply_async(pid_when_let_go, (str(tmp_path), "slow"))
        assert wait_until(lambda: (tmp_path / "slow.started").exists(), 60)
        quick = pool.map(pid_after, [0.1] * 10, chunksize=1)
        (tmp_path / "slow.go").touch()
        slow_pid, let_go = slow.get(90)
        assert let_go, "tasks waited behind the slow one"
        assert slow_pid not in quick


def test_a_worker_with_a_backlog_never_waits_on_the_master_between_chunks(tmp_path):
    """The next batch is asked for as the last chunk of this one starts, so that it arrives while
    that chunk runs.  Each task here runs until the test lets it go, and the test lets it go only
    once the master has handed the worker the task after it: two tasks in flight, the running one
    and the next (the default prefetch).  A worker that asked only once its chunk was done would
    hold one task at a time while the master waited for its request: the test would wait in vain."""
    tasks = 6

    def next_one_handed_over(i):
        stats = pool.statistics()
        return stats.tasks_done == i and stats.tasks_in_flight == 2

    with mp.Pool(1) as pool:
        result = pool.starmap_async(pid_when_let_go, [(str(tmp_path), f"task{i}") for i in range(tasks)],
                                    chunksize=1)
        for i in range(tasks):
            assert wait_until(lambda i=i: (tmp_path / f"task{i}.started").exists(), 60)
            if i + 1 < tasks:
                assert wait_until(lambda i=i: next_one_handed_over(i), 60), \
                    f"task {i + 1} was not with the worker while task {i} ran: {pool.statistics()}"
            (tmp_path / f"task{i}.go").touch()
        assert [let_go for _, let_go in result.get(60)] == [True] * tasks


def test_results_reach_callers_waiting_in_several_threads_at_once():
    # one waiting caller reads the workers' messages for all; the others must still wake
    with mp.Pool(3) as pool:
        errors = []

        def caller(offset):
            try:
                for i in range(40):
                    x = offset + i
                    assert pool.apply_async(add, (x, 1)).get(30) == x + 1
                    assert pool.map_async(square, [x, x + 1], chunksize=1).get(30) == [x * x, (x + 1) ** 2]
            except BaseException as exc:  # noqa: BLE001 -- reported below
                errors.append(exc)

        threads = [threading.Thread(target=caller, args=(1000 * k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a caller never got its result"
        assert errors == []


def test_a_callback_may_wait_for_another_result():
    with mp.Pool(2) as pool:
        inner = []
        done = threading.Event()

        def on_first(value):
            inner.append(pool.apply_async(square, (value,)).get(30))
            done.set()

        first = pool.apply_async(add, (2, 3), callback=on_first)
        assert first.get(30) == 5
        assert done.wait(30) and inner == [25]
        # a callback run on the thread of a caller that is reading for its own result
        seen = []
        slow = pool.apply_async(pid_after, (0.3,))
        pool.apply_async(add, (1, 1), callback=lambda v: seen.append(pool.apply_async(add, (v, v)).get(30)))
        slow.get(30)
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == [4]


def test_a_callback_run_by_the_background_reader_may_wait_for_a_result_no_caller_reads():
    """The callback runs on the pool's background thread (no caller was reading
    when its result came) and waits for a result that arrives after the caller
    that read meanwhile has gone: the background thread is the only reader
    left, so it must read while it waits.  Three workers: the caller's task
    does not queue behind the callback's on one worker."""
    with mp.Pool(3) as pool:
        in_callback, caller_reading, seen = threading.Event(), threading.Event(), []

        def on_result(value):
            inner = pool.apply_async(pid_after, (0.8,))
            in_callback.set()
            caller_reading.wait(10)
            seen.append(inner.get(10))

        pool.apply_async(add, (1, 1), callback=on_result)
        assert in_callback.wait(30)  # on the background thread: this one is not reading
        slow = pool.apply_async(pid_after, (0.2,))
        threading.Timer(0.05, caller_reading.set).start()
        slow.get(30)  # this thread reads until here, before the callback's result comes
        deadline = time.monotonic() + 15
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(seen) == 1 and isinstance(seen[0], int)


def big_result(i):
    return bytes([i]) * (3 << 20)


def test_results_larger_than_a_read_are_whole():
    with mp.Pool(2) as pool:
        results = pool.map(big_result, range(6), chunksize=1)
        assert [len(r) for r in results] == [3 << 20] * 6
        assert all(r == bytes([i]) * (3 << 20) for i, r in enumerate(results))


def test_get_with_a_timeout_gives_up_then_still_gets_the_result(tmp_path):
    with mp.Pool(1) as pool:
        r = pool.apply_async(pid_when_let_go, (str(tmp_path), "task"))
        with pytest.raises(TimeoutError):
            r.get(0.1)  # the task runs until let go: only the timeout can end this wait
        assert not r.ready()
        (tmp_path / "task.go").touch()
        pid, let_go = r.get(30)
        assert isinstance(pid, int) and let_go and r.ready() and r.successful()


def test_maxtasksperchild_replaces_workers():
    with mp.Pool(1, maxtasksperchild=2) as pool:
        pids = [pool.apply(pid_after, (0,)) for _ in range(6)]
        assert len(set(pids)) == 3
        assert pool.statistics().worker_restarts == 0


def test_terminate_fails_pending_results_and_leaves_nothing_behind():
    before = {t.name for t in threading.enumerate()}
    pool = mp.Pool(2)
    r = pool.map_async(pid_after, [5] * 4, chunksize=1)
    time.sleep(0.5)
    pool.terminate()
    with pytest.raises(mp.PoolTerminated):
        r.get(10)
    assert [p for p in mp.active_children() if p.name.startswith("PoolWorker")] == []
    time.sleep(0.2)
    leftover = {t.name for t in threading.enumerate()} - before
    assert not any(name.startswith("fiberrl-pool") for name in leftover), leftover


def test_dropped_pool_takes_its_workers_with_it():
    import gc
    pool = mp.Pool(2)
    assert pool.map(square, range(4)) == [0, 1, 4, 9]
    del pool
    gc.collect()
    deadline = time.monotonic() + 30
    while [p for p in mp.active_children() if p.name.startswith("PoolWorker")] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in mp.active_children() if p.name.startswith("PoolWorker")] == []


LOW_OPEN_FILES = textwrap.dedent("""
    import resource
    import fiberrl.runtime as mp

    def square(x):
        return x * x

    if __name__ == "__main__":
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        with mp.Pool(2) as pool:
            assert pool.map(square, range(10)) == [x * x for x in range(10)]
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
""")


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux's /proc to count a process's files")
def test_the_master_holds_one_stream_a_worker():
    """A worker speaks to its pool over its job's link to the master (which carries the pool's
    messages too), not over a stream of its own: a local stream holds two of the master's files
    (its socket, the pipe its frames come through), so a worker held four or more with two streams."""
    with mp.Pool(2) as pool:
        pool.map(abs, range(4))
        assert wait_until(lambda: pool.statistics().workers_alive == 2, 60)
        small = open_files()
    with mp.Pool(10) as pool:
        pool.map(abs, range(40))
        assert wait_until(lambda: pool.statistics().workers_alive == 10, 60)
        large = open_files()
    assert (large - small) / 8 <= 2.5, (small, large)


def test_a_master_blocked_on_a_long_map_sleeps():
    """The caller reads its workers' streams itself; the background thread that reads when no caller
    does looked every millisecond whether the caller had left: ~20 ms of CPU a second for a master
    that only waits. It now sleeps until the caller leaves."""
    with mp.Pool(2) as pool:
        pool.map(abs, range(4))
        cpu, began = time.process_time(), time.monotonic()
        pool.map(pid_after, [3.0, 3.0])
        per_second = (time.process_time() - cpu) / (time.monotonic() - began)
    assert per_second < 0.004, f"{per_second * 1e3:.1f} ms of CPU a second"


def test_a_pool_lifts_a_low_soft_limit_on_open_files(tmp_path, script_env):
    """A master holds ~2 fds per local worker: a soft limit of 1024 would stop a pool at a few hundred."""
    script = tmp_path / "low_open_files.py"
    script.write_text(LOW_OPEN_FILES)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=script_env)
    assert out.returncode == 0, out.stderr
    soft, hard = map(int, out.stdout.split())
    assert soft == (1 << 16 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16)) > 256


def wait_for_all(barrier):
    barrier.wait(timeout=60)
    return os.getpid()


def test_no_task_waits_behind_a_blocked_one_while_a_worker_is_free():
    """Nine tasks that each wait until all nine have started (long-lived tasks that
    talk to each other) on nine workers: no worker may hold a second task behind
    its blocked first one while another worker has none, as multiprocessing's Pool
    never does."""
    from fiberrl.runtime.primitives.synchronize import shutdown_manager
    barrier = mp.Barrier(9)
    try:
        with mp.Pool(9) as pool:
            pids = pool.map(wait_for_all, [barrier] * 9, chunksize=1)
            assert pool.statistics().tasks_done == 9
    finally:
        shutdown_manager()  # the barrier's: the suite checks each test leaves no process
    assert len(set(pids)) == 9


def numbers_then_error(total, when):
    for i in range(total):
        if i == when:
            raise LookupError(f"the input broke at {i}")
        yield i


def test_an_imap_inputs_own_error_takes_the_place_of_the_chunk_it_broke_off():
    """As multiprocessing: results of the chunks read whole, then the input's own
    exception where the chunk it interrupted would be; what that chunk had read is not run."""
    with mp.Pool(2) as pool:
        it = pool.imap(square, numbers_then_error(20, 7), chunksize=2)
        assert [next(it) for _ in range(6)] == [x * x for x in range(6)]
        with pytest.raises(LookupError, match="the input broke at 7"):
            next(it)
        with pytest.raises(StopIteration):
            next(it)
        it = pool.imap(square, numbers_then_error(20, 7), chunksize=4)
        assert [next(it) for _ in range(4)] == [x * x for x in range(4)]
        with pytest.raises(LookupError):
            next(it)
        seen = []
        with pytest.raises(LookupError):
            for value in pool.imap_unordered(square, numbers_then_error(20, 5), chunksize=4):
                seen.append(value)
        assert 16 not in seen and set(seen) <= {0, 1, 4, 9}


class RefusesPickling:
    def __reduce__(self):
        raise RuntimeError("this object will not be pickled")


def test_an_unpicklable_argument_raises_the_picklers_own_exception_naming_the_task():
    with mp.Pool(2) as pool:
        with pytest.raises(RuntimeError, match="will not be pickled") as info:
            pool.map(square, [1, RefusesPickling(), 3], chunksize=1)
        assert "task 1 of map(square): its arguments cannot be pickled" in info.value.__notes__
        with pytest.raises(RuntimeError, match="will not be pickled"):
            pool.apply(square, (RefusesPickling(),))
        assert pool.map(square, range(3)) == [0, 1, 4]


def test_a_pool_dropped_while_running_warns_as_multiprocessing_does():
    import gc
    import multiprocessing.pool
    import warnings
    pool = mp.Pool(1)
    assert pool._state == multiprocessing.pool.RUN  # what code written for multiprocessing reads
    with pytest.warns(ResourceWarning, match="unclosed running multiprocessing pool"):
        del pool
        gc.collect()
    for end in ("close", "terminate"):
        pool = mp.Pool(1)
        getattr(pool, end)()
        pool.join()
        assert pool._state == getattr(multiprocessing.pool, end.upper())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del pool
            gc.collect()
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


class Tasks:
    @classmethod
    def explode(cls):
        raise RuntimeError(123)  # this line is in the remote traceback


def test_the_remote_traceback_shows_the_source_line_of_a_classmethod_task():
    import multiprocessing.pool
    with mp.Pool(1) as pool:
        with pytest.raises(RuntimeError) as info:
            pool.apply(Tasks.explode)
    assert info.value.args == (123,)
    cause = info.value.__cause__
    assert type(cause) is multiprocessing.pool.RemoteTraceback
    assert "raise RuntimeError(123)  # this line is in the remote traceback" in cause.tb


def test_wait_and_get_return_only_once_the_callback_has_run():
    """As multiprocessing: what a callback did (append the result somewhere) is
    done when wait() or get() returns, even where another thread ran it."""
    with mp.Pool(1) as pool:
        for func, arg, kind in ((square, 3, "callback"), (fail_on, 3, "error_callback")):
            started, seen = threading.Event(), []

            def slow(value, started=started, seen=seen):
                started.set()
                time.sleep(0.5)
                seen.append(value)

            result = pool.map_async(func, [arg], **{kind: slow})
            assert started.wait(60)  # run by the background reader: this thread reads nothing
            result.wait(60)
            assert len(seen) == 1


def niceness(_):
    from fiberrl.runtime.processes import lifeline
    return os.nice(0), round(sys.getswitchinterval(), 6), lifeline._slow_interval  # held in microseconds


def test_local_workers_that_outnumber_the_cores_run_lower_take_longer_gil_turns_and_beat_less_often():
    """So that the master, the run's servers and new connections get the CPU at once
    (1024 ES workers on 2 cores at the same priority starved the parameter server), a
    worker's waiting threads do not wake hundreds of times a second each, and 1024 workers
    do not check their parent 1024 times a second."""
    from fiberrl.runtime.pool.lifecycle import OVERSUBSCRIBED_NICE
    from fiberrl.runtime.pool.worker import OVERSUBSCRIBED_HEARTBEAT, OVERSUBSCRIBED_SWITCH_INTERVAL
    mine = os.nice(0)
    with mp.Pool(1) as pool:
        assert pool.map(niceness, [0]) == [(mine, round(sys.getswitchinterval(), 6), None)]
    crowd = mp.cpu_count() + 1
    with mp.Pool(crowd) as pool:
        assert set(pool.map(niceness, range(4 * crowd), chunksize=1)) == {
            (min(19, mine + OVERSUBSCRIBED_NICE), OVERSUBSCRIBED_SWITCH_INTERVAL, OVERSUBSCRIBED_HEARTBEAT)}


def busy_span(cpu_seconds):
    """Spin for ``cpu_seconds`` of this thread's CPU time; when it ran, on the host's monotonic clock."""
    start = time.monotonic()
    until = time.thread_time() + cpu_seconds
    while time.thread_time() < until:
        pass
    return start, time.monotonic()


def sleep_span(seconds):
    start = time.monotonic()
    time.sleep(seconds)
    return start, time.monotonic()


def most_at_once(spans) -> int:
    events = sorted([(end, -1) for _, end in spans] + [(start, 1) for start, _ in spans])
    return max(itertools.accumulate(step for _, step in events))


def test_a_crowded_local_pool_runs_cpu_bound_tasks_on_two_workers_a_core_and_others_on_all():
    """1024 CPU-bound tasks at once on 2 cores take 1.3x as long as the same work 16 at a time:
    once the pool has seen a function is CPU-bound it runs on two workers a core; sleeping ones on all."""
    from fiberrl.runtime.pool.cpu_gate import usable_cores
    cores = usable_cores()
    crowd = 8 * cores
    with mp.Pool(crowd) as pool:
        pool.map(sleep_span, [0.01] * crowd, chunksize=1)  # every worker up
        pool.map(busy_span, [0.02] * 4 * crowd, chunksize=1)  # the pool learns it is CPU-bound
        assert most_at_once(pool.map(busy_span, [0.02] * 4 * crowd, chunksize=1)) <= 2 * cores
        pool.map(sleep_span, [0.01] * crowd, chunksize=1)
        assert most_at_once(pool.map(sleep_span, [0.5] * crowd, chunksize=1)) == crowd


def test_a_pool_configured_as_multiprocessing_runs_cpu_bound_tasks_on_every_worker():
    from fiberrl.runtime.pool.cpu_gate import usable_cores
    crowd = 8 * usable_cores()
    mp.configure(local_cpu_bound_per_core=0)
    try:
        with mp.Pool(crowd) as pool:
            pool.map(sleep_span, [0.01] * crowd, chunksize=1)
            pool.map(busy_span, [0.02] * 4 * crowd, chunksize=1)
            assert most_at_once(pool.map(busy_span, [0.1] * crowd, chunksize=1)) > crowd // 2
    finally:
        mp.configure(local_cpu_bound_per_core=2.0)


def busy_or_meet(barrier):
    if barrier is None:
        return busy_span(0.02)
    barrier.wait(timeout=60)
    return os.getpid()


def test_tasks_that_wait_for_each_other_are_let_through_a_gate_that_held_them_back():
    """A function that looked CPU-bound, then waits at a barrier for all its tasks: the gate
    holding most of them back would stall it for ever, so after a while it lets them through."""
    from fiberrl.runtime.pool.cpu_gate import usable_cores
    from fiberrl.runtime.primitives.synchronize import shutdown_manager
    crowd = 8 * usable_cores()
    barrier = mp.Barrier(crowd)
    try:
        with mp.Pool(crowd) as pool:
            pool.map(busy_or_meet, [None] * 4 * crowd, chunksize=1)
            start = time.monotonic()
            assert len(set(pool.map(busy_or_meet, [barrier] * crowd, chunksize=1))) == crowd
            assert time.monotonic() - start < 30
    finally:
        shutdown_manager()  # the barrier's: the suite checks each test leaves no process


def slow_in_the_first_worker(x, marker: str, folder: str):
    """Slow (3 s) in the worker that ran a task first, fast (0.1 s) elsewhere; leaves a file per run."""
    try:
        with open(marker, "x") as fh:
            fh.write(str(os.getpid()))
    except FileExistsError:
        pass
    with open(marker) as fh:
        slow = fh.read() == str(os.getpid())
    time.sleep(3.0 if slow else 0.1)
    open(os.path.join(folder, f"{x}.{os.getpid()}"), "w").close()
    return x * x


@pytest.mark.parametrize("backups", [False, True])
def test_backup_tasks_keep_a_slow_worker_from_setting_the_pace_of_a_map(tmp_path, backups):
    """With backup_tasks, the task a slow worker runs at a map's end runs again on an idle worker and
    the first result is kept: each result is delivered once, the map ends at the fast workers' pace."""
    marker = str(tmp_path / "slow")
    with mp.Pool(3, backup_tasks=backups) as pool:
        pool.map(square, range(6))  # every worker up
        started = time.monotonic()
        result = pool.starmap(slow_in_the_first_worker, [(x, marker, str(tmp_path)) for x in range(6)], chunksize=1)
        took = time.monotonic() - started
        stats = pool.statistics()
    assert result == [x * x for x in range(6)]
    if backups:
        assert took < 2.5, f"the map took {took:.1f} s"
        assert stats.tasks_backed_up >= 1 and stats.backups_first >= 1
    else:
        assert took >= 3
        assert stats.tasks_backed_up == 0
    runs = [name.split(".")[0] for name in os.listdir(tmp_path) if name != "slow"]
    assert sorted(set(runs)) == sorted(str(x) for x in range(6))
