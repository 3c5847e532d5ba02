"""Hosts that fail without dying, on a real Docker daemon, each container standing in for a
host with its own address: cut off from the network (``docker network disconnect``, healed by
``connect``, which gives it its address back) or stalled (``docker pause``).  A pool's master
hears every worker's heartbeat; one unheard for ``silence_timeout`` is given up, its tasks
rerun elsewhere uncharged, its job killed and its link ended; a shorter fault costs only time.

Skipped, with the reason, when no daemon answers (see .ci/start-docker).
"""
import os
import threading
import time

import numpy as np
import pytest
from conftest import clean_up_as_at_exit, wait_until
from helpers import host_faults
from helpers.pool_workers import worker_running_a_chunk

import fiberrl.runtime as mp
from fiberrl.runtime.processes.lifeline import beat_interval, beats_sent

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.usefixtures("a_docker_daemon", "no_containers_left")]


def slow_square(x):
    time.sleep(1.0)
    return x * x


def square(x):
    return x * x


NETWORK = f"fiberrl-test-faults-{os.getpid()}"


@pytest.fixture(scope="module")
def hosts(api):
    """A network of the containers' own (host_faults.make_network)."""
    for stale in api.networks(names=["fiberrl-test-faults-"]):  # left by a run that was killed
        if not api.inspect_network(stale["Id"]).get("Containers"):
            api.remove_network(stale["Id"])
    host_faults.make_network(api, NETWORK, "172.29.0.0/16", "172.29.0.1")
    yield
    clean_up_as_at_exit("docker")  # the network goes once no container is on it
    wait_until(lambda: not api.inspect_network(NETWORK).get("Containers"), 30, 0.2)
    api.remove_network(NETWORK)


@pytest.fixture
def config(docker_config, hosts):
    def configure(**extra):
        return docker_config(docker_network=NETWORK, **extra)
    return configure


def cut(api, container: str, fault: str) -> str | None:
    return host_faults.cut(api, container, fault, NETWORK)


def heal(api, container: str, fault: str, address: str | None) -> None:
    host_faults.heal(api, container, fault, NETWORK, address)


running = host_faults.running


@pytest.mark.parametrize("fault", ["partition", "pause"])
def test_a_host_silent_past_the_deadline_is_given_up_and_its_tasks_rerun(config, api, fault):
    """Cut off mid-task for longer than ``silence_timeout``: the master notices within a heartbeat
    of the deadline, reruns what the worker held elsewhere without charging it (max_task_crashes=1
    would fail a charged task), kills its container and starts its successor; every result comes
    once, and the healed host's worker never comes back."""
    config(silence_timeout=4)
    pool = mp.Pool(2, max_task_crashes=1)
    try:
        result = pool.map_async(slow_square, range(10), chunksize=1)
        container = worker_running_a_chunk(pool)._job.handle.id
        address = cut(api, container, fault)
        cut_at = time.monotonic()
        try:
            assert wait_until(lambda: pool.statistics().workers_cut_off == 1, 30)
            noticed = time.monotonic() - cut_at
            assert result.get(60) == [x * x for x in range(10)]
        finally:
            heal(api, container, fault, address)
        stats = pool.statistics()
        assert (stats.workers_cut_off, stats.worker_restarts, stats.tasks_failed) == (1, 0, 0)
        assert stats.tasks_resubmitted >= 1
        # silence counts from the last heartbeat heard, up to a beat_interval() (1 s) before the cut
        assert 3 <= noticed < 7, f"noticed {noticed:.1f} s after the cut, silence_timeout 4 s"
        assert wait_until(lambda: not running(api, container), 30)
        assert pool.map(square, range(6)) == [x * x for x in range(6)]
        pool.close()
        pool.join()
    finally:
        pool.terminate()


@pytest.mark.parametrize("fault", ["partition", "pause"])
def test_a_host_silent_for_less_than_the_deadline_costs_only_time(config, api, fault):
    """Cut off mid-task for 3 s of the default 10 s ``silence_timeout``: once healed, its worker goes
    on where it was (the connection survives: TCP resends what the cut held up, within about twice
    the cut as its resends back off), nothing is rerun."""
    assert config().silence_timeout == 10
    pool = mp.Pool(2, max_task_crashes=1)
    try:
        result = pool.map_async(slow_square, range(10), chunksize=1)
        container = worker_running_a_chunk(pool)._job.handle.id
        address = cut(api, container, fault)
        time.sleep(3)
        heal(api, container, fault, address)
        assert result.get(60) == [x * x for x in range(10)]
        stats = pool.statistics()
        assert (stats.workers_cut_off, stats.worker_restarts, stats.tasks_resubmitted) == (0, 0, 0)
        assert running(api, container)
        pool.close()
        pool.join()
    finally:
        pool.terminate()


