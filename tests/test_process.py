"""Job-backed Process on the local backend: lifecycle, exit codes, spawn semantics."""
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import fiberrl.runtime as mp
from conftest import wait_until

pytestmark = pytest.mark.slow  # the tests here start processes


def sleeper(seconds):
    time.sleep(seconds)


def exits_with(code):
    raise SystemExit(code)


def raises():
    raise KeyError("no such thing")


def report_identity(q):
    me = mp.current_process()
    q.put((me.name, me.pid, os.getpid(), me.daemon, mp.parent_process().pid))


class Doubler(mp.Process):
    def __init__(self, q, x):
        super().__init__()
        self.q, self.x = q, x

    def run(self):
        self.q.put(self.x * 2)


def test_lifecycle_and_exitcode():
    p = mp.Process(target=sleeper, args=(0.3,), name="napper")
    assert p.name == "napper" and p.pid is None and p.exitcode is None and not p.is_alive()
    p.start()
    assert p.pid and p.is_alive() and p in mp.active_children()
    p.join(timeout=0.01)
    assert p.is_alive() and p.exitcode is None
    p.join(timeout=30)
    assert not p.is_alive() and p.exitcode == 0
    assert p not in mp.active_children()
    with pytest.raises(AssertionError):
        p.start()


@pytest.mark.parametrize("code", [0, 3, 17])
def test_sys_exit_code(code):
    p = mp.Process(target=exits_with, args=(code,))
    p.start()
    p.join(30)
    assert p.exitcode == code


def test_terminate_and_kill_give_signal_exitcodes():
    a = mp.Process(target=sleeper, args=(60,))
    b = mp.Process(target=sleeper, args=(60,))
    a.start(), b.start()
    assert wait_until(lambda: a.is_alive() and b.is_alive(), 10)
    time.sleep(0.5)  # let both reach the target
    a.terminate()
    b.kill()
    a.join(30), b.join(30)
    assert a.exitcode == -signal.SIGTERM
    assert b.exitcode == -signal.SIGKILL


def test_lambda_and_closure_targets():
    q = mp.Queue()
    offset = 40

    def closure(x):
        q.put(x + offset)

    procs = [mp.Process(target=lambda: q.put("lambda")), mp.Process(target=closure, args=(2,))]
    for p in procs:
        p.start()
    got = {q.get(timeout=30), q.get(timeout=30)}
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert got == {"lambda", 42}


def test_subclass_run_and_identity():
    q = mp.Queue()
    d = Doubler(q, 21)
    d.start()
    assert q.get(timeout=30) == 42
    d.join(30)
    p = mp.Process(target=report_identity, args=(q,), name="who", daemon=True)
    p.start()
    name, pid_seen, os_pid, daemon, parent_pid = q.get(timeout=30)
    p.join(30)
    assert (name, daemon, parent_pid) == ("who", True, os.getpid())
    assert pid_seen == os_pid == p.pid


FAILING_SCRIPT = """
import fiberrl.runtime as mp

def raises():
    raise KeyError("no such thing")

if __name__ == "__main__":
    p = mp.Process(target=raises, name="faulty")
    p.start()
    p.join(30)
    print("exitcode", p.exitcode)
"""


