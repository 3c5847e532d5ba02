"""The docker backend against a real Docker daemon, checked against what the
daemon received (container labels, limits, mounts) and what the jobs saw.

Skipped, with the reason, when no daemon answers (see .ci/start-docker).
The jobs run in the image tests/helpers/docker_backend.py makes from this machine's
libraries, with the interpreter and the venv mounted.
"""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from conftest import ROOT, wait_until
from helpers import docker_backend
from helpers.pool_workers import worker_running_a_chunk

import fiberrl.runtime as mp
from fiberrl.runtime.backends import OWNER, JobSpec, get_backend
from fiberrl.runtime.backends.docker import DockerBackend, DockerError, exit_code
from fiberrl.runtime.net import auth

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.usefixtures("a_docker_daemon", "no_containers_left")]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


# --- what the jobs run ---------------------------------------------------------
@mp.meta(cpu=0.5, mem=256)
def report_and_wait(q, volume_dir, name):
    with open(os.path.join(volume_dir, name), "w") as fh:
        fh.write("from the volume")
    with open(name, "w") as fh:
        fh.write("from the working directory")
    q.put(dict(cwd=os.getcwd(), listing=sorted(os.listdir(".")), env=dict(os.environ)))
    time.sleep(600)


def exit_with(code):
    sys.exit(code)


def sleep_long():
    time.sleep(600)


@mp.meta(mem=100)
def use_too_much_memory():
    hog = b"x" * (400 * 2**20)
    return len(hog)


@mp.meta(gpu=1)
def use_gpu():
    pass


def start_a_process(q):
    try:
        p = mp.Process(target=exit_with, args=(0,))
        p.start()
        p.join(30)
        q.put(("started", p.exitcode))
    except Exception as exc:  # the error is what is tested
        q.put(("error", f"{type(exc).__name__}: {exc}"))


def square(x):
    return x * x


def running_container(api, job):
    assert wait_until(lambda: api.inspect_container(job.handle.id)["State"]["Running"], 30)
    return api.inspect_container(job.handle.id)


# --- the tests -------------------------------------------------------------------
def test_container_gets_labels_limits_env_and_mounts(docker_config, api, tmp_path, monkeypatch):
    monkeypatch.setenv("FORWARD_ME", "yes")
    monkeypatch.setenv("HOST_ONLY", "no")
    os.chmod(tmp_path, 0o777)
    docker_config(forward_env="FORWARD_ME",
                  volumes=docker_backend.settings()["volumes"] + f",{tmp_path}:/data")
    q = mp.Queue()
    name = f"written-by-job-{uuid.uuid4().hex[:8]}"
    p = mp.Process(target=report_and_wait, args=(q, "/data", name))
    p.start()
    try:
        seen = q.get(timeout=60)
        info = running_container(api, p._job)
        labels = info["Config"]["Labels"]
        assert labels["fiberrl.run"] == auth.run_id() and labels["fiberrl.owner"] == OWNER
        assert labels["fiberrl.process"] == p.name
        host = info["HostConfig"]
        assert host["NanoCpus"] == 500_000_000 and host["Memory"] == host["MemorySwap"] == 256 * 1024 * 1024
        assert host["AutoRemove"] and host["Init"]
        assert info["Config"]["Image"] == docker_backend.settings()["image"]
        mounts = {m["Destination"]: m for m in info["Mounts"]}
        assert mounts[os.getcwd()]["Source"] == os.getcwd() and mounts[os.getcwd()]["RW"]
        assert mounts["/data"]["Source"] == str(tmp_path)
        assert not mounts[sys.base_prefix]["RW"]

        assert seen["cwd"] == os.getcwd() and seen["listing"] == sorted(os.listdir("."))
        env = seen["env"]
        assert env["FORWARD_ME"] == "yes" and "HOST_ONLY" not in env
        assert env["PATH"] != os.environ["PATH"] or "venv" not in env["PATH"]
        assert {"FIBERRL_PARENT_ADDRESS", "FIBERRL_RUN_SECRET", "FIBERRL_RESOLVED_CONFIG"} <= set(env)
        assert (tmp_path / name).read_text() == "from the volume"
        with open(name) as fh:
            assert fh.read() == "from the working directory"
    finally:
        p.kill()
        p.join(30)
        if os.path.exists(name):
            os.unlink(name)
    assert p.exitcode == -signal.SIGKILL


