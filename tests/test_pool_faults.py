"""Pool worker loss: nothing lost, nothing repeated, crash loops bounded."""
import os
import random
import signal
import sys
import threading
import time

import pytest

import fiberrl.runtime as mp

pytestmark = pytest.mark.slow  # the tests here start processes


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


def nap(x):
    time.sleep(0.005)
    return x


def live_descendants() -> dict[int, tuple[int, str]]:
    """This process's live descendants (any thread's children): their parent and command line."""
    parents, commands = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                commands[int(entry)] = f.read().decode(errors="replace")
        except OSError:
            continue
        if state not in "ZX":
            parents[int(entry)] = int(ppid)
    found, todo = {}, [os.getpid()]
    while todo:
        parent = todo.pop()
        for pid in [pid for pid, ppid in parents.items() if ppid == parent]:
            found[pid] = (parent, commands.get(pid, ""))
            todo.append(pid)
    return found


def map_under_storm(pick_victims, tries: int, tasks: int = 3000):
    """``tries`` times: Pool(4) maps ``tasks`` tasks of 5 ms (chunksize 1) while a thread
    SIGKILLs what ``pick_victims`` picks among the live descendants every 0.25 s: the pool's,
    and the fork server, not what earlier tests left running (a manager they share)."""
    for attempt in range(tries):
        stop, kills = threading.Event(), []
        others = {pid for pid, (_, command) in live_descendants().items() if "fork_server" not in command}

        def storm(stop=stop, kills=kills, others=others):
            while not stop.wait(0.25):
                found = {pid: seen for pid, seen in live_descendants().items() if pid not in others}
                for pid in pick_victims(found):
                    try:
                        os.kill(pid, signal.SIGKILL)
                        kills.append(pid)
                    except ProcessLookupError:
                        pass

        with mp.Pool(4) as pool:
            # the workers have loaded the function once: the storm is on a map under way (before that,
            # loaders killed before any has loaded it count against the function)
            pool.map(nap, range(8), chunksize=1)
            killer = threading.Thread(target=storm)
            killer.start()
            try:
                assert pool.map(nap, range(tasks), chunksize=1) == list(range(tasks)), f"try {attempt}"
            finally:
                stop.set()
                killer.join()
            stats = pool.statistics()
        print(f"try {attempt}: {len(kills)} processes killed, {stats.worker_restarts} worker restarts, "
              f"{stats.tasks_resubmitted} tasks resubmitted")
        assert stats.tasks_failed == 0 and stats.tasks_done == 8 + tasks


@pytest.mark.skipif(sys.platform != "linux", reason="finds descendants through /proc")
@pytest.mark.usefixtures("fork_server_deaths_forgotten")
def test_a_map_survives_a_random_descendant_killed_every_250ms():
    """Any process under the parent: pool workers, the fork server (whose jobs die with it),
    the resource tracker.  A task is charged only for a death while it ran, so none fails."""
    rng = random.Random(0)
    map_under_storm(lambda found: [rng.choice(list(found))] if found else [], tries=4)


@pytest.mark.skipif(sys.platform != "linux", reason="finds descendants through /proc")
@pytest.mark.usefixtures("fork_server_deaths_forgotten")
def test_workers_killed_with_their_fork_server_every_250ms_cost_no_task_and_no_pool():
    """Every worker dies at each kill, often just after starting: neither the tasks they ran
    nor the deaths before asking for work count against the pool (this failed every map
    with WorkerLostError or 'keep dying before taking any task').  Where the workers could not
    finish a task between kills the map went on for 300 s; the server rests after five deaths."""
    def fork_servers(found):
        return [pid for pid, (parent, command) in found.items() if "fork_server" in command and parent == os.getpid()]
    # a map goes on only between kills, as the server and its workers start again: fewer tasks
    map_under_storm(fork_servers, tries=1, tasks=500)


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


def die():
    os.kill(os.getpid(), signal.SIGKILL)


class KillsWhoeverLoadsIt:
    """A task function whose unpickling kills the worker (as an import that crashes would)."""

    def __reduce__(self):
        return die, ()

    def __call__(self, x):
        return x


def test_a_function_that_kills_every_worker_loading_it_fails_its_tasks_after_three_per_worker():
    with mp.Pool(2) as pool:
        with pytest.raises(mp.WorkerLostError, match=r"task \d of map\(\S+\) needs a function that 6 workers "
                                                     r"died loading, and none has loaded"):
            pool.map(KillsWhoeverLoadsIt(), range(4), chunksize=1)
        # chunks then on their way to a worker fail when it dies loading the function too: no more tries
        deadline = time.monotonic() + 30
        while pool.statistics().tasks_failed < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = pool.statistics()
        assert stats.tasks_failed == 4 and stats.tasks_pending == 0 and 6 <= stats.worker_restarts <= 8, stats
        assert pool.map(slow_square, [1, 2]) == [1, 4]


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


def test_a_callback_that_blocks_the_pools_reader_past_heartbeat_timeout_loses_no_worker():
    """A worker's link to its master carries its pool, so the pool's reader answers the worker's
    pings: a callback that holds the thread reading (here the background reader: no caller waits)
    longer than ``heartbeat_timeout`` must not leave those pings unanswered, or every worker would
    take its master for hung and exit.  Another thread reads meanwhile."""
    mp.configure(heartbeat_timeout=2)
    with mp.Pool(2) as pool:
        assert pool.map(slow_square, range(4)) == [0, 1, 4, 9]
        blocked = threading.Event()
        pool.apply_async(abs, (-1,), callback=lambda _: (blocked.set(), time.sleep(5)))
        assert blocked.wait(30)
        time.sleep(5)  # nobody calls get(): only the background reader reads, and it is held
        assert pool.map(slow_square, range(6)) == [x * x for x in range(6)]
        stats = pool.statistics()
    assert stats.worker_restarts == 0 and stats.workers_cut_off == 0, stats
