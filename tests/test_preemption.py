"""A pool worker told to stop (SIGTERM, as a cluster takes a host back): it
finishes the chunk it runs within the grace period or gives it back, what it
held runs elsewhere at once, nothing counts as a crash, the pool replaces it;
an env server told to stop answers its step and its envs move to a new one.
ES stays bit-identical and PPO exact through them.  Runs and PPO's learners
told to stop: test_sweep_launcher.py, test_ppo_learners.py.  The same on
Docker (``docker stop``) and Slurm (``scancel --signal=TERM``):
test_backend_docker.py, test_backend_slurm.py."""
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import pid_alive, wait_until
from helpers.env_steps import same_steps, steps_of
from helpers.pool_workers import worker_running_a_chunk, workers_taking_work

import fiberrl.runtime as mp

pytestmark = pytest.mark.slow  # the tests here start processes


def record_and_square(x, folder, seconds):
    """Sleeps ``seconds`` (one C call: a signal handler on the main thread would wait for it),
    then leaves a file per execution."""
    time.sleep(seconds)
    with open(os.path.join(folder, f"{x}.{os.getpid()}.{time.monotonic_ns()}"), "w"):
        pass
    return x * x


def executions(folder) -> dict[int, int]:
    counts = {}
    for name in os.listdir(folder):
        x = int(name.split(".")[0])
        counts[x] = counts.get(x, 0) + 1
    return counts


@pytest.fixture
def grace():
    def configure(seconds):
        mp.configure(preempt_grace=seconds)
    yield configure
    mp.config.reset()


def running_workers(pool, count):
    assert wait_until(lambda: pool.statistics().workers_alive == count, 30)
    return [w.process for w in pool._scheduler.policy.workers.values() if w.stream_id is not None]


def test_a_chunk_finished_within_the_grace_runs_once(tmp_path, grace):
    """Told to stop mid-chunk, the worker finishes it (each task runs exactly once), gives back
    what it held but had not started, and leaves; with max_task_crashes=1 one charge would fail
    a task."""
    grace(20)
    with mp.Pool(2, max_task_crashes=1) as pool:
        running_workers(pool, 2)
        result = pool.starmap_async(record_and_square, [(x, str(tmp_path), 0.4) for x in range(12)], chunksize=2)
        pid = worker_running_a_chunk(pool).pid
        os.kill(pid, signal.SIGTERM)
        assert result.get(60) == [x * x for x in range(12)]
        assert wait_until(lambda: pool.statistics().workers_preempted == 1, 30)  # its end is handled
        stats = pool.statistics()
    assert executions(tmp_path) == {x: 1 for x in range(12)}
    assert (stats.workers_preempted, stats.worker_restarts, stats.tasks_failed) == (1, 0, 0)
    assert not pid_alive(pid)


def test_a_chunk_longer_than_the_grace_runs_again_uncharged(tmp_path, grace):
    """A task that holds the worker's main thread in one 30 s C call: the worker still leaves
    within the grace, and the task runs again elsewhere, not charged as a crash."""
    grace(0.5)
    with mp.Pool(2, max_task_crashes=1) as pool:
        running_workers(pool, 2)
        long = pool.apply_async(record_and_square, (0, str(tmp_path), 30))
        pid = worker_running_a_chunk(pool).pid
        os.kill(pid, signal.SIGTERM)
        told = time.monotonic()
        assert wait_until(lambda: not pid_alive(pid), 10)
        left_after = time.monotonic() - told
        assert wait_until(lambda: pool.statistics().workers_preempted == 1, 10)
        assert pool.statistics().tasks_resubmitted == 1
        pool.terminate()  # the task's rerun would take 30 s more
    assert left_after < 5, f"left {left_after:.1f} s after SIGTERM with a grace of 0.5 s"
    with pytest.raises(Exception, match="terminated"):
        long.get(10)


