"""Starts local jobs by forking a process that has already imported the
runtime, instead of a fresh interpreter per job.

A fresh interpreter spends ~0.1 s of CPU importing the runtime before a job
does anything; on 2 cores 256 pool workers took 25 s to start.  The fork
server imports it once, stays single-threaded (so forking it is safe), and
for each job forks a child that takes the job's environment, working
directory and this process's current stdin/stdout/stderr (passed with the
request, so redirections made after the server started are honoured), then
runs the job as ``python -c CHILD_COMMAND`` would.  It reaps its children and
reports their exit codes.  Jobs whose command or Python path differ from the
server's start as fresh interpreters.

Before its first fork the server also imports the parent's main module as
``__mp_main__``, as each job would on its own (what ``multiprocessing``'s
forkserver does), and before each fork the modules named with
:func:`set_forkserver_preload`, so the jobs inherit them and what they
import: a script importing torch costs each job ~1.7 s of CPU otherwise,
ES's workers ~0.36 s of numpy and gymnasium.  A main module that starts
threads or the runtime when imported (a module-level ``Queue`` or
``Manager``, not under ``if __name__ == "__main__"``) would leave the server
unsafe to fork from (a fork copies its threads' locks in whatever state they
are in), and every job with the server's hub and a secret of its own: the
server then starts afresh without it, and each job imports the main module
itself.
"""
from __future__ import annotations

import gc
import importlib
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading

from .. import env_names
from ..backends import local
from ..net import auth
from .main_module import import_parents_main, preparation_data

_MESSAGE = 1 << 20
_SOCKET_ENV = env_names.FORK_SERVER_FD
_WITHOUT_MAIN_ENV = env_names.FORK_SERVER_WITHOUT_MAIN  # set when the server starts afresh
SERVER_COMMAND = [sys.executable, "-c", "from fiberrl.runtime.processes.fork_server import serve; serve()"]
_preload_modules: list[str] = []


def set_forkserver_preload(module_names) -> None:
    """Modules for the fork server to import before it forks the next local
    jobs, so that they inherit them imported (``multiprocessing``'s function of
    the same name).  A module that cannot be imported there is skipped: the
    job imports it itself, and reports what went wrong."""
    if isinstance(module_names, str) or not all(isinstance(name, str) for name in module_names):
        raise TypeError(f"set_forkserver_preload takes a list of module names, not {module_names!r}")
    _preload_modules[:] = module_names


class ForkedProcess:
    """What ``subprocess.Popen`` offers the local backend, for a forked job."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self.lost: str | None = None  # why it ended with the server, if it did
        self._exited = threading.Event()

    def _set_exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"job {self.pid}", timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


class ForkServer:
    """This process's link to its fork server (started on first use)."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, **{_SOCKET_ENV: str(theirs.fileno())})
        self._server = subprocess.Popen(SERVER_COMMAND, env=env, pass_fds=[theirs.fileno()],
                                        stdin=subprocess.DEVNULL, close_fds=True)
        theirs.close()
        self._sock = ours
        try:
            self._sock.send(pickle.dumps(preparation_data("fiberrl-fork-server"), protocol=5))
        except OSError:  # the server died as it started (killed with this process's other descendants)
            ours.close()
            self._server.kill()
            self._server.wait()
            raise
        self.python_path = os.environ.get("PYTHONPATH", "")
        self.owner_pid = os.getpid()  # a forked copy of this process must start its own
        self._lock = threading.Lock()  # one request at a time: the pid reply follows its request
        self._started = threading.Condition(threading.Lock())
        self._new: list[ForkedProcess] = []  # started, not yet handed to the requester
        self._jobs: dict[int, ForkedProcess] = {}  # running
        self.alive = True
        self._reader = threading.Thread(target=self._read, name="fiberrl-fork-server", daemon=True)
        self._reader.start()

    def close(self) -> None:
        """Stop the server and its reader thread; jobs still running die with the server."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.join(10)

    def start(self, env: dict, cwd: str) -> ForkedProcess:
        request = pickle.dumps((env, cwd, list(_preload_modules)), protocol=5)
        fds, opened = _standard_fds()
        try:
            with self._lock, self._started:
                if not self.alive:
                    raise OSError("the fork server is gone")
                socket.send_fds(self._sock, [request], fds)
                while not self._new and self.alive:
                    self._started.wait()
                if not self._new:
                    raise OSError("the fork server is gone")
                return self._new.pop(0)
        finally:
            for fd in opened:
                os.close(fd)

    def _read(self) -> None:
        while True:
            try:
                message = self._sock.recv(_MESSAGE)
            except OSError:
                message = b""
            if not message:
                break
            kind, pid, code = pickle.loads(message)  # from our own child, over a private socketpair
            with self._started:
                if kind == "started":
                    self._jobs[pid] = job = ForkedProcess(pid)
                    self._new.append(job)
                    self._started.notify_all()
                elif pid in self._jobs:
                    self._jobs.pop(pid)._set_exit(code)
        with self._started:
            self.alive = False
            self._started.notify_all()
            jobs, self._jobs = list(self._jobs.values()), {}
        for job in jobs:  # the kernel killed them with the server (PR_SET_PDEATHSIG)
            job.lost = "killed with the local fork server"
            job._set_exit(-signal.SIGKILL)
        self._sock.close()
        self._server.wait()


def _standard_fds() -> tuple[list[int], list[int]]:
    """This process's stdin, stdout and stderr for a job; /dev/null for any closed."""
    fds, opened = [], []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            fd = os.open(os.devnull, os.O_RDWR)
            opened.append(fd)
        fds.append(fd)
    return fds, opened


