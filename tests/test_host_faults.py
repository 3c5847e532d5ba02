"""Hosts that fail without dying, on a real Docker daemon, each container standing in for a
host with its own address: cut off from the network (``docker network disconnect``, healed by
``connect``, which gives it its address back) or stalled (``docker pause``).  A pool's master
hears every worker's heartbeat; one unheard for ``silence_timeout`` is given up, its tasks
rerun elsewhere uncharged, its job killed and its link ended; a shorter fault costs only time.

Skipped, with the reason, when no daemon answers (see .ci/start-docker).
"""
import os
import time

import pytest
from conftest import clean_up_as_at_exit, wait_until
from docker.errors import NotFound
from helpers import host_faults
from helpers.pool_workers import worker_running_a_chunk

import fiberrl.runtime as mp

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


def running(api, container: str) -> bool:
    try:
        return api.inspect_container(container)["State"]["Running"]
    except NotFound:
        return False


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
        # silence counts from the last heartbeat heard, up to a heartbeat_interval before the cut
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
        assert ended < 4 + 2 * mp.get_config().heartbeat_interval + 2, f"ended {ended:.1f} s after the cut"
    finally:
        process.kill()
        process.join(30)
