"""One runtime conformance suite, run on every backend this machine has.

Each cluster backend has a helper module in tests/helpers/
(``docker_backend``, ``kubernetes_backend``, ``slurm_backend``) that says
whether it can run here, the settings that point the runtime at it, how a
user would kill one of its jobs, and which of its jobs are left.  A backend
that cannot run here is skipped with the reason; after a backend's tests,
none of its jobs may be left.
"""
import importlib
import json
import os
import signal
import time

import pytest

import fiberrl.runtime as mp
from conftest import clean_up_as_at_exit, wait_until
from fiberrl.app import run
from fiberrl.app_config import compose
from fiberrl.runtime import Ring, RingError
from fiberrl.runtime.connection import wait
from fiberrl.runtime.managers import AsyncManager, ManagerError
from fiberrl.runtime.pool.results import RemoteTraceback

pytestmark = pytest.mark.slow  # the tests here start processes

BACKENDS = ["local", *(pytest.param(name, marks=getattr(pytest.mark, name))
                       for name in ("docker", "kubernetes", "slurm"))]
ES_METRICS = {}  # backend -> what a short ES run logged; every backend must log the same
PPO_METRICS = {}  # the same for PPO, whose envs live on env servers (job-backed managers)


class LocalHelper:
    """The local backend's answers to what the cluster helpers provide."""

    @staticmethod
    def settings():
        return dict(backend="local")

    @staticmethod
    def kill_job(process):
        os.kill(process.pid, signal.SIGKILL)

    @staticmethod
    def leftovers():
        return []


@pytest.fixture(scope="module", params=BACKENDS)
def cluster(request):
    name = request.param
    if name == "local":
        helper = LocalHelper
    else:
        helper = importlib.import_module(f"helpers.{name}_backend")
        reason = helper.available()
        if reason:
            pytest.skip(f"{name} backend cannot run here: {reason}")
    mp.configure(**helper.settings())
    try:
        yield helper
    finally:
        mp.config.reset()
        assert not mp.active_children()
        clean_up_as_at_exit(name)
        assert wait_until(lambda: not helper.leftovers(), 60, 0.5), \
            f"{name} jobs left after its tests: {helper.leftovers()}"


# --- what the jobs run -------------------------------------------------------
def put_pid_and_exit(q, code):
    q.put(("hello", os.getpid()))
    raise SystemExit(code)


def sleep_forever():
    time.sleep(600)


def echo_over_pipe(conn):
    while True:
        message = conn.recv()
        if message is None:
            break
        conn.send(message * 2)
    conn.close()


def print_everywhere(tag):
    import subprocess
    import sys
    print(f"{tag} from print", flush=True)
    os.write(2, f"{tag} on fd 2\n".encode())
    subprocess.run([sys.executable, "-c", f"print('{tag} from a subprocess')"], check=True)
    print(f"{tag} unflushed at exit", end="")


def square(x):
    return x * x


def slow_square(x):
    time.sleep(0.05)
    return x * x


def raise_value_error(x):
    raise ValueError(f"bad input {x}")


class Counter:
    def __init__(self, start):
        self.value = start

    def add(self, n):
        self.value += n
        return self.value

    def fail(self):
        raise KeyError("no such thing")


class CounterManager(AsyncManager):
    pass


CounterManager.register("Counter", Counter)


def gloo_init(node):
    node.init_process_group(timeout=60)


def all_reduce_rank(rank, size):
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def torchrun_all_reduce(rank, size):
    """Written for torchrun: rank, world and rendezvous all from the environment."""
    import datetime

    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return {name: os.environ[name] for name in names}, t.item()


def fiber_style_init(node):
    """Fiber's examples/ring.py initializer: MASTER_ADDR/MASTER_PORT from
    members[0], the interface from get_listen_addr(), then env://."""
    import torch.distributed as dist

    from fiberrl.runtime.backends import get_backend
    master = node.members[0]
    _, _, interface = get_backend().get_listen_addr()
    os.environ["MASTER_ADDR"] = master.ip
    os.environ["MASTER_PORT"] = str(master.port)
    os.environ["GLOO_SOCKET_IFNAME"] = interface
    dist.init_process_group("gloo", rank=node.rank, world_size=node.size)


def raise_on_rank_one(rank, size):
    if rank == 1:
        raise RuntimeError("rank one refuses")
    time.sleep(30)


# --- the suite ----------------------------------------------------------------
def test_process_exit_codes_and_queue(cluster):
    q = mp.Queue()
    p = mp.Process(target=put_pid_and_exit, args=(q, 3))
    p.start()
    message, _ = q.get(timeout=120)
    assert message == "hello"
    p.join(60)
    assert p.exitcode == 3 and not p.is_alive()


def test_terminate_and_kill(cluster):
    p = mp.Process(target=sleep_forever)
    p.start()
    q = mp.Process(target=sleep_forever)
    q.start()
    assert wait([p.sentinel, q.sentinel], 0.1) == []
    p.terminate()
    assert wait([p.sentinel, q.sentinel], 60) == [p.sentinel]  # ended, wherever the job ran
    q.kill()
    p.join(60)
    q.join(60)
    assert p.exitcode is not None and p.exitcode != 0
    assert q.exitcode is not None and q.exitcode != 0


