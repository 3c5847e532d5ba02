import os
import sys
import time

import pytest

import fiberrl.runtime as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped before or while its stat was read
        return False


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


@pytest.fixture(autouse=True)
def no_leaked_children():
    yield
    leftover = mp.active_children()
    for p in leftover:
        p.kill()
        p.join(5)
    assert not leftover, f"test left children running: {leftover}"


def hand_out_gpus(monkeypatch, visible: str) -> None:
    """The local backend hands out the GPUs ``visible`` names (CUDA_VISIBLE_DEVICES' form), whatever
    the machine has; what it had read before comes back after the test."""
    from fiberrl.runtime.backends import get_backend
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(get_backend("local"), "_gpus", None)


@pytest.fixture
def fork_server_deaths_forgotten(monkeypatch):
    """The local fork server's deaths counted from none, and none resting it, for this test; what the
    backend had counted before comes back after (a test that kills the server would otherwise leave
    the next tests' jobs fresh interpreters, or count against a test that kills it later)."""
    from collections import deque

    from fiberrl.runtime.backends import get_backend, local
    backend = get_backend("local")
    monkeypatch.setattr(backend, "_fork_server_deaths", deque(maxlen=local.FORK_SERVER_DEATHS))
    monkeypatch.setattr(backend, "_fork_server_rests_until", 0.0)
    return backend


@pytest.fixture
def script_env():
    """Environment for running a script in a fresh interpreter that imports fiberrl."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    for key in [k for k in env if k.startswith("FIBERRL_")]:
        del env[key]
    return env


PYTHON = sys.executable


def clean_up_as_at_exit(backend_name: str) -> None:
    """What this process does for a backend at exit (shared volumes, Secrets
    and anything its jobs left), so that a leak check can run mid-session."""
    from fiberrl.runtime.backends import OWNER, get_backend
    get_backend(backend_name).cleanup(OWNER)


# --- jobs on a real Docker daemon: a module of such tests names the first two in its pytestmark
# (pytest.mark.usefixtures("a_docker_daemon", "no_containers_left")) and asks for the others
@pytest.fixture(scope="module")
def a_docker_daemon():
    """Without one, the module's tests are skipped.  Asked when they run, not when they are collected:
    a daemon that does not answer can take its client's timeout to say so."""
    from helpers import docker_backend
    reason = docker_backend.available()
    if reason is not None:
        pytest.skip(f"docker backend cannot run here: {reason}")


@pytest.fixture(scope="module")
def no_containers_left(a_docker_daemon):
    from helpers import docker_backend
    yield
    clean_up_as_at_exit("docker")
    assert wait_until(lambda: not docker_backend.leftovers(), 30, 0.2), \
        f"containers left: {docker_backend.leftovers()}"


@pytest.fixture(scope="module")
def api(a_docker_daemon):
    from helpers import docker_backend
    return docker_backend._client()


@pytest.fixture
def docker_config(a_docker_daemon):
    """The runtime pointed at the test image; extra settings by calling it."""
    from helpers import docker_backend

    def configure(**extra):
        return mp.configure(**{**docker_backend.settings(), **extra})

    configure()
    yield configure
    mp.config.reset()