def test_exit_codes_from_the_event_stream(docker_config):
    exits = mp.Process(target=exit_with, args=(3,))
    killed = mp.Process(target=sleep_long)
    terminated = mp.Process(target=sleep_long)
    for p in (exits, killed, terminated):
        p.start()
    exits.join(60)
    assert exits.exitcode == 3
    assert killed.exitcode is None and killed.is_alive()
    assert wait_until(lambda: get_backend().status(killed._job)[0].value == "running", 30)
    docker_backend.kill_job(killed)  # as a user would: docker kill
    terminated.terminate()
    killed.join(60)
    terminated.join(60)
    assert killed.exitcode == -signal.SIGKILL
    assert terminated.exitcode == -signal.SIGTERM
    assert [exit_code(c) for c in (0, 3, 137, 143, 200)] == [0, 3, -9, -15, 200]


def test_terminate_before_the_container_starts(docker_config):
    p = mp.Process(target=sleep_long)
    p.start()
    p.kill()  # most likely still being started
    p.join(60)
    assert p.exitcode is not None and p.exitcode != 0


def test_out_of_memory_is_a_sigkill_and_said(docker_config, api, caplog):
    p = mp.Process(target=use_too_much_memory)
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    assert "ran out of memory (mem=100 MiB)" in caplog.text


def test_a_container_not_running_after_schedule_timeout_never_ran(docker_config):
    docker_config(schedule_timeout=0)
    p = mp.Process(target=exit_with, args=(0,))
    p.start()
    p.join(30)
    assert p.exitcode == 125 and "schedule_timeout" in p.job_error


def test_exit_codes_survive_a_lost_event_stream(docker_config, api):
    backend = get_backend()
    jobs = [backend.create_job(JobSpec(command=SLEEPER, name=f"sleeper-{i}", cwd=os.getcwd(),
                                       run=auth.run_id(), owner=OWNER)) for i in range(2)]
    for job in jobs:
        running_container(api, job)
    for stream in list(backend._streams.values()):
        stream.close()  # as when the daemon restarts
    api.kill(jobs[0].handle.id)  # while nobody listens
    assert backend.wait(jobs[0], 30) == -signal.SIGKILL
    backend.terminate(jobs[1])
    assert backend.wait(jobs[1], 30) == -signal.SIGTERM


def test_gpu_request(docker_config, api):
    spec = JobSpec(command=["true"], name="gpu-job", gpu=1, cpu=2, mem=100)
    host_config = get_backend()._host_config(spec, auto_remove=True)
    assert host_config["DeviceRequests"] == [
        {"Driver": "", "Count": 1, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}]
    assert host_config["NanoCpus"] == 2_000_000_000 and host_config["Memory"] == 100 * 1024 * 1024
    p = mp.Process(target=use_gpu)
    p.start()
    p.join(60)
    if p.exitcode != 0:  # no NVIDIA runtime on this Docker host: says so
        assert p.exitcode == 125
        assert "NVIDIA Container Toolkit" in p.job_error and "gpu" in p.job_error


def test_unknown_image_and_no_image(docker_config):
    docker_config(image="fiberrl-no-such-image:1")
    with pytest.raises(DockerError, match=r"fiberrl-no-such-image:1.*docker build"):
        mp.Process(target=exit_with, args=(0,)).start()
    docker_config(image="")
    with pytest.raises(ValueError, match="set `image`"):
        mp.Process(target=exit_with, args=(0,)).start()


