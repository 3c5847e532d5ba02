"""No orphans: children die with their parent; normal exit cleans up."""
import os
import signal
import subprocess
import textwrap
import time

import pytest

from conftest import PYTHON, pid_alive, wait_until

pytestmark = pytest.mark.slow  # the tests here start processes

KILLED_PARENT = textwrap.dedent("""
    import os, sys, time
    import fiberrl.runtime as mp

    def grandchild():
        time.sleep(600)

    def child(q):
        g = mp.Process(target=grandchild)
        g.start()
        q.put(os.getpid())
        q.put(g.pid)
        time.sleep(600)

    if __name__ == "__main__":
        q = mp.Queue()
        kids = [mp.Process(target=child, args=(q,), daemon=(i % 2 == 0)) for i in range(3)]
        for k in kids:
            k.start()
        pids = [q.get(timeout=60) for _ in range(6)]
        print(" ".join(map(str, pids)), flush=True)
        time.sleep(600)
""")

NORMAL_EXIT = textwrap.dedent("""
    import atexit, os, socket, threading, time

    def check_after_runtime_cleanup():
        # registered before fiberrl is used, so it runs after fiberrl's own exit hooks
        import fiberrl.runtime.processes.hub as hub
        assert hub.current_hub() is None, "hub still open at exit"
        names = [t.name for t in threading.enumerate() if t.name.startswith("fiberrl")]
        assert not names, f"threads left: {names}"
        host, port = ADDRESS[0].removeprefix("tcp://").partition("/")[0].rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            raise AssertionError("hub port still accepts connections")
        except ConnectionRefusedError:
            pass
        print("CLEAN", flush=True)

    ADDRESS = []
    atexit.register(check_after_runtime_cleanup)

    import fiberrl.runtime as mp

    def worker(q):
        q.put(os.getpid())
        time.sleep(0.5)

    def lingerer(q):
        q.put(os.getpid())
        time.sleep(600)

    if __name__ == "__main__":
        q = mp.Queue()
        ADDRESS.append(q._ref.address)
        a = mp.Process(target=worker, args=(q,))              # joined at exit
        b = mp.Process(target=lingerer, args=(q,), daemon=True)  # terminated at exit
        a.start(); b.start()
        print(q.get(timeout=60), q.get(timeout=60), flush=True)
""")


def test_sigkill_of_parent_leaves_no_child_alive(tmp_path, script_env):
    script = tmp_path / "killed_parent.py"
    script.write_text(KILLED_PARENT)
    parent = subprocess.Popen([PYTHON, str(script)], env=script_env, stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        pids = [int(x) for x in line.split()]
        assert len(pids) == 6, line
        assert all(pid_alive(p) for p in pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        killed_at = time.monotonic()
        assert wait_until(lambda: not any(pid_alive(p) for p in pids), 5.0), \
            f"alive 5 s after the parent died: {[p for p in pids if pid_alive(p)]}"
        print(f"all 6 descendants gone {time.monotonic() - killed_at:.2f} s after SIGKILL")
    finally:
        parent.kill()
        for p in locals().get("pids", []):
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)


def test_normal_exit_joins_terminates_and_closes_everything(tmp_path, script_env):
    script = tmp_path / "normal_exit.py"
    script.write_text(NORMAL_EXIT)
    done = subprocess.run([PYTHON, str(script)], env=script_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pids = [int(x) for x in done.stdout.splitlines()[0].split()]
    assert "CLEAN" in done.stdout, done.stdout + done.stderr
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), 5.0)


HUNG_PARENT = textwrap.dedent("""
    import time
    import fiberrl.runtime as mp

    def child(q):
        q.put("running")
        time.sleep(600)

    if __name__ == "__main__":
        q = mp.Queue()
        c = mp.Process(target=child, args=(q,))
        c.start()
        q.get(timeout=60)
        print(c.pid, flush=True)
        time.sleep(600)
""")


def test_a_hung_parent_is_caught_by_the_heartbeat(tmp_path, script_env):
    # a stopped parent keeps its sockets open: only the heartbeat can tell
    script = tmp_path / "hung_parent.py"
    script.write_text(HUNG_PARENT)
    env = dict(script_env, FIBERRL_HEARTBEAT_INTERVAL="0.5", FIBERRL_HEARTBEAT_TIMEOUT="1.5")
    parent = subprocess.Popen([PYTHON, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        parent.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        assert wait_until(lambda: not pid_alive(child), 10.0), "the child outlived a hung parent by 10 s"
        print(f"child gone {time.monotonic() - stopped_at:.2f} s after its parent stopped answering")
    finally:
        parent.kill()
        parent.send_signal(signal.SIGCONT)
        parent.wait(10)
        if child is not None and pid_alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_child_beats_as_often_as_its_parent_listens():
    """Four times in silence_timeout where the parent listens for silence; on the local backend, where
    it does not, only the answered beats that tell the child its parent lives; or as configured."""
    from fiberrl.runtime import config
    from fiberrl.runtime.processes.lifeline import beat_interval
    try:
        config.configure(backend="local", heartbeat_timeout=30)
        assert beat_interval() == 7.5
        config.configure(backend="docker", silence_timeout=10)
        assert beat_interval() == 2.5
        config.configure(silence_timeout=0)
        assert beat_interval() == 7.5
        config.configure(heartbeat_interval=0.5)
        assert beat_interval() == 0.5
    finally:
        config.reset()


def test_a_local_child_is_quiet_between_its_answered_beats():
    import fiberrl.runtime as mp
    process = mp.Process(target=time.sleep, args=(4,))
    process.start()
    try:
        assert wait_until(lambda: process.silent_for() is not None, 30)
        time.sleep(3)
        assert process.silent_for() > 2.5  # heard as it fetched its task, not since
    finally:
        process.join(30)
