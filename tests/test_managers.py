"""Managers: shared objects in a job-backed server process, used through proxies."""
import gc
import os
import re
import signal
import socket
import struct
import threading
import time

import gymnasium as gym
import pytest
from test_security import Evil, listening_sockets

import fiberrl.runtime as mp
from fiberrl.runtime.managers import AsyncManager, BaseManager, ManagerError, SyncManager
from fiberrl.runtime.net import auth, dial, stream, wire

pytestmark = pytest.mark.slow  # the tests here start processes


def add_one(shared, lock):
    with lock:
        shared["count"] = shared.get("count", 0) + 1
        shared["names"] = shared.get("names", []) + [mp.current_process().name]


def use_every_type(d, lst, ns, value, array, q, event):
    d["child"] = os.getpid()
    lst.extend([1, 2])
    lst += [3]
    ns.answer = ns.question * 2
    value.value += 1
    array[0] = 42
    q.put("from child")
    event.wait(30)
    q.put("event seen")


def test_sync_types_are_shared_across_processes():
    with mp.Manager() as manager:
        d, lst, ns = manager.dict(), manager.list(), manager.Namespace(question=21)
        value, array = manager.Value("i", 1), manager.Array("d", [0.0, 1.0])
        q, event, lock = manager.Queue(), manager.Event(), manager.Lock()
        child = mp.Process(target=use_every_type, args=(d, lst, ns, value, array, q, event))
        child.start()
        assert q.get(timeout=30) == "from child"
        event.set()
        assert q.get(timeout=30) == "event seen"
        child.join(30)
        assert child.exitcode == 0
        assert d["child"] == child.pid and dict(d.items()) == d.copy() == {"child": child.pid}
        assert list(lst) == [1, 2, 3] and len(lst) == 3 and 2 in lst
        assert ns.answer == 42 and ns.question == 21
        assert value.value == 2 and array[0] == 42 and len(array) == 2

        workers = [mp.Process(target=add_one, args=(d, lock)) for _ in range(3)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        assert d["count"] == 3 and sorted(d["names"]) == sorted(w.name for w in workers)
        assert str(d).startswith("{") and "DictProxy" in repr(d)


def test_remote_exception_round_trips_with_traceback():
    with SyncManager() as manager:
        d = manager.dict()
        with pytest.raises(KeyError, match="missing") as info:
            d["missing"]
        assert "Traceback" in str(info.value.__cause__)
        lst = manager.list([1])
        with pytest.raises(IndexError):
            lst[5]
        d["still"] = "works"
        assert d["still"] == "works"


class Counter:
    def __init__(self, start=0):
        self.n = start

    def add(self, k=1):
        self.n += k
        return self.n

    def child(self):
        return Counter(self.n * 10)

    def _private(self):
        return "hidden"

    def fail(self):
        raise ValueError(f"counter at {self.n} refuses")


class CounterManager(BaseManager):
    pass


CounterManager.register("Counter", Counter, method_to_typeid={"child": "Counter"})
CounterManager.register("Restricted", Counter, exposed=("add",))


def add_in_child(counter, k):
    counter.add(k)


def test_registered_class_with_method_to_typeid_and_exposed():
    with CounterManager() as manager:
        counter = manager.Counter(5)
        assert counter.add() == 6 and counter.add(4) == 10
        child = counter.child()  # a proxy, not a copy
        assert child.add() == 101 and child.add() == 102
        assert not hasattr(counter, "_private")
        restricted = manager.Restricted()
        assert restricted.add(2) == 2
        assert not hasattr(restricted, "fail")
        with pytest.raises(AttributeError, match="not exposed"):
            restricted._callmethod("fail")
        with pytest.raises(ValueError, match="counter at 10 refuses"):
            counter.fail()
        p = mp.Process(target=add_in_child, args=(counter, 7))
        p.start()
        p.join(30)
        assert p.exitcode == 0 and counter.add(0) == 17


def test_objects_are_freed_with_their_last_proxy_and_survive_transit():
    with SyncManager() as manager:
        base = manager._number_of_objects()
        d = manager.dict(a=1)
        assert manager._number_of_objects() == base + 1
        out = mp.Queue()
        out.put(d)  # the copy in the queue holds its own reference
        del d
        gc.collect()
        received = out.get(timeout=10)
        assert received["a"] == 1
        del received
        gc.collect()
        assert manager._number_of_objects() == base


def lock_and_report(lock, events):
    with lock:
        events.put(("in", time.monotonic()))
        time.sleep(0.3)
        events.put(("out", time.monotonic()))


def test_blocking_calls_only_hold_up_their_caller():
    with SyncManager() as manager:
        lock, events = manager.Lock(), manager.Queue()
        procs = [mp.Process(target=lock_and_report, args=(lock, events)) for _ in range(2)]
        for p in procs:
            p.start()
        seen = [events.get(timeout=30) for _ in range(4)]
        for p in procs:
            p.join(30)
        assert [s[0] for s in seen] == ["in", "out", "in", "out"]  # mutual exclusion held
        # one process, two threads: a thread blocked in get() does not stop another's put()
        q = manager.Queue()
        got = []
        reader = threading.Thread(target=lambda: got.append(q.get(timeout=30)))
        reader.start()
        time.sleep(0.2)
        q.put("hello")
        reader.join(30)
        assert got == ["hello"]


class Sleeper:
    def echo(self, value, delay=0.0):
        time.sleep(delay)
        return value

    def crash(self):
        raise RuntimeError("remote boom")

    def pid(self):
        return os.getpid()


class SleeperManager(AsyncManager):
    pass


SleeperManager.register("Sleeper", Sleeper)


def test_async_handles_can_be_collected_in_any_order():
    with SleeperManager() as manager:
        a, b = manager.Sleeper(), manager.Sleeper()
        handles = [a.echo(i) if i % 2 else b.echo(i) for i in range(50)]
        for i in reversed(range(50)):
            assert handles[i].get(timeout=30) == i
        slow = a.echo("slow", 0.5)
        assert not slow.ready()
        with pytest.raises(TimeoutError):
            slow.get(timeout=0.05)
        assert slow.get(timeout=30) == "slow" and slow.ready()
        error = b.crash()
        ok = b.echo("after the error")
        assert ok.get() == "after the error"
        with pytest.raises(RuntimeError, match="remote boom") as info:
            error.get()
        assert "Traceback" in str(info.value.__cause__)

        results = {}

        def use_from_thread(k):
            results[k] = [h.get() for h in [a.echo((k, j)) for j in range(20)]]
        threads = [threading.Thread(target=use_from_thread, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == {k: [(k, j) for j in range(20)] for k in range(4)}


def test_handles_of_one_stream_collected_by_several_threads_at_once():
    """One thread reads the stream while the others wait for it to file their replies."""
    with SleeperManager() as manager:
        sleeper = manager.Sleeper()
        handles = [sleeper.echo(i, 0.002 * (i % 3)) for i in range(200)]
        results = {}

        def collect(k):
            results[k] = [handles[i].get(timeout=30) for i in range(199 - k, -1, -4)]
        threads = [threading.Thread(target=collect, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results == {k: list(range(199 - k, -1, -4)) for k in range(4)}


def test_a_forked_child_uses_streams_of_its_own():
    with SleeperManager() as manager:
        sleeper = manager.Sleeper()
        pending = sleeper.echo("parent's", 0.3)  # its reply is due on the stream open at the fork
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = 0 if sleeper.echo("child's").get(timeout=10) == "child's" else 1
            finally:
                os._exit(code)
        assert pending.get(timeout=10) == "parent's"
        assert os.waitpid(pid, 0)[1] == 0


def test_killed_async_manager_fails_pending_calls_promptly_and_restarts():
    manager = SleeperManager()
    manager.start()
    try:
        sleeper = manager.Sleeper()
        pending = sleeper.echo("never", 30)
        time.sleep(0.2)
        os.kill(manager.pid, signal.SIGKILL)
        with pytest.raises(ManagerError, match="is gone"):
            pending.get(timeout=20)  # the server's death ends the wait: its timeout would raise TimeoutError
        with pytest.raises(ManagerError):
            sleeper.echo("later").get(timeout=20)
        old_pid = manager.pid
        manager.restart()
        fresh = manager.Sleeper()
        assert fresh.echo("again").get(timeout=30) == "again"
        assert fresh.pid().get() == manager.pid != old_pid
    finally:
        manager.shutdown()
    assert not manager.is_alive()


class CartPoleSyncManager(SyncManager):
    pass


class CartPoleAsyncManager(AsyncManager):
    pass


class SlowCartPole(gym.Wrapper):
    """CartPole whose step also waits 20 ms, as an env that costs time outside the caller (a physics engine,
    a game) does: what the async example gains is overlap.  Each step says in its info when it began and
    ended (the host's monotonic clock, the same in every process), so that the test sees overlap itself."""

    def step(self, action):
        began = time.monotonic()
        time.sleep(0.02)
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "span": (began, time.monotonic())}


def make_cart_pole():
    return SlowCartPole(gym.make("CartPole-v1"))


CartPoleSyncManager.register("CartPoleEnv", make_cart_pole)
CartPoleAsyncManager.register("CartPoleEnv", make_cart_pole)


def run_seed_example(manager_class, steps: int) -> tuple[list, list]:
    """The seed's async_manager example, on gymnasium's API: when each step ran in its server
    ((began, ended) of every step) and the observations it saw."""
    managers = [manager_class() for _ in range(4)]
    for m in managers:
        m.start()
    try:
        envs = [m.CartPoleEnv() for m in managers]
        is_async = manager_class is CartPoleAsyncManager
        seen, spans = [], []
        for i, env in enumerate(envs):
            h = env.reset(seed=i)
            seen.append((h.get() if is_async else h)[0].tolist())
        for i in range(steps):
            actions = [i % 2] * len(envs)
            if is_async:
                results = [h.get() for h in [env.step(a) for env, a in zip(envs, actions, strict=True)]]
            else:
                results = [env.step(a) for env, a in zip(envs, actions, strict=True)]
            for env, (obs, _reward, terminated, truncated, info) in zip(envs, results, strict=True):
                seen.append(obs.tolist())
                spans.append(info["span"])
                if terminated or truncated:
                    h = env.reset()
                    seen.append((h.get() if is_async else h)[0].tolist())
        return spans, seen
    finally:
        for m in managers:
            m.shutdown()


def most_at_once(spans) -> int:
    """The most of these (began, ended) intervals that were under way at one moment."""
    edges = sorted([(began, 1) for began, _ in spans] + [(ended, -1) for _, ended in spans])  # an end first on a tie
    running = most = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return most


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is a Linux scheduling policy")
def test_async_servers_run_batch_scheduled_unless_their_class_says_not():
    class LatencyCritical(AsyncManager):
        batch_scheduling = False

    LatencyCritical.register("Sleeper", Sleeper)
    managers = [SleeperManager(), LatencyCritical(), SyncManager()]
    for manager in managers:
        manager.start()
    try:
        policies = [os.sched_getscheduler(manager.pid) for manager in managers]
    finally:
        for manager in managers:
            manager.shutdown()
    assert policies == [os.SCHED_BATCH, os.SCHED_OTHER, os.SCHED_OTHER]


def test_seed_cartpole_example_steps_its_four_servers_at_once_with_async_managers():
    sync_spans, sync_seen = run_seed_example(CartPoleSyncManager, 40)
    async_spans, async_seen = run_seed_example(CartPoleAsyncManager, 40)
    assert async_seen == sync_seen
    # a sync call returns when its step is done: no two steps of the four servers ever overlap; async calls
    # all go out before the first reply is awaited: at some moment all four servers are stepping at once
    assert most_at_once(sync_spans) == 1
    assert most_at_once(async_spans) == 4


def test_manager_that_cannot_start_says_why():
    def broken_initializer():
        raise RuntimeError("no such environment")
    manager = SleeperManager()
    with pytest.raises(ManagerError, match="exited with code 1"):
        manager.start(initializer=broken_initializer)


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="leave address and authkey unset"):
        SyncManager(address=("127.0.0.1", 5000), authkey=b"x")
    with pytest.raises(TypeError, match="proxytype must be a BaseProxy"):
        CounterManager.register("Bad", Counter, proxytype=dict)
    with SleeperManager() as manager:
        with pytest.raises(KeyError, match="no typeid 'Nope'"):
            manager._create("Nope", (), {})


def test_manager_streams_refuse_clients_without_the_secret(tmp_path):
    marker = tmp_path / "pwned"
    payload = bytes(wire.join(wire.dumps(Evil(marker))))
    with SyncManager() as manager:
        d = manager.dict()
        ports = listening_sockets(manager.pid)
        assert ports and all(ip == "127.0.0.1" for ip, _ in ports), ports
        frame = struct.pack("<Q", len(payload) + 25) + struct.pack("<BQQq", 2, 1, 1, 1) + payload
        attempts = (frame, struct.pack("<Q", 32) + os.urandom(32) + struct.pack("<Q", 32) + os.urandom(32) + frame,
                    payload)
        for _, port in ports:
            for attempt in attempts:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.sendall(attempt)
                    time.sleep(0.05)
        if stream.LOCAL_SOCKETS:  # the same listener's Unix socket, for processes on this host
            for attempt in attempts:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(5)
                    s.connect(auth.local_name(manager.address.partition("/")[0]))
                    s.sendall(attempt)
                    time.sleep(0.05)
        real = auth.run_secret()
        auth._secret = os.urandom(32)
        try:
            with pytest.raises(PermissionError):
                dial.connect(manager.address)
        finally:
            auth._secret = real
        d["fine"] = True
        assert d["fine"] and not marker.exists()


def test_connections_are_per_server_not_per_port():
    # a new server can be given a dead one's port; its calls must not go down the dead one's
    # stale connection, nor may releases of the dead one's objects reach the new one
    from fiberrl.runtime.managers.client import connection

    with mp.Manager() as m:
        d = m.dict()
        d["x"] = 1
        ours = connection(m.address, m._ref.name)
        assert connection(m.address, m._ref.name) is ours
        assert connection(m.address, "SyncManager-0 (pid 1)") is not ours


def cube(x):
    return x ** 3


def test_a_managers_pool_serves_results_through_proxies():
    """multiprocessing's SyncManager.Pool: the pool lives in the manager, its
    async results and iterators come back as proxies."""
    with SyncManager() as manager:
        with manager.Pool(2) as pool:
            assert pool.map(cube, range(4)) == [0, 1, 8, 27]
            assert pool.apply(cube, (3,)) == 27
            result = pool.map_async(cube, range(3))
            assert result.get(30) == [0, 1, 8] and result.ready() and result.successful()
            assert list(pool.imap(cube, range(3))) == [0, 1, 8]
            assert sorted(pool.imap_unordered(cube, range(3))) == [0, 1, 8]


def test_an_error_creating_an_object_is_multiprocessings_remote_error_and_its_own_type():
    """multiprocessing raises RemoteError when the server fails to create an
    object; the error is of its own type too, for code that catches that."""
    import pickle
    from multiprocessing.managers import RemoteError
    with SyncManager() as manager:
        for processes in (0, -1):
            with pytest.raises(RemoteError, match="Number of processes must be at least 1") as info:
                manager.Pool(processes)
            assert isinstance(info.value, ValueError)
            assert "Number of processes" in str(info.value.__cause__)  # the server's traceback
        copy = pickle.loads(pickle.dumps(info.value))
        assert type(copy) is ValueError and copy.args == info.value.args
        with pytest.raises(RemoteError):
            manager._create("Nope", (), {})


def test_proxies_the_manager_itself_holds_are_released():
    """A proxy that lives in the manager's process (a pool's callback, a proxy
    stored in a shared dict) releases its object when it goes, though that
    process never makes a call of its own."""
    with SyncManager() as manager:
        shared = manager.dict()
        shared["inner"] = manager.list([1, 2])
        gc.collect()
        assert manager._number_of_objects() == 2
        del shared["inner"]
        assert manager._number_of_objects() == 1
        with manager.Pool(1) as pool:
            seen = manager.list()
            pool.map_async(cube, [2], callback=seen.append).wait()
            assert list(seen) == [[8]]  # the callback ran before wait() returned
            del seen
            gc.collect()
            assert manager._number_of_objects() == 2  # the dict and the pool


def test_iterating_a_shared_list_or_dict_sees_it_as_it_is_when_it_gets_there():
    """As multiprocessing's proxies: the iteration lives in the manager (a change
    ahead of it is seen, a dict that changed size is an error), taken in batches."""
    with SyncManager() as manager:
        items = manager.list(range(10))
        it = iter(items)
        assert list(it) == list(range(10)) and list(it) == []
        it = iter(items)
        items[0] = 100
        assert next(it) == 100
        shared = manager.dict({i: i for i in range(5)})
        assert list(shared) == list(range(5))
        it = iter(shared)
        shared.clear()
        with pytest.raises(RuntimeError, match="changed size during iteration"):
            next(it)
        assert sum(manager.list(range(3000))) == sum(range(3000))
        assert type(items._getvalue()) is list and type(shared._getvalue()) is dict
        del it
        gc.collect()
        assert manager._number_of_objects() == 2  # the iterations are let go


def test_a_proxys_repr_and_the_managers_debug_info_in_multiprocessings_form():
    with SyncManager() as manager:
        event = manager.Event()
        assert re.match(r"<EventProxy object, typeid 'Event' at 0x[0-9a-f]+; #1 in SyncManager", repr(event))
        assert re.fullmatch(r"  1:       refcount=1\n    <threading.Event at 0x[0-9a-f]+: unset>",
                            manager._debug_info())