def test_a_stopped_worker_is_replaced_and_its_held_chunks_run_elsewhere(tmp_path, grace):
    grace(0.3)
    with mp.Pool(2, max_task_crashes=1, prefetch=4) as pool:
        workers = running_workers(pool, 2)
        result = pool.starmap_async(record_and_square, [(x, str(tmp_path), 0.5) for x in range(16)], chunksize=1)
        pid = worker_running_a_chunk(pool).pid
        os.kill(pid, signal.SIGTERM)
        assert sorted(result.get(60)) == sorted(x * x for x in range(16))
        assert wait_until(lambda: pool.statistics().workers_preempted == 1, 30)
        stats = pool.statistics()
        assert stats.workers_preempted == 1 and stats.worker_restarts == 0 and stats.tasks_failed == 0
        assert stats.tasks_resubmitted >= 1  # at least the chunk cut off by the short grace
        assert wait_until(lambda: pool.statistics().workers_alive == 2, 30)
        assert pid not in [p.pid for p in running_workers(pool, 2)] and pid in [p.pid for p in workers]
        assert pool.starmap(record_and_square, [(x, str(tmp_path), 0) for x in range(100, 104)]) == \
            [x * x for x in range(100, 104)]
    counts = executions(tmp_path)
    assert set(counts) == set(range(16)) | set(range(100, 104))
    assert sum(counts.values()) - len(counts) <= 1  # only the chunk it could not finish ran twice


def test_an_idle_worker_told_to_stop_leaves_at_once(grace):
    grace(20)
    with mp.Pool(2) as pool:
        pid = running_workers(pool, 2)[0].pid
        told = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        assert wait_until(lambda: not pid_alive(pid), 10)
        assert time.monotonic() - told < 5
        assert wait_until(lambda: pool.statistics().workers_alive == 2, 30)
        assert pool.statistics().workers_preempted == 1
        assert pool.map(abs, range(-5, 5)) == [abs(x) for x in range(-5, 5)]


def test_a_storm_of_preemptions_runs_every_task_exactly_once(tmp_path, grace):
    """A worker told to stop every 0.2 s, whatever it is doing (starting, asking for work, running,
    sending a result): each of 300 tasks runs exactly once and none is charged a crash."""
    grace(20)
    stop, told = threading.Event(), []

    def storm(pool):
        while not stop.wait(0.2):
            pids = workers_taking_work(pool)
            if pids:
                told.append(random.choice(pids))
                os.kill(told[-1], signal.SIGTERM)

    with mp.Pool(4, max_task_crashes=1) as pool:
        running_workers(pool, 4)
        thread = threading.Thread(target=storm, args=(pool,))
        thread.start()
        try:
            values = pool.starmap(record_and_square, [(x, str(tmp_path), 0.02) for x in range(300)], chunksize=1)
        finally:
            stop.set()
            thread.join()
        # every worker told leaves (some may still be leaving as the map ends; one told twice counts once)
        assert wait_until(lambda: pool.statistics().workers_preempted == len(set(told)), 30)
        stats = pool.statistics()
    assert values == [x * x for x in range(300)]
    assert executions(tmp_path) == {x: 1 for x in range(300)}
    assert len(told) >= 5 and stats.worker_restarts == 0 and stats.tasks_failed == 0


@pytest.mark.parametrize("when", ["mid_step", "between_steps"])
def test_an_env_server_told_to_stop_hands_its_envs_over_and_loses_no_step(grace, when):
    """CartPole on 2 servers of 2 envs: server 0 told to stop as a step is sent to it, or while the
    learner would be updating.  Every step after is what the uninterrupted
    run steps: the envs moved to a new server exactly where they were; no restart, no episode cut."""
    from fiberrl.rl.env_servers import EnvSpec
    from fiberrl.rl.remote_envs import RemoteEnvs
    grace(20)
    rng = np.random.default_rng(0)
    actions = [rng.integers(2, size=4) for _ in range(120)]
    spec = EnvSpec("CartPole-v1")

    def uninterrupted():
        envs = RemoteEnvs(spec, servers=2, envs_per_server=2, seed=3)
        try:
            return steps_of(envs, actions)
        finally:
            envs.close()

    told = []

    def stop_server_0(t, envs):
        if t == 50:
            pid = envs.pids()[0]
            told.append(pid)
            if when == "mid_step":
                threading.Timer(0.01, os.kill, (pid, signal.SIGTERM)).start()
            else:
                os.kill(pid, signal.SIGTERM)
                time.sleep(0.3)

    envs = RemoteEnvs(spec, servers=2, envs_per_server=2, seed=3)
    try:
        stepped = steps_of(envs, actions, stop_server_0)
        handovers, restarts, pid_now = envs.handovers, envs.restarts, envs.pids()[0]
    finally:
        envs.close()
    assert handovers == 1 and restarts == 0 and pid_now != told[0]
    expected = uninterrupted()
    same_steps(stepped, expected)
    assert any(e for step in stepped[50:] for e in step[5])  # episodes ended after the hand-over too


