"""Code written for Uber's Fiber runs with only the import changed: authkey, Fiber's Pool, init and config."""
import functools
import logging
import os
import pickle
import random

import pytest

import fiberrl.runtime as mp
from fiberrl.runtime import config
from fiberrl.runtime.net import auth

pytestmark = pytest.mark.slow  # the tests here start processes


@pytest.fixture(autouse=True)
def fresh_config(monkeypatch):
    for name in ("FIBERRL_CPU_PER_JOB", "FIBERRL_MEM_PER_JOB", "FIBERRL_LOG_FILE", "FIBERRL_RESOLVED_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    level = logging.getLogger("fiberrl").level
    config.reset()
    yield
    config.reset()
    config.get_config()  # drops a log file handler init() added
    logging.getLogger("fiberrl").setLevel(level)


# --- Process.authkey ------------------------------------------------------------------------------------
def send_authkey(queue):
    queue.put(bytes(mp.current_process().authkey))


def test_authkey_is_inherited_settable_and_not_the_run_secret():
    key = mp.current_process().authkey
    assert isinstance(key, bytes) and len(key) == 32
    assert mp.current_process().authkey == key, "the main process's key changes between reads"
    assert key != auth.run_secret()
    with pytest.raises(TypeError):
        pickle.dumps(key)  # as in multiprocessing: the key is not to be sent by accident
    queue = mp.SimpleQueue()
    p = mp.Process(target=send_authkey, args=(queue,))
    assert p.authkey == key
    p.start()
    assert queue.get() == key
    p.join()
    q = mp.Process(target=send_authkey, args=(queue,))
    q.authkey = b"chosen key"
    q.start()
    assert queue.get() == b"chosen key"
    q.join()


# --- Fiber's Pool arguments and methods -----------------------------------------------------------------
def crash_once(marker):
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    return "survived"


def test_error_handling_true_resubmits_false_fails_the_task(tmp_path):
    with mp.Pool(1, None, (), None, error_handling=True) as pool:
        assert pool.apply(crash_once, (str(tmp_path / "a"),)) == "survived"
    with mp.Pool(1, error_handling=False) as pool, pytest.raises(mp.WorkerLostError):
        pool.apply(crash_once, (str(tmp_path / "b"),))


def random_error_worker(i):
    """Fiber's own test task: raises with probability 0.05."""
    if random.random() < 0.05:
        raise ValueError("random error")
    return i


def test_fibers_error_handling_tests_as_fiber_wrote_them():
    # fiber/tests/test_pool.py's test_error_handling and test_error_handling_unordered, the import changed:
    # 300 tasks, each raising with probability 0.05, all come back
    pool = mp.Pool(3, error_handling=True)
    try:
        pool.start_workers()
        pool.wait_until_workers_up()
        assert pool.map(random_error_worker, [i for i in range(300)], chunksize=1) == [i for i in range(300)]
        res = list(pool.imap_unordered(random_error_worker, [i for i in range(300)], chunksize=1))
        res.sort()
        assert res == [i for i in range(300)]
    finally:
        pool.terminate()
        pool.join()


def fail_first(folder, times, kind, i):
    """Raises ``kind`` the first ``times`` times it runs for ``i`` (counted in files: the tries may
    run in any worker), then returns ``i``."""
    path = os.path.join(folder, str(i))
    tries = len(open(path).read()) if os.path.exists(path) else 0
    with open(path, "a") as f:
        f.write("x")
    if tries < times:
        raise kind(f"try {tries + 1} of {i}")
    return i


def test_a_raising_task_runs_again_only_when_asked_and_only_so_often(tmp_path):
    def folder(name):
        (tmp_path / name).mkdir()
        return str(tmp_path / name)
    with mp.Pool(2) as pool:  # multiprocessing's behaviour: the first error fails the map
        plain = folder("plain")
        with pytest.raises(ValueError, match="try 1 of"):
            pool.starmap(fail_first, [(plain, 1, ValueError, i) for i in range(4)])
    with mp.Pool(2, retry_exceptions=KeyError, max_task_retries=2) as pool:
        key = folder("key")
        assert pool.starmap(fail_first, [(key, 2, KeyError, i) for i in range(6)]) == list(range(6))
        assert pool.apply(fail_first, (folder("apply"), 2, KeyError, 7)) == 7
        assert list(pool.imap(functools.partial(fail_first, folder("imap"), 1, KeyError), range(5))) == list(range(5))
        with pytest.raises(ValueError, match="try 1 of 0"):  # not a type it retries
            pool.apply(fail_first, (folder("value"), 1, ValueError, 0))
        with pytest.raises(KeyError, match="try 3 of 0") as caught:  # retried twice, then its error
            pool.apply(fail_first, (folder("many"), 5, KeyError, 0))
        assert "it raised in each of its 3 tries (Pool's max_task_retries=2)" in caught.value.__notes__
    with mp.Pool(2, retry_exceptions=True) as pool:
        assert pool.map(functools.partial(fail_first, folder("any"), 3, OSError), range(4)) == list(range(4))


def test_pool_rejects_fiber_arguments_it_cannot_honour():
    with pytest.raises(ValueError, match="error_handling='yes'"):
        mp.Pool(1, error_handling="yes")
    with pytest.raises(ValueError, match="max_task_crashes=1"):
        mp.Pool(1, error_handling=False, max_task_crashes=5)
    with pytest.raises(ValueError, match="cluster"):
        mp.Pool(1, None, (), None, "my-cluster")
    with pytest.raises(ValueError, match=r"Pool\(retry_exceptions='yes'\): must be True, False, an exception type"):
        mp.Pool(1, retry_exceptions="yes")
    with pytest.raises(ValueError, match=r"Pool\(max_task_retries=0\): must be an int >= 1"):
        mp.Pool(1, retry_exceptions=True, max_task_retries=0)


def test_start_workers_and_wait_until_workers_up():
    with mp.Pool(3) as pool:
        pool.start_workers()
        pool.start_workers()  # already started: nothing to do
        pool.wait_until_workers_up()
        assert pool.statistics().workers_alive == 3
        assert pool.map(abs, [-1, -2]) == [1, 2]
    with pytest.raises(ValueError, match="not running"):
        pool.start_workers()


def test_wait_until_workers_up_times_out():
    with mp.Pool(2) as pool, pytest.raises(mp.TimeoutError, match="of the pool's 2 workers connected"):
        pool.wait_until_workers_up(timeout=0)


# --- fiber.init and fiber.config ------------------------------------------------------------------------
def test_config_attributes_read_current_values_under_fiber_names():
    assert config.backend == "auto" and config.cpu_per_job == 0 and config.debug is False
    updated = mp.init(backend="local", debug=True, cpu_per_job=2, log_level=logging.INFO, default_image="img:1")
    assert set(updated) == {"backend", "log_level", "cpu_per_job", "image"}
    assert (config.backend, config.log_level, config.cpu_per_job, config.image) == ("local", "INFO", 2.0, "img:1")
    assert config.default_image == "img:1" and config.debug is False
    mp.init(debug=True)
    assert config.debug is True and logging.getLogger("fiberrl").level == logging.DEBUG


def test_fiber_settings_without_meaning_are_refused_by_name():
    with pytest.raises(mp.ConfigError, match="'ipc_admin_master_port' has no meaning in fiberrl"):
        mp.init(ipc_admin_master_port=8000)
    with pytest.raises(AttributeError, match="'use_push_queue' has no meaning"):
        _ = config.use_push_queue
    with pytest.raises(mp.ConfigError, match="unknown runtime setting 'nonsense'"):
        mp.init(nonsense=1)


def test_cpu_and_mem_per_job_reach_the_jobspec_of_jobs_without_meta(monkeypatch):
    specs = []

    def record(spec, backend):
        specs.append(spec)
        raise RuntimeError("recorded")

    monkeypatch.setattr("fiberrl.runtime.processes.process.start_job", record)
    mp.init(cpu_per_job=2, mem_per_job=512)
    with pytest.raises(RuntimeError, match="recorded"):
        mp.Process(target=send_authkey, args=(None,)).start()
    with pytest.raises(RuntimeError, match="recorded"):
        mp.Process(target=mp.meta(cpu=1)(send_authkey), args=(None,)).start()
    assert (specs[0].cpu, specs[0].mem) == (2.0, 512)
    assert (specs[1].cpu, specs[1].mem) == (1, 512)  # @meta wins


def log_from_child():
    logging.getLogger("fiberrl").warning("written by the child")


def test_log_file_takes_the_log_of_every_process(tmp_path):
    path = tmp_path / "fiber.log"
    mp.init(log_file=str(path))
    logging.getLogger("fiberrl").warning("written by the parent")
    p = mp.Process(target=log_from_child)
    p.start()
    p.join()
    assert p.exitcode == 0
    text = path.read_text()
    assert "written by the parent" in text and "written by the child" in text


def test_assigning_a_fiber_config_key_sets_the_setting():
    config.cpu_per_job = 3
    config.log_level = logging.WARNING
    assert mp.get_config().cpu_per_job == 3.0 and mp.get_config().log_level == "WARNING"
    with pytest.raises(mp.ConfigError, match="cpu_per_job"):
        config.cpu_per_job = -1
    with pytest.raises(mp.ConfigError, match="'use_push_queue' has no meaning in fiberrl"):
        config.use_push_queue = True
    assert mp.get_config().cpu_per_job == 3.0  # a refused value changes nothing
