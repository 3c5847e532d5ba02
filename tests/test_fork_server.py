"""Local jobs forked from a fork server: the job's own environment, working
directory and terminal; exit codes; the server's loss; and the fallbacks."""
import os
import signal
import sys
import time

import pytest

import fiberrl.runtime as mp
from conftest import pid_alive, wait_until
from fiberrl.runtime.config import reset

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sys.platform != "linux", reason="the fork server runs on Linux only"),
              pytest.mark.usefixtures("fork_server_deaths_forgotten")]  # the tests here kill it or need it


@pytest.fixture(autouse=True)
def fresh_config():
    reset()
    yield
    reset()


def report(q):
    q.put((os.getpid(), os.getppid(), os.getcwd(), os.environ.get("FIBERRL_TEST_LATE")))


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def run_report(q):
    p = mp.Process(target=report, args=(q,))
    p.start()
    result = q.get(timeout=60)
    p.join(30)
    assert p.exitcode == 0
    return result


def test_a_job_has_its_own_environment_and_directory(tmp_path, monkeypatch):
    q = mp.Queue()
    first = run_report(q)  # starts the server
    assert first[1] != os.getpid(), "not forked from the fork server"
    server = first[1]
    # set after the server started: the job must still see them
    monkeypatch.setenv("FIBERRL_TEST_LATE", "late")
    monkeypatch.chdir(tmp_path)
    pid, ppid, cwd, late = run_report(q)
    assert ppid == server
    assert cwd == str(tmp_path) and late == "late"


def exit_with(code):
    sys.exit(code)


def sleep_forever():
    time.sleep(600)


def test_exit_codes_and_signals_of_forked_jobs():
    codes = []
    for code in (0, 3):
        p = mp.Process(target=exit_with, args=(code,))
        p.start()
        p.join(30)
        codes.append(p.exitcode)
    p = mp.Process(target=sleep_forever)
    p.start()
    time.sleep(0.2)
    p.terminate()
    p.join(30)
    codes.append(p.exitcode)
    assert codes == [0, 3, -signal.SIGTERM]


def print_line(text):
    print(text, flush=True)
    os.write(2, f"{text} on stderr\n".encode())


def test_a_job_prints_where_this_process_prints_now(capfd):
    with capfd.disabled():  # a server started now holds the terminal, not the capture
        p = mp.Process(target=exit_with, args=(0,))
        p.start()
        p.join(30)
    p = mp.Process(target=print_line, args=("hello from a forked job",))
    p.start()
    p.join(30)
    out, err = capfd.readouterr()
    assert "hello from a forked job" in out and "hello from a forked job on stderr" in err


def test_jobs_die_with_a_killed_fork_server_and_a_pool_replaces_them():
    with mp.Pool(2) as pool:
        assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
        workers = [p for p in mp.active_children() if p.name.startswith("PoolWorker")]
        server = parent_of(workers[0].pid)
        assert server != os.getpid()
        os.kill(server, signal.SIGKILL)
        assert wait_until(lambda: not any(pid_alive(w.pid) for w in workers), 30), "jobs outlived their server"
        assert all(w.exitcode == -signal.SIGKILL for w in workers)
        assert pool.map(abs, range(-20, 0)) == list(range(20, 0, -1))  # replacements, from a new server
        # the second loss may still be on its way through the pool when the map is done
        assert wait_until(lambda: pool.statistics().worker_restarts >= 2, 30), pool.statistics()


def test_fresh_interpreters_when_switched_off_or_when_the_python_path_differs(monkeypatch):
    q = mp.Queue()
    mp.configure(local_fork_server=False)
    assert run_report(q)[1] == os.getpid()
    reset()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), "/nonexistent"])))
    assert run_report(q)[1] == os.getpid()