def test_no_daemon_names_docker_host_and_dockerd(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(DockerError, match=r"unix:///nonexistent/docker.sock \(DOCKER_HOST\).*dockerd"):
        DockerBackend().create_job(JobSpec(command=["true"], name="nowhere", run="r", owner="o"))


def test_a_job_without_the_docker_socket_says_to_mount_it(docker_config):
    q = mp.Queue()
    p = mp.Process(target=start_a_process, args=(q,))
    p.start()
    kind, detail = q.get(timeout=60)
    p.join(60)
    assert kind == "error" and "/var/run/docker.sock:/var/run/docker.sock" in detail and "volumes" in detail


def test_cleanup_removes_the_owners_containers(docker_config, api):
    owner = "test" + uuid.uuid4().hex[:8]
    backend = get_backend()
    jobs = [backend.create_job(JobSpec(command=SLEEPER, name=f"sleeper-{i}", cwd=os.getcwd(),
                                       run=auth.run_id(), owner=owner)) for i in range(2)]
    for job in jobs:
        running_container(api, job)
    backend.cleanup(owner)
    assert not api.containers(all=True, filters={"label": f"fiberrl.owner={owner}"})
    assert [backend.wait(job, 30) for job in jobs] == [-signal.SIGKILL] * 2


def test_the_reaper_removes_a_killed_owners_containers(docker_config, api, script_env):
    script = textwrap.dedent(f"""
        import os, sys, time
        import fiberrl.runtime as mp
        from fiberrl.runtime.net import auth
        from fiberrl.runtime.backends import OWNER, JobSpec, start_job
        mp.configure(**{docker_backend.settings()!r})
        start_job(JobSpec(command={SLEEPER!r}, name="orphan", cwd=os.getcwd(), run=auth.run_id(), owner=OWNER))
        print(OWNER, flush=True)
        time.sleep(600)
    """)
    owner_process = subprocess.Popen([sys.executable, "-c", script], env=script_env, cwd=ROOT,
                                     stdout=subprocess.PIPE, text=True)
    try:
        owner = owner_process.stdout.readline().strip()
        assert owner, "the owner script failed"
        label = {"label": f"fiberrl.owner={owner}"}
        assert wait_until(lambda: any(c["State"] == "running" for c in api.containers(filters=label)), 30)
    finally:
        owner_process.kill()
        owner_process.wait()
    assert wait_until(lambda: not api.containers(all=True, filters=label), 30)


def test_submit_describe_logs_cancel(docker_config, api):
    secret = os.urandom(32)
    run = auth.run_id(secret)
    settings = docker_backend.settings()
    master = textwrap.dedent("""
        import sys
        import fiberrl.runtime as mp
        def child():
            sys.exit(7)
        if __name__ == "__main__":
            p = mp.Process(target=child)
            p.start()
            p.join(60)
            print("hello from the master; its child exited with", p.exitcode, flush=True)
    """)
    env = {"FIBERRL_BACKEND": "docker", "FIBERRL_VOLUMES": settings["volumes"], "FIBERRL_RUN_SECRET": secret.hex(),
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": ROOT}
    backend = get_backend()
    # no image setting: the master's own jobs find its image by inspecting their container
    docker_config(image="")
    spec = JobSpec(command=[sys.executable, "-c", master], name="hello", env=env, image=settings["image"],
                   cwd=os.getcwd(), run=run)
    job_id = backend.submit(spec)
    try:
        info = api.inspect_container(job_id)
        assert info["Config"]["Labels"]["fiberrl.run"] == run and info["Config"]["Labels"]["fiberrl.submitted"]
        assert "fiberrl.owner" not in info["Config"]["Labels"]
        assert not info["HostConfig"]["AutoRemove"]
        assert "/var/run/docker.sock" in {m["Destination"] for m in info["Mounts"]}
        output = "".join(backend.logs(job_id, follow=True))
        assert "hello from the master; its child exited with 7" in output, output
        assert wait_until(lambda: backend.describe(job_id)["state"] == "exited", 30)
        described = backend.describe(job_id)
        assert described["exit_code"] == 0 and job_id in described["where"]
        assert "hello from the master" in "".join(backend.logs(job_id))
        # a job of the run that is still there: cancel sweeps it with the master
        docker_config()
        straggler = backend.create_job(JobSpec(command=SLEEPER, name="straggler", cwd=os.getcwd(), run=run,
                                               owner=OWNER))
        running_container(api, straggler)
    finally:
        backend.cancel(job_id)
    assert backend.describe(job_id)["state"] == "unknown"
    assert not api.containers(all=True, filters={"label": f"fiberrl.run={run}"})
    assert backend.wait(straggler, 30) == -signal.SIGKILL


def test_pool_map(docker_config):
    pool = mp.Pool(2)
    try:
        assert pool.map(square, range(40)) == [x * x for x in range(40)]
        assert pool.apply(square, (7,)) == 49
    finally:
        pool.close()
        pool.join()


def slow_square(x):
    time.sleep(1.0)
    return x * x


def test_docker_stop_of_a_pool_worker_loses_and_charges_nothing(docker_config, api):
    """``docker stop -t 30`` (SIGTERM, then SIGKILL after 30 s) of a worker's container mid-map: it
    finishes its chunk and leaves well before the 30 s, its other chunks run elsewhere, nothing
    counts as a crash (max_task_crashes=1 would fail a charged task) and the pool replaces it."""
    docker_config(preempt_grace=20)
    pool = mp.Pool(2, max_task_crashes=1)
    try:
        result = pool.map_async(slow_square, range(8), chunksize=1)
        told = time.monotonic()
        api.stop(worker_running_a_chunk(pool)._job.handle.id, timeout=30)
        stopped_after = time.monotonic() - told
        assert result.get(60) == [x * x for x in range(8)]
        assert wait_until(lambda: pool.statistics().workers_preempted == 1, 30)  # its end is handled
        stats = pool.statistics()
        assert (stats.workers_preempted, stats.worker_restarts, stats.tasks_failed) == (1, 0, 0)
        assert stopped_after < 10, f"the container took {stopped_after:.1f} s to stop"
        assert pool.map(square, range(6)) == [x * x for x in range(6)]
        pool.close()
        pool.join()
    finally:
        pool.terminate()


def test_docker_stop_of_an_env_server_moves_its_envs_without_losing_a_step(docker_config, api):
    """``docker stop -t 30`` of an env server's container between two steps: the next step is
    answered, its envs move to a new container where they were, and every step is what an
    uninterrupted run steps."""
    import numpy as np

    from fiberrl.rl.env_servers import EnvSpec
    from fiberrl.rl.remote_envs import RemoteEnvs
    docker_config(preempt_grace=20)
    actions = [np.random.default_rng(t).integers(2, size=2) for t in range(60)]

    def run(stop_at=None):
        envs = RemoteEnvs(EnvSpec("CartPole-v1"), servers=2, envs_per_server=1, seed=4)
        try:
            seen = [envs.reset()]
            for t, a in enumerate(actions):
                if t == stop_at:
                    container = envs.managers[0]._process._job.handle.id
                    threading.Thread(target=api.stop, args=(container,), kwargs={"timeout": 30}, daemon=True).start()
                    time.sleep(1.0)  # the daemon signals at once; the container runs on until it leaves
                    assert api.inspect_container(container)["State"]["Running"]
                step = envs.step(a)
                seen.append(np.concatenate([step.obs.ravel(), step.reward, step.terminated, step.truncated]))
            return seen, envs.handovers, envs.restarts
        finally:
            envs.close()

    moved, handovers, restarts = run(stop_at=30)
    expected, _, _ = run()
    assert (handovers, restarts) == (1, 0)
    assert all(np.array_equal(a, b) for a, b in zip(moved, expected, strict=True))


def _labelled_image(api, inputs: str, tag: str) -> str:
    """A one-file image carrying the test image's label, as another run's would."""
    import io
    import tarfile
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("marker")
        info.size = len(tag)
        tar.addfile(info, io.BytesIO(tag.encode()))
    name = f"{docker_backend.REPOSITORY}-probe:{tag}"
    api.import_image_from_data(data.getvalue(), repository=name.split(":")[0], tag=tag,
                               changes=[f"LABEL {docker_backend.INPUTS_LABEL}={inputs}"])
    return name


def test_a_test_run_removes_only_the_images_it_replaces(api):
    """Two test runs on one daemon (two checkouts) must not remove each other's image mid-run."""
    ours = f"ours-{uuid.uuid4().hex[:8]}"
    superseded = _labelled_image(api, ours, "old")
    another_runs = _labelled_image(api, f"theirs-{uuid.uuid4().hex[:8]}", "fresh")
    kept = _labelled_image(api, ours, "new")
    try:
        docker_backend.remove_superseded(api, ours, kept)
        present = {tag for image in api.images(filters={"label": docker_backend.INPUTS_LABEL})
                   for tag in image.get("RepoTags") or []}
        assert kept in present and another_runs in present
        assert superseded not in present
    finally:
        for name in (superseded, another_runs, kept):
            try:
                api.remove_image(name)
            except Exception:
                pass