def beats_after(seconds):
    time.sleep(seconds)
    return beats_sent()


def test_a_worker_sending_results_is_heard_by_them_and_beats_only_when_quiet(config):
    """A busy worker's results tell its pool it is there: the heartbeats it would send meanwhile are left
    out (a master of thousands of busy workers reads their results, not beats as well), and a task
    longer than ``silence_timeout`` has it beat again, so it is not given up."""
    config(silence_timeout=2)  # a beat every 0.5 s; one asking for an answer every 7.5 s
    assert beat_interval() == 0.5
    pool = mp.Pool(1)
    try:
        counts = pool.map(beats_after, [0.05] * 80, chunksize=1)  # 4 s of results
        assert counts[-1] - counts[0] <= 1, counts  # at most an answered one; 8 were sent before
        before = counts[-1]
        assert pool.apply(beats_after, (3.0,)) - before >= 4  # 3 s without a result: it beats
        assert pool.map(beats_after, [0.05] * 40, chunksize=1)
        assert pool.statistics().workers_cut_off == 0
        pool.close()
        pool.join()
    finally:
        pool.terminate()


def test_a_worker_given_work_asks_its_pool_for_no_answer_until_work_stops(config):
    """Work from its pool tells a worker its parent lives, as an answer would: a busy worker's beats
    ask for none (a master of thousands of busy workers answered a ping from each every quarter of
    ``heartbeat_timeout``), and once work stops they ask again within that quarter."""
    config(silence_timeout=2, heartbeat_timeout=2)  # a beat every 0.5 s, every one asking for an answer
    assert beat_interval() == 0.5
    pool = mp.Pool(1)
    try:
        counts = pool.map(beats_after, [0.05] * 80, chunksize=1)  # 4 s of results and work
        assert counts[-1] - counts[0] <= 1, counts  # 8 answered beats before
        before = counts[-1]
        assert pool.apply(beats_after, (3.0,)) - before >= 4  # 3 s without work: it asks again
        assert pool.statistics().workers_cut_off == 0
        pool.close()
        pool.join()
    finally:
        pool.terminate()


def wait_forever():
    time.sleep(600)


def test_a_job_cut_off_from_its_parent_ends_itself(config, api):
    """A job whose parent stops answering (here: its host cut off for good) exits within its
    lifeline's deadline (``heartbeat_timeout``), so nothing is left running where the master
    cannot reach."""
    config(heartbeat_timeout=4, silence_timeout=0)
    process = mp.Process(target=wait_forever)
    process.start()
    try:
        assert wait_until(lambda: process.silent_for() is not None, 60)
        container = process._job.handle.id
        cut(api, container, "partition")
        cut_at = time.monotonic()
        assert wait_until(lambda: not running(api, container), 30)
        ended = time.monotonic() - cut_at
        assert ended < 4 + 2 * beat_interval() + 2, f"ended {ended:.1f} s after the cut"
    finally:
        process.kill()
        process.join(30)


def container_of(manager) -> str:
    return manager._process._job.handle.id