def test_a_fork_server_that_dies_as_it_starts_leaves_its_job_to_a_fresh_interpreter(monkeypatch):
    """A kill storm reaches every descendant, a fork server as it starts too: the job it was started
    for runs as a fresh interpreter, and the next job starts another server (this failed the start,
    and with it a whole pool, with 'Broken pipe')."""
    from fiberrl.runtime.backends import get_backend
    from fiberrl.runtime.processes import fork_server
    get_backend("local").cleanup(None)  # no server yet: the next job starts one
    real = fork_server.preparation_data

    def once_the_server_is_gone(name):
        time.sleep(1.0)  # the server below exits at once
        return real(name)
    monkeypatch.setattr(fork_server, "SERVER_COMMAND", [sys.executable, "-c", "pass"])
    monkeypatch.setattr(fork_server, "preparation_data", once_the_server_is_gone)
    q = mp.Queue()
    assert run_report(q)[1] == os.getpid()
    monkeypatch.undo()
    assert run_report(q)[1] != os.getpid()  # forked from a server that started


def pool_workers() -> list:
    return [p for p in mp.active_children() if p.name.startswith("PoolWorker") and pid_alive(p.pid)]


def test_a_fork_server_that_keeps_dying_rests_while_jobs_start_as_fresh_interpreters(
        caplog, fork_server_deaths_forgotten):
    """Each death of the server takes every job it forked: killed every 0.25 s, it took a pool's
    workers each time before they finished a task, and a map of 500 went on for 300 s.  Five deaths
    within a minute rest it for a minute, its jobs fresh interpreters; after that it starts again."""
    from fiberrl.runtime.backends import local
    with mp.Pool(2) as pool:
        for death in range(local.FORK_SERVER_DEATHS):
            assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
            workers = pool_workers()
            servers = {parent_of(w.pid) for w in workers} - {os.getpid()}
            assert servers, f"no worker forked from a server before its death {death + 1}"
            for server in servers:
                os.kill(server, signal.SIGKILL)
            assert wait_until(lambda: not any(pid_alive(w.pid) for w in workers), 30), "jobs outlived their server"
        assert pool.map(abs, range(-20, 0)) == list(range(20, 0, -1))
        assert wait_until(lambda: len(pool_workers()) == 2, 30)
        assert {parent_of(w.pid) for w in pool_workers()} == {os.getpid()}, "forked from a server at rest"
    assert f"the local fork server died {local.FORK_SERVER_DEATHS} times within 60 s" in caplog.text
    assert fork_server_deaths_forgotten._fork_server_rests_until > time.monotonic()
    fork_server_deaths_forgotten._fork_server_rests_until = time.monotonic()  # as a minute later
    assert run_report(mp.Queue())[1] != os.getpid(), "the server did not start again after its rest"


MAIN_SCRIPT = '''
import os, sys
with open(os.environ["IMPORTS_LOG"], "a") as log:  # every import of this module, by which process
    log.write(f"{os.getpid()} {__name__}\\n")
import fiberrl.runtime as mp


def where(_):
    return os.getpid(), __name__


if __name__ == "__main__":
    with mp.Pool(3) as pool:
        print(sorted(set(pool.map(where, range(30), chunksize=1))))
'''