def test_what_a_job_prints_reaches_the_parents_terminal(cluster, capfd):
    p = mp.Process(target=print_everywhere, args=(f"job-{cluster.__name__}",))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    out, err = capfd.readouterr()
    tag = f"job-{cluster.__name__}"
    assert f"{tag} from print\n" in out and f"{tag} from a subprocess\n" in out and f"{tag} unflushed at exit" in out
    assert f"{tag} on fd 2\n" in err
    assert out.count(f"{tag} from print") == 1, "printed twice"


def test_pipe_round_trip(cluster):
    parent_end, child_end = mp.Pipe()
    p = mp.Process(target=echo_over_pipe, args=(child_end,))
    p.start()
    for message in (1, "ab", [3]):
        parent_end.send(message)
        assert parent_end.poll(120)
        assert parent_end.recv() == message * 2
    parent_end.send(None)
    p.join(60)
    assert p.exitcode == 0


def test_pool_map_and_remote_exception(cluster):
    with mp.Pool(2) as pool:
        assert pool.map(square, range(50)) == [x * x for x in range(50)]
        with pytest.raises(ValueError, match="bad input 7") as info:
            pool.apply(raise_value_error, (7,))
        assert isinstance(info.value.__cause__, RemoteTraceback)


def test_pool_loses_nothing_when_a_worker_job_is_killed(cluster):
    with mp.Pool(2) as pool:
        result = pool.map_async(slow_square, range(120), chunksize=1)
        assert wait_until(lambda: pool.statistics().tasks_done >= 10, 120)
        victim = next(p for p in mp.active_children() if p.name.startswith("PoolWorker"))
        cluster.kill_job(victim)
        assert result.get(240) == [x * x for x in range(120)]
        stats = pool.statistics()
        # a deleted pod and a cancelled Slurm job are told to stop first (SIGTERM): preempted, not crashed
        assert stats.worker_restarts + stats.workers_preempted >= 1
        assert stats.tasks_done == 120


def test_async_manager_calls_and_a_killed_server(cluster):
    manager = CounterManager()
    manager.start()
    try:
        counter = manager.Counter(10)
        first, second = counter.add(1), counter.add(2)
        assert second.get(60) == 13 and first.get(60) == 11
        with pytest.raises(KeyError, match="no such thing"):
            counter.fail().get(60)
        cluster.kill_job(manager._process)
        with pytest.raises(ManagerError):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                counter.add(1).get(60)
                time.sleep(0.2)
    finally:
        manager.shutdown()


def test_ring_all_reduce_and_a_failing_member(cluster):
    assert Ring(2, all_reduce_rank, gloo_init).run() == [3.0, 3.0]
    with pytest.raises(RingError, match="rank 1"):
        Ring(2, raise_on_rank_one).run()


def test_ring_members_rendezvous_through_torchruns_environment(cluster):
    results = Ring(2, torchrun_all_reduce).run()
    assert [total for _, total in results] == [3.0, 3.0]
    envs = [env for env, _ in results]
    assert [(e["RANK"], e["WORLD_SIZE"]) for e in envs] == [("0", "2"), ("1", "2")]
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    # members on one host count each other; on separate hosts each is alone
    local = [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs]
    assert local in ([("0", "2"), ("1", "2")], [("0", "1"), ("0", "1")])
    assert Ring(2, all_reduce_rank, fiber_style_init).run() == [3.0, 3.0]


def test_es_trains_with_only_the_backend_changed(cluster, tmp_path):
    cfg = compose(["env=cartpole", "workers=2", "algo.population=8", "algo.iterations=2", "algo.eval_episodes=1",
                   "algo.noise_size=1000000", "tensorboard=false"])
    summary = run(cfg, tmp_path / "es")
    assert summary["iterations"] == 2
    keys = ("iteration", "timesteps", "reward_mean", "reward_max", "eval_reward", "grad_norm", "theta_norm")
    metrics = [{k: line[k] for k in keys} for line in map(json.loads, (tmp_path / "es" / "metrics.jsonl").open())]
    ES_METRICS[mp.get_config().backend] = metrics
    assert metrics == ES_METRICS.get("local", metrics)


def test_ppo_env_servers_run_with_only_the_backend_changed(cluster, tmp_path):
    cfg = compose(["algo=ppo", "env=cartpole", "workers=2", "algo.envs_per_worker=2", "algo.num_steps=64",
                   "algo.total_timesteps=512", "algo.eval_every=0", "tensorboard=false"])
    summary = run(cfg, tmp_path / "ppo")
    assert summary["iterations"] == 2 and summary["env_server_restarts"] == 0
    keys = ("timesteps", "charts/episodic_return", "losses/value_loss", "losses/policy_loss", "losses/entropy")
    metrics = [{k: line[k] for k in keys} for line in map(json.loads, (tmp_path / "ppo" / "metrics.jsonl").open())]
    PPO_METRICS[mp.get_config().backend] = metrics
    assert metrics == PPO_METRICS.get("local", metrics)  # the envs' results do not depend on where they ran
