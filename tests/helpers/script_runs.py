"""Running an example program as a user would: a script in a fresh interpreter,
in a session of its own, checked for its exit status and for processes it
left behind."""
import os
import signal
import subprocess
import time
from dataclasses import dataclass

import pytest

from conftest import PYTHON, ROOT, wait_until

TIMEOUT = 120


def session_members(sid: int) -> list[int]:
    """Processes, zombies aside, whose session is ``sid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(") ", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry))
    return found


@dataclass
class Run:
    out: str
    err: str
    returncode: int
    seconds: float


def _communicate(proc, timeout: float, name: str) -> tuple[str, str]:
    """``proc``'s stdout and stderr once it ends; past ``timeout`` its session is killed and the test fails."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{name} ran past {timeout} s\nstdout:\n{out}\nstderr:\n{err}")


def run_script(path: str, env: dict, *args: str, returncode: int = 0, quiet: bool = False) -> Run:
    """Run ``path`` from the repository's root in its own session: check its exit status, that
    it wrote nothing on stderr (``quiet``) and that it left no process behind."""
    name = os.path.basename(path)
    start = time.monotonic()
    proc = subprocess.Popen([PYTHON, path, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = _communicate(proc, TIMEOUT, name)
    seconds = time.monotonic() - start
    left = [] if wait_until(lambda: not session_members(proc.pid), 10) else session_members(proc.pid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == returncode, f"{name} exited with {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    if quiet:
        assert err == "", f"{name} wrote on stderr:\n{err}\nstdout:\n{out}"
    assert not left, f"{name} left processes running after it ended: {left}"
    return Run(out, err, proc.returncode, seconds)


def run_sweep(args, cwd, env=None, timeout=180, wait=True):
    """A Hydra sweep (``python <args>``) in its own session: (exit status, stdout, stderr), checked to leave
    no process behind; with ``wait=False``, the Popen."""
    # Ctrl-C as a terminal delivers it: pytest run in the background of a shell inherits SIGINT ignored,
    # and Python then leaves it ignored in the sweep
    proc = subprocess.Popen([PYTHON, *args], cwd=cwd, env={**os.environ, **(env or {})}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if not wait:
        return proc
    out, err = _communicate(proc, timeout, "the sweep")
    assert wait_until(lambda: not session_members(proc.pid), 15), "the sweep left processes running"
    return proc.returncode, out, err