def test_the_main_module_is_imported_once_by_the_server_not_by_every_job(tmp_path):
    import subprocess
    script, log = tmp_path / "main_script.py", tmp_path / "imports.log"
    script.write_text(MAIN_SCRIPT)
    env = dict(os.environ, IMPORTS_LOG=str(log), PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    imports = [line.split() for line in log.read_text().splitlines()]
    workers = {pid for pid, _ in eval(out.stdout)}
    assert imports[0][1] == "__main__" and len(workers) >= 1
    # the parent ran it as __main__, the fork server as __mp_main__; the workers found it imported
    assert [name for _, name in imports] == ["__main__", "__mp_main__"]
    assert not workers & {int(pid) for pid, _ in imports}



STDIN_SCRIPT = '''
import fiberrl.runtime as mp


def double(x):
    return 2 * x


with mp.Pool(2) as pool:
    print(pool.map(double, [1, 2, 3]))
for server in (True, False):
    mp.configure(local_fork_server=server)
    job = mp.Process(target=double, args=(1,))
    job.start()
    job.join()
    print(job.exitcode)
'''


@pytest.mark.parametrize("how", ["stdin", "-c"])
def test_a_script_without_a_file_runs_its_pool_and_jobs(how):
    """``python - < script`` (its main is "<stdin>", no file to import again) and
    ``python -c``: the jobs do without the main module; functions travel by value."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    args, stdin = ([sys.executable, "-"], STDIN_SCRIPT) if how == "stdin" else \
        ([sys.executable, "-c", STDIN_SCRIPT], "")
    out = subprocess.run(args, input=stdin, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["[2, 4, 6]", "0", "0"], out.stdout + out.stderr

PRELOADED_MODULE = '''
import os
with open(os.environ["IMPORTS_LOG"], "a") as log:
    log.write(f"{os.getpid()}\\n")
'''

PRELOADING_SCRIPT = '''
import os, sys
import fiberrl.runtime as mp


def imported_before_the_task(_):
    return os.getpid(), "heavy_module" in sys.modules


if __name__ == "__main__":
    mp.set_forkserver_preload(["heavy_module", "no_such_module"])  # the missing one is skipped
    with mp.Pool(2) as pool:
        print(sorted(set(pool.map(imported_before_the_task, range(20), chunksize=1))))
'''


def test_preloaded_modules_are_imported_by_the_server_before_it_forks(tmp_path):
    import subprocess
    (tmp_path / "heavy_module.py").write_text(PRELOADED_MODULE)
    script, log = tmp_path / "preloading.py", tmp_path / "imports.log"
    script.write_text(PRELOADING_SCRIPT)
    env = dict(os.environ, IMPORTS_LOG=str(log), PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    workers = eval(out.stdout)
    assert workers and all(imported for _, imported in workers)
    importers = log.read_text().split()
    assert len(importers) == 1 and int(importers[0]) not in {pid for pid, _ in workers}


def test_preload_takes_module_names():
    with pytest.raises(TypeError, match="list of module names"):
        mp.set_forkserver_preload("numpy")


UNGUARDED_SCRIPT = '''
import fiberrl.runtime as mp

mp.configure(local_fork_server={server})


def double(x):
    return 2 * x


job = mp.Process(target=double, args=(1,))
job.start()
job.join()
print("exit code", job.exitcode)
'''


@pytest.mark.parametrize("server", [True, False])
def test_a_script_that_starts_jobs_unguarded_is_told_where_and_how_to_fix_it(tmp_path, server):
    """Every job imports its parent's main module; one that starts processes
    there would start them again in every job (and, before, the fork server
    ran the whole script).  The job refuses, naming the line."""
    import subprocess
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT.format(server=server))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "exit code 1\n", (out.stdout, out.stderr)
    assert f"cannot run: {script}, line 12: a process was started while a job imported its parent's main " \
           f"module" in out.stderr, out.stderr
    assert 'under `if __name__ == "__main__":`' in out.stderr and "Traceback" not in out.stderr


MODULE_LEVEL_QUEUE_SCRIPT = '''
import fiberrl.runtime as mp

results = mp.Queue()  # made again by every job that imports this module: the job's own


def work(out):
    inner = mp.Queue()
    inner.put(3)
    out.put(inner.get(timeout=30) * 2)


if __name__ == "__main__":
    job = mp.Process(target=work, args=(results,))
    job.start()
    print(results.get(timeout=60))
    job.join()
    with mp.Pool(2) as pool:
        print(pool.map(abs, [-1, -2]), job.exitcode)
'''


def test_a_main_module_that_starts_the_runtime_when_imported_still_runs_its_jobs(tmp_path):
    """A module-level Queue starts the runtime (hub, nng threads, a secret of its
    own) in whatever imports the module, the fork server included; jobs forked
    from there could not reach their parent.  The server starts afresh without it."""
    import subprocess
    script = tmp_path / "module_level_queue.py"
    script.write_text(MODULE_LEVEL_QUEUE_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "6\n[1, 2] 0\n", (out.stdout, out.stderr)


def freeze_count(_):
    import gc
    return gc.get_freeze_count()


def test_a_job_starts_with_what_the_server_imported_frozen_out_of_its_collections():
    """gc.freeze() before each fork: a collection in the job writes to every object it
    looks at, which made the server's pages the job's own (ES BipedalWalker workers:
    24 MiB of their own each, 17.5 MiB frozen)."""
    with mp.Pool(1) as pool:
        assert pool.map(freeze_count, [0])[0] > 1000