def test_es_under_preemptions_gives_the_parameters_of_an_undisturbed_run(tmp_path, grace):
    """A pool worker told to stop in the middle of every other ES iteration's map: the run is
    bit-identical to one where no worker was."""
    from fiberrl.app import run
    from fiberrl.app_config import compose
    grace(20)
    settings = ["algo=es", "env=cartpole", "algo.population=24", "algo.eval_episodes=2", "algo.iterations=6",
                "seed=3", "workers=2", "algo.chunksize=2", "tensorboard=false"]
    quiet = run(compose(settings), tmp_path / "quiet")
    told, preempted = [], []

    def tell_a_worker_mid_map(iteration, pool):
        preempted.append(pool.statistics().workers_preempted)

        def tell():  # as soon as the next map's tasks are out (an iteration takes ~20 ms)
            deadline = time.monotonic() + 5
            while pool.statistics().tasks_in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.0005)
            pids = workers_taking_work(pool)
            if pids:
                told.append(pids[0])
                os.kill(pids[0], signal.SIGTERM)
        if iteration % 2 == 0:
            threading.Thread(target=tell).start()

    stormy = run(compose(settings), tmp_path / "stormy", on_iteration=tell_a_worker_mid_map)
    assert len(told) >= 2 and preempted[-1] >= 1
    assert np.array_equal(quiet["theta"], stormy["theta"])


def test_ppo_with_an_env_server_told_to_stop_mid_rollout_ends_as_the_undisturbed_run(tmp_path, grace):
    """On the gymnasium engine, whose envs a new server rebuilds exactly (EnvPool's end their
    episodes at the hand-over instead, and the run goes another way)."""
    from helpers.ppo_runs import metrics, parameters, train, untimed
    grace(20)
    settings = ["env=cartpole", "env.engine=gymnasium", "workers=2", "algo.envs_per_worker=2", "algo.num_steps=256",
                "algo.total_timesteps=5120"]
    quiet = train(tmp_path, "quiet", settings)
    told = []

    def tell_a_server_mid_rollout(update, envs):
        if update == 1:
            pid = envs.pids()[1]
            threading.Timer(0.05, lambda: (os.kill(pid, signal.SIGTERM), told.append(pid))).start()

    moved = train(tmp_path, "moved", settings, on_iteration=tell_a_server_mid_rollout)
    assert told and moved["env_server_restarts"] == 0
    assert np.array_equal(parameters(quiet), parameters(moved))
    assert untimed(metrics(tmp_path / "quiet")) == untimed(metrics(tmp_path / "moved"))


def adds_an_asyncio_signal_handler(x):
    import asyncio

    async def main():
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, lambda: None)
        await asyncio.sleep(0.01)
    asyncio.run(main())  # its loop takes Python's signal wakeup fd, and gives it up on closing
    return x


def test_a_worker_whose_task_took_the_signal_wakeup_fd_still_hears_sigterm(tmp_path, grace):
    grace(20)
    with mp.Pool(1, max_task_crashes=1) as pool:
        assert pool.map(adds_an_asyncio_signal_handler, range(2)) == [0, 1]
        result = pool.starmap_async(record_and_square, [(x, str(tmp_path), 0.5) for x in range(3)], chunksize=1)
        os.kill(worker_running_a_chunk(pool).pid, signal.SIGTERM)
        assert result.get(60) == [0, 1, 4]
        assert wait_until(lambda: pool.statistics().workers_preempted == 1, 10)
    assert executions(tmp_path) == {0: 1, 1: 1, 2: 1}


def test_a_forked_child_hears_neither_for_its_parent_nor_through_it():
    """A process that watches for SIGTERM forks (no exec): the child starts with Python's way (the
    signal ends it), and its signal is not taken for the parent's through the pipe they would share."""
    script = textwrap.dedent("""
        import os, signal, time
        from fiberrl.runtime.processes import stop_signal
        assert stop_signal.watch()
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        time.sleep(0.3)
        print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, stop_signal.told())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "False"], done.stderr