@pytest.mark.parametrize("fault", ["partition", "pause"])
def test_an_env_server_cut_off_holding_a_step_is_rebuilt_and_the_step_comes_back_as_it_would_have(config, api,
                                                                                                  fault):
    """CartPole on 2 servers of 2 envs; server 0's host cut off as a step is sent to it, for longer than
    ``silence_timeout``: the server is given up (its container killed), a new one rebuilds its envs as
    they were before that step and takes it again, and every step is what the undisturbed envs step
    (no restart, no episode cut short)."""
    from helpers.env_steps import same_steps, steps_of

    from fiberrl.rl.env_servers import EnvSpec
    from fiberrl.rl.remote_envs import RemoteEnvs
    config(silence_timeout=4)
    rng = np.random.default_rng(0)
    actions = [rng.integers(2, size=4) for _ in range(60)]
    spec = EnvSpec("CartPole-v1")
    undisturbed = RemoteEnvs(spec, servers=2, envs_per_server=2, seed=3)
    try:
        expected = steps_of(undisturbed, actions)
    finally:
        undisturbed.close()
    cuts = []

    def cut_server_0(t, envs):
        if t == 30:
            container = container_of(envs.managers[0])
            cuts.append((container, cut(api, container, fault), time.monotonic()))

    envs = RemoteEnvs(spec, servers=2, envs_per_server=2, seed=3)
    try:
        stepped = steps_of(envs, actions, cut_server_0)
        (container, address, cut_at), = cuts
        assert (envs.rebuilds, envs.restarts) == (1, 0)
        assert wait_until(lambda: not running(api, container), 30)
        heal(api, container, fault, address)
    finally:
        envs.close()
    same_steps(stepped, expected)


def test_ppo_with_an_env_server_cut_off_mid_rollout_ends_as_the_undisturbed_run(config, api, tmp_path):
    """PPO's env server 1 cut off for good mid-rollout (given up after ``silence_timeout``): the run's
    parameters and metrics are those of the undisturbed run, bit for bit."""
    from helpers.ppo_runs import metrics, parameters, train, untimed
    config(silence_timeout=4)
    settings = ["env=cartpole", "env.engine=gymnasium", "workers=2", "algo.envs_per_worker=2", "algo.num_steps=256",
                "algo.total_timesteps=4096"]
    quiet = train(tmp_path, "quiet", settings)
    cuts, rebuilds = [], []

    def cut_server_1_mid_rollout(update, envs):
        rebuilds.append(envs.rebuilds)
        if update == 1:
            container = container_of(envs.managers[1])
            threading.Timer(0.05, lambda: cuts.append((container, cut(api, container, "partition")))).start()

    try:
        moved = train(tmp_path, "moved", settings, on_iteration=cut_server_1_mid_rollout)
    finally:
        for container, address in cuts:
            heal(api, container, "partition", address)
    assert len(cuts) == 1 and rebuilds[-1] == 1 and moved["env_server_restarts"] == 0
    assert np.array_equal(parameters(quiet), parameters(moved))
    assert untimed(metrics(tmp_path / "quiet")) == untimed(metrics(tmp_path / "moved"))


def gloo_init(node):
    node.init_process_group("gloo", timeout=120)


def all_reduce_for_a_minute(rank, size):
    import torch
    import torch.distributed as dist
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.1)
    return rank


@pytest.mark.parametrize("fault", ["partition", "pause"])
def test_a_ring_member_cut_off_is_given_up_and_named(config, api, fault, monkeypatch):
    """A member's host cut off while the members all-reduce: the others would wait for it in gloo's
    collective for its whole timeout; instead the Ring names it within a heartbeat of
    ``silence_timeout`` (so that PPO's learners start again from their checkpoint), and no
    member's container is left.  A paused member's connections to this process's queues, which
    no end of theirs will ever reach, are found dead by TCP's keepalive and let go of (a cut-off
    one's, with data in flight, only once TCP gives up its resends, ~15 minutes)."""
    from fiberrl.runtime.net import stream
    from fiberrl.runtime.processes.hub import get_hub
    if fault == "pause":
        # quick keepalive: a paused host's kernel answers its probes until the member is killed, then
        # they find its connections gone (a cut-off host answers none: its links would close before
        # silence_timeout, and a job whose link is gone is no longer one to hear from)
        monkeypatch.setattr(stream, "KEEPALIVE", (1, 1, 2))
    config(silence_timeout=4)
    orphans = set(get_hub()._orphans)
    ring = mp.Ring(2, all_reduce_for_a_minute, gloo_init)
    outcome = {}

    def run():
        try:
            outcome["values"] = ring.run()
        except mp.RingError as exc:
            outcome["error"] = exc, time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    assert wait_until(lambda: len(ring._members) == 2 and all(p.silent_for() is not None for p in ring._members), 60)
    time.sleep(2)  # in their collectives
    container = ring._members[1]._job.handle.id
    address, cut_at = cut(api, container, fault), time.monotonic()
    try:
        thread.join(30)
    finally:
        heal(api, container, fault, address)
    error, noticed_at = outcome["error"]
    assert error.rank == 1 and "not been heard for over silence_timeout" in str(error)
    assert 3 <= noticed_at - cut_at < 8, f"noticed {noticed_at - cut_at:.1f} s after the cut"
    assert wait_until(lambda: not any(running(api, p._job.handle.id) for p in ring._members), 30)
    if fault == "pause":
        assert wait_until(lambda: get_hub()._orphans <= orphans, 30), "the lost member's queues are still held"