def serve() -> None:
    """The fork server's loop: fork a job per request, report exits."""
    sock = socket.socket(fileno=int(os.environ.pop(_SOCKET_ENV)))
    import fiberrl.runtime.processes.child  # noqa: F401 -- what every job imports first, done once here
    if not os.environ.pop(_WITHOUT_MAIN_ENV, None):
        message = sock.recv(_MESSAGE)
        if not message:  # the parent is gone already
            os._exit(0)
        _preload(pickle.loads(message))
        if threading.active_count() > 1 or auth.secret_known():
            _start_afresh_without_main(sock)

    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the job's parent to handle
    try:
        _serve(sock, wake_read, wake_write)
    except OSError:  # the parent is gone (its socket closed or reset)
        pass
    os._exit(0)  # the jobs still running die with this process


def _preload(prep: dict) -> None:
    """Import the parent's main module as each job would, so that jobs find it imported."""
    try:
        import_parents_main(prep)
    except BaseException:  # noqa: BLE001 -- each job imports it again and reports the error itself
        pass


def _start_afresh_without_main(sock: socket.socket) -> None:
    """Replace this process with a fresh server that does not import the main
    module: importing it started threads or the runtime, which forked jobs
    cannot inherit (locks their threads held at the fork, a hub and a secret
    that are not theirs)."""
    os.set_inheritable(sock.fileno(), True)
    env = dict(os.environ, **{_SOCKET_ENV: str(sock.fileno()), _WITHOUT_MAIN_ENV: "1"})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, SERVER_COMMAND, env)


def _import(modules: list[str]) -> None:
    for name in modules:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 -- the job imports it again and reports the error itself
                pass


def _serve(sock: socket.socket, wake_read: int, wake_write: int) -> None:
    while True:
        ready, _, _ = select.select([sock, wake_read], [], [])
        if wake_read in ready:
            try:
                os.read(wake_read, 4096)
            except OSError:
                pass
        _reap(sock)
        if sock in ready:
            message, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 3)
            if not message:
                return
            env, cwd, modules = pickle.loads(message)
            _import(modules)
            # what the server has imported stays out of the jobs' collections: a collection
            # writes to every object it looks at, and each page it writes becomes the job's own
            gc.freeze()
            server_pid = os.getpid()
            pid = os.fork()
            if pid == 0:
                try:
                    _die_with(server_pid)
                    _run_job(env, cwd, fds, [sock.fileno(), wake_read, wake_write])
                finally:
                    os._exit(1)  # never back into the server's loop
            for fd in fds:
                os.close(fd)
            sock.send(pickle.dumps(("started", pid, None)))


def _die_with(server_pid: int) -> None:
    """Have the kernel kill this job if the server dies: a job whose exit no one
    can report would otherwise look dead to its parent while still running."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != server_pid:  # it died before that took effect
        os._exit(1)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(pickle.dumps(("exited", pid, os.waitstatus_to_exitcode(status))))


def _run_job(env: dict, cwd: str, fds: list[int], server_fds: list[int]) -> None:
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in server_fds:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        from fiberrl.runtime.processes.child import main
        main()
    except SystemExit as exc:
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)


def install() -> None:
    """Make the fork server the local backend's way to start jobs of the child
    command (the API calls it as it loads: ``fiberrl.runtime``)."""
    local.install_fork_server(ForkServer)
