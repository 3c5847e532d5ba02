"""Pool worker loss: nothing lost, nothing repeated, crash loops bounded."""
import os
import random
import signal
import time

import pytest

import fiberrl.runtime as mp


def slow_square(x):
    time.sleep(0.001)
    return x * x


def kill_self_on(x, bad=5):
    if x == bad:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def exit_once(x, marker):
    # the first worker to run task 3 vanishes mid-task; the retry succeeds
    if x == 3:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL)
            os.close(fd)
            os._exit(7)
        except FileExistsError:
            pass
    return x


def failing_initializer():
    raise RuntimeError("cannot initialise")


def workers():
    return [p for p in mp.active_children() if p.name.startswith("PoolWorker")]


def test_10000_tasks_survive_a_worker_killed_every_200ms():
    n = 10_000
    with mp.Pool(4) as pool:
        result = pool.map_async(slow_square, range(n), chunksize=10)
        kills = 0
        rng = random.Random(0)
        while not result.ready():
            time.sleep(0.2)
            alive = [p for p in workers() if p.is_alive()]
            if alive and not result.ready():
                victim = rng.choice(alive)
                try:
                    os.kill(victim.pid, signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass
        assert result.get(10) == [x * x for x in range(n)]
        stats = pool.statistics()
        print(f"{kills} workers killed, {stats.worker_restarts} restarts, {stats.tasks_resubmitted} tasks resubmitted")
        assert kills >= 5
        assert stats.worker_restarts >= 1 and stats.tasks_done == n
        assert pool.map(slow_square, range(100)) == [x * x for x in range(100)]  # and it goes on


def test_crash_looping_task_fails_with_worker_lost_error(caplog):
    with mp.Pool(2, max_task_crashes=3) as pool:
        with pytest.raises(mp.WorkerLostError, match=r"task 5 of map\(kill_self_on\) was running each of the 3 times"):
            pool.map(kill_self_on, range(10), chunksize=1)
        stats = pool.statistics()
        assert stats.worker_restarts == 3
        assert pool.map(kill_self_on, [1, 2, 3]) == [1, 2, 3]


def test_task_killing_its_worker_once_is_rerun_and_delivered_once(tmp_path):
    marker = str(tmp_path / "died-once")
    with mp.Pool(2) as pool:
        results = list(pool.imap(lambda x: exit_once(x, marker), range(8)))
        assert results == list(range(8))
        stats = pool.statistics()
        assert stats.worker_restarts == 1 and stats.tasks_resubmitted >= 1
        assert stats.tasks_done == 8


def test_failing_initializer_gives_a_clear_error_not_a_restart_loop():
    pool = mp.Pool(2, initializer=failing_initializer)
    try:
        r = pool.map_async(slow_square, range(4))
        with pytest.raises(RuntimeError, match="keep dying before taking any task"):
            r.get(60)
        with pytest.raises(RuntimeError, match="keep dying"):
            pool.apply_async(slow_square, (1,))
    finally:
        pool.terminate()


def test_workers_that_cannot_reach_the_pool_fail_its_results_within_start_timeout():
    """Replacements that start but never get through to the master (its listener
    unreachable, as under a flood) fail the pending results with a clear error
    after start_timeout, instead of leaving map() waiting."""
    import socket

    from fiberrl.runtime import config
    mp.configure(start_timeout=3)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # takes connections into its backlog and never answers
    try:
        with mp.Pool(2) as pool:
            assert pool.map(slow_square, range(4)) == [0, 1, 4, 9]
            pool._scheduler._listener.address = "%s:%d" % silent.getsockname()
            result = pool.map_async(slow_square, range(10))
            for worker in workers():
                worker.kill()
            started = time.monotonic()
            with pytest.raises(RuntimeError, match="no pool worker has connected"):
                result.get(30)
            assert time.monotonic() - started < 3 + 4
            with pytest.raises(RuntimeError, match="no pool worker has connected"):
                pool.map(slow_square, range(2))  # and says so at once from then on
            pool.terminate()
    finally:
        silent.close()
        config.reset()