def test_a_sweep_run_whose_host_is_cut_off_goes_on_from_its_checkpoint_without_a_try(hosts, tmp_path):
    """Two ES runs of a sweep on Docker, the same but for their checkpoint cadence; the first run's
    container cut off for good once it has checkpointed.  The launcher gives it up after
    ``silence_timeout`` (its container killed) and starts it again from its checkpoint, not counted
    as a try (retries=0 would fail a counted one), and it computes what the undisturbed run did."""
    import json
    import shutil
    from pathlib import Path

    from conftest import ROOT
    from helpers import docker_backend
    from helpers.script_runs import run_sweep
    from test_sweep_launcher import ES, es_metrics, table
    settings = {**{k: v for k, v in docker_backend.settings().items() if k != "backend"},
                "docker_network": NETWORK, "silence_timeout": 4}
    sweep_dir = Path(ROOT) / "runs" / "test-sweeps" / f"cut-off-{os.getpid()}-{time.monotonic_ns()}"
    args = [*ES, "algo.iterations=12", "algo.checkpoint_every=2,3", "seed=0", "backend=docker",
            *[f"backend.settings.{k}={v!r}" for k, v in settings.items()], f"hydra.sweep.dir={sweep_dir}",
            "hydra.sweep.subdir=${hydra.job.num}", "hydra.launcher.table=plain", "hydra.launcher.retries=0"]
    api = docker_backend._client()
    cuts = []
    try:
        proc = run_sweep(args, ROOT, wait=False)
        first = sweep_dir / "0"
        checkpointed = lambda: any((first / "checkpoints").glob("*.npz"))  # noqa: E731
        assert wait_until(lambda: proc.poll() is not None or checkpointed(), 240) and proc.poll() is None, \
            proc.stderr.read() if proc.poll() is not None else "no checkpoint"
        container = json.loads((first / ".hydra" / "job_where.json").read_text())["host"]
        cuts.append((container, cut(api, container, "partition")))
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{out}\n{err}"
        rows = table(sweep_dir)
        assert [(row["state"], row["tries"]) for row in rows] == [("done", "1"), ("done", "1")]
        assert "its job went unheard (its host cut off or stalled), 1 time(s)" in rows[0]["why"]
        assert es_metrics(first) == es_metrics(sweep_dir / "1") and len(es_metrics(first)) == 12
        assert wait_until(lambda: not docker_backend.leftovers(), 60), docker_backend.leftovers()
    finally:
        for container, address in cuts:
            heal(api, container, "partition", address)
        shutil.rmtree(sweep_dir, ignore_errors=True)


def test_es_with_a_worker_cut_off_mid_map_gives_the_parameters_of_an_undisturbed_run(config, api, tmp_path):
    """A pool worker's host cut off for good in the middle of an ES iteration's map: its tasks rerun
    elsewhere once it is given up, and the run is bit-identical to one where no host was cut off."""
    from fiberrl.app import run
    from fiberrl.app_config import compose
    config(silence_timeout=4)
    settings = ["algo=es", "env=cartpole", "algo.population=24", "algo.eval_episodes=2", "algo.iterations=5",
                "seed=3", "workers=2", "algo.chunksize=2", "tensorboard=false"]
    quiet = run(compose(settings), tmp_path / "quiet")
    cuts, cut_off = [], []

    def cut_a_worker_mid_map(iteration, pool):
        cut_off.append(pool.statistics().workers_cut_off)
        if iteration == 1:
            def cut_one():
                container = worker_running_a_chunk(pool)._job.handle.id
                cuts.append((container, cut(api, container, "partition")))
            threading.Thread(target=cut_one).start()

    try:
        stormy = run(compose(settings), tmp_path / "stormy", on_iteration=cut_a_worker_mid_map)
    finally:
        for container, address in cuts:
            heal(api, container, "partition", address)
    assert len(cuts) == 1 and cut_off[-1] == 1
    assert np.array_equal(quiet["theta"], stormy["theta"])