def test_child_exception_exits_nonzero_and_its_traceback_reaches_the_terminal_once(tmp_path):
    """As multiprocessing: "Process <name>:" and the traceback on the child's
    stderr, which is the terminal the program was started from."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert "exitcode 1" in done.stdout
    assert done.stderr.count("KeyError: 'no such thing'") == 1, done.stderr
    assert "Process faulty:\nTraceback (most recent call last):" in done.stderr


def test_unpicklable_target_is_a_clear_error_at_start():
    import threading
    lock = threading.Lock()
    p = mp.Process(target=print, args=(lock,))
    with pytest.raises(TypeError, match="cannot send"):
        p.start()
    assert mp.active_children() == []


def test_main_process_and_cpu_count():
    me = mp.current_process()
    assert me.name == "MainProcess" and me.pid == os.getpid()
    assert mp.parent_process() is None
    assert mp.cpu_count() == os.cpu_count()


def test_close_refuses_running_process():
    p = mp.Process(target=sleeper, args=(60,))
    p.start()
    with pytest.raises(ValueError):
        p.close()
    p.kill()
    p.join(30)
    p.close()
    with pytest.raises(ValueError):
        p.is_alive()


def test_target_that_cannot_be_loaded_in_the_child_is_reported(tmp_path, caplog, monkeypatch):
    import shutil
    module = tmp_path / "vanishing_module.py"
    module.write_text("def target():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import vanishing_module
    caplog.set_level(logging.ERROR, logger="fiberrl")
    p = mp.Process(target=vanishing_module.target, name="orphaned-target")
    module.unlink()  # pickled by reference here, but the child cannot import it any more
    shutil.rmtree(tmp_path / "__pycache__", ignore_errors=True)
    p.start()
    p.join(30)
    assert p.exitcode == 1
    assert wait_until(lambda: "could not load its target" in caplog.text, 10), caplog.text


def waits_for_a_thread(evt):
    def late():
        time.sleep(0.5)
        evt.set()
    threading.Thread(target=late).start()
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()


def test_a_child_waits_for_its_non_daemonic_threads_before_it_ends():
    from fiberrl.runtime.primitives.synchronize import shutdown_manager
    try:
        evt = mp.Event()
        p = mp.Process(target=waits_for_a_thread, args=(evt,))
        p.start()
        p.join(30)
        assert p.exitcode == 0 and evt.is_set()
    finally:
        shutdown_manager()  # the event's: the suite checks each test leaves no process


def fails_into(path):
    sys.stderr = open(path, "w")
    1 / 0  # MARKER


def breaks_its_streams(stream_name, exit_with):
    setattr(sys, stream_name, None)
    if exit_with is not None:
        sys.exit(exit_with)


def test_a_childs_failure_is_printed_on_its_own_stderr_and_broken_streams_do_not_fail_it(tmp_path):
    path = tmp_path / "stderr.txt"
    p = mp.Process(target=fails_into, args=(str(path),))
    p.start()
    p.join(30)
    assert p.exitcode == 1
    assert "1 / 0  # MARKER" in path.read_text() and "ZeroDivisionError" in path.read_text()
    for stream_name in ("stdout", "stderr"):
        for exit_with, code in ((None, 0), ("a message", 1)):
            p = mp.Process(target=breaks_its_streams, args=(stream_name, exit_with))
            p.start()
            p.join(30)
            assert p.exitcode == code


def sends_its_parent(conn):
    import multiprocessing
    theirs, ours = multiprocessing.parent_process(), mp.parent_process()
    conn.send((theirs is ours, theirs.pid, theirs.name, theirs.is_alive()))


def test_parent_process_in_a_child_as_multiprocessing_module_gives_it():
    receiver, sender = mp.Pipe(duplex=False)
    p = mp.Process(target=sends_its_parent, args=(sender,))
    p.start()
    assert receiver.recv() == (True, os.getpid(), mp.current_process().name, True)
    p.join(30)


class Target:
    def __call__(self, *args):
        pass


def test_a_started_process_lets_go_of_its_target_and_arguments():
    import gc
    import weakref
    target = Target()
    gone = weakref.ref(target)
    p = mp.Process(target=target, args=(target,))
    del target
    p.start()
    p.join(30)
    gc.collect()
    assert gone() is None


LOKY_LIKE = """
import multiprocessing, multiprocessing.context
import fiberrl.runtime as mp

# as loky does in a joblib worker: a start method of its own, registered and chosen in this process only
class OwnContext(multiprocessing.context.SpawnContext):
    _name = "own"
multiprocessing.context._concrete_contexts["own"] = OwnContext()
multiprocessing.set_start_method("own", force=True)

def child(q):
    q.put("ran")

if __name__ == "__main__":
    q = mp.SimpleQueue()
    p = mp.Process(target=child, args=(q,))
    p.start()
    p.join()
    print(p.exitcode)
    if p.exitcode == 0:
        print(q.get())
"""


def test_a_process_started_where_another_library_chose_its_own_start_method_runs(tmp_path):
    # a sweep run by hydra-joblib-launcher starts fiberrl processes from a loky worker
    script = tmp_path / "loky_like.py"
    script.write_text(LOKY_LIKE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["0", "ran"], done.stderr
