"""Job-backed ``Process`` with the ``multiprocessing`` API.

``start()`` hands the backend a JobSpec whose command starts a fresh Python
(spawn semantics); the child connects back to this process's hub, proves it
holds the run's secret, fetches its pickled ``Process`` object (cloudpickle,
so lambdas and closures work), re-imports ``__main__`` as multiprocessing's
spawn does, and runs ``run()``.
"""
from __future__ import annotations

import atexit
import itertools
import logging
import multiprocessing.process
import os
import pickle
import threading
import time
import uuid
from multiprocessing.process import AuthenticationString

from .. import env_names
from ..backends import OWNER, JobSpec, JobStatus, get_backend, resolve_name, start_job
from ..backends.base import CHILD_COMMAND
from ..config import get_config, serialize
from ..meta import resources_of
from ..net import auth, wire
from . import children
from .handover import handing_over
from .hub import get_hub
from .main_module import check_not_importing_main, preparation_data
from .output import FORWARD_OUTPUT_ENV
from .resource_tracking import TRACKER_ENV, describe_for_children

PARENT_ADDRESS_ENV = env_names.PARENT_ADDRESS
PROCESS_ID_ENV = env_names.PROCESS_ID
CONFIG_ENV = env_names.RESOLVED_CONFIG

log = logging.getLogger("fiberrl")
_sentinels_lock = threading.Lock()
_exit_hook_registered = False


class BaseProcess:
    """What every process object answers, the main one included."""

    _identity: tuple = ()
    _name = "MainProcess"
    _daemon = False
    _parent_pid: int | None = None
    _authkey: bytes | None = None

    @property
    def authkey(self) -> bytes:
        """multiprocessing's key (API compatibility only: fiberrl authenticates with the
        run's secret, never with this).  A child inherits its parent's; the main
        process draws a random one on first use."""
        if self._authkey is None:
            self._authkey = os.urandom(32)
        return AuthenticationString(self._authkey)

    @authkey.setter
    def authkey(self, value) -> None:
        # kept as plain bytes so that the process object still pickles for its child
        self._authkey = bytes(value)

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = str(value)

    @property
    def daemon(self) -> bool:
        return self._daemon

    @property
    def ident(self):
        return self.pid


class _MainProcess(BaseProcess):
    @property
    def pid(self) -> int:
        return os.getpid()

    def is_alive(self) -> bool:
        return True  # the process asking is this one

    @property
    def exitcode(self) -> None:
        return None  # it is running

    def __repr__(self):
        return f"<_MainProcess name={self._name!r} pid={self.pid}>"


class Process(BaseProcess):
    _counter = itertools.count(1)
    _resources: dict | None = None  # set by a Pool for its workers
    _stop_after_children = None  # how to stop a child that serves the others, at exit (stop_children)

    def __init__(self, group=None, target=None, name=None, args=(), kwargs=None, *, daemon=None):
        if group is not None:
            raise ValueError("group must be None (as in multiprocessing)")
        parent = current_process()
        self._identity = parent._identity + (next(Process._counter),)
        self._target = target
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self._name = name or "Process-" + ":".join(map(str, self._identity))
        self._daemon = parent.daemon if daemon is None else bool(daemon)
        # it reaches the child with the pickled process object, in the launch payload
        self._authkey = bytes(parent.authkey)
        self._parent_pid = os.getpid()
        self._parent_name = parent.name
        self._job = None
        self._link_id: bytes | None = None  # how its job names itself to this process's hub
        self._backend_name: str | None = None
        self._pid: int | None = None
        self._exitcode: int | None = None
        self._sentinel: int | None = None
        self._closed = False

    # pickled for the child: everything but the parent-side job handle
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_job"] = None
        state["_sentinel"] = None
        return state

    def run(self) -> None:
        """What the child runs; override it in a subclass or pass ``target``."""
        if self._target is not None:
            self._target(*self._args, **self._kwargs)

    @property
    def daemon(self) -> bool:
        return self._daemon

    @daemon.setter
    def daemon(self, value: bool) -> None:
        if self._job is not None:
            raise AssertionError("process has already started")
        self._daemon = bool(value)

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def job_id(self) -> str | None:
        """The backend's id of this process's job (a container, a Slurm job); None before ``start``."""
        return self._job.id if self._job is not None else None

    @property
    def exitcode(self) -> int | None:
        if self._job is None:
            return None
        if self._exitcode is None:
            state, code = self._backend().status(self._job)
            if state is JobStatus.EXITED:
                self._set_exit(code)
        return self._exitcode

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the process ends, for
        ``multiprocessing.connection.wait`` or ``select``; on any backend."""
        self._check_usable()
        if self._job is None:
            raise ValueError("process not started")
        with _sentinels_lock:
            if self._sentinel is None:
                readable, ended = os.pipe()
                self._sentinel = readable
                # a job elsewhere has no fd of its own to watch: a thread waits for it and closes the pipe
                threading.Thread(target=self._close_at_exit, args=(ended,), daemon=True,
                                 name=f"fiberrl-sentinel-{self._name}").start()
        return self._sentinel

    def _close_at_exit(self, ended: int) -> None:
        try:
            if self._exitcode is None:
                code = self._backend().wait(self._job, None)
                if code is not None:
                    self._set_exit(code)
        finally:
            os.close(ended)

    def _give_back_at_exit(self, handed) -> None:
        try:
            self._backend().wait(self._job, None)
        finally:
            _give_back(handed)

    def _backend(self):
        return get_backend(self._backend_name)

    @property
    def job_error(self) -> str | None:
        """Why the backend could not run this process (image missing, never
        scheduled), once it knows; None otherwise."""
        return None if self._job is None else self._job.error

    @property
    def job_lost(self) -> str | None:
        """Why the backend says this process was ended from outside, with
        others, through nothing it did (its fork server killed); None otherwise."""
        return None if self._job is None else self._job.lost

    def _set_exit(self, code: int) -> None:
        self._exitcode = code
        if self._job is not None and self._job.error:
            log.error("%s could not run on the %s backend: %s", self._name, self._backend_name, self._job.error)
        children.discard(self)

    def _check_usable(self):
        if self._closed:
            raise ValueError("process object is closed")

    def start(self) -> None:
        self._check_usable()
        check_not_importing_main()
        if self._job is not None:
            raise AssertionError("cannot start a process twice")
        if self._parent_pid != os.getpid():
            raise AssertionError("can only start a process object created by current process")
        # first: the secret becomes multiprocessing's authkey, which its resource sharer
        # (a multiprocessing connection among the arguments) is started with
        auth.run_secret()
        hub = get_hub()
        process_id = uuid.uuid4().bytes
        prep = preparation_data(self._name)
        try:
            with handing_over() as handed:
                body = wire.cloudpickle_dumps(self)
        except Exception as exc:
            raise TypeError(f"cannot send {self._name}'s target and arguments to its job: {exc}") from exc
        hub.offer_launch(process_id, pickle.dumps((prep, body), protocol=5))
        env = dict(os.environ)
        env.update({
            auth.SECRET_ENV: auth.run_secret().hex(),
            PARENT_ADDRESS_ENV: hub.child_address,
            PROCESS_ID_ENV: process_id.hex(),
            CONFIG_ENV: serialize(get_config()),
            TRACKER_ENV: describe_for_children(),
        })
        resources = self._resources or (resources_of(self._target) if self._target is not None
                                        else resources_of(type(self).run))
        resources = _with_configured_defaults(resources)
        self._backend_name = resolve_name(get_config().backend)
        env.pop(FORWARD_OUTPUT_ENV, None)
        if not self._backend().shares_terminal:
            env[FORWARD_OUTPUT_ENV] = "1"
        spec = JobSpec(command=list(CHILD_COMMAND), name=self._name, env=env, cwd=os.getcwd(),
                       run=auth.run_id(), owner=OWNER, **resources)
        try:
            self._job = start_job(spec, self._backend_name)
        except BaseException:
            hub.withdraw_launch(process_id)
            _give_back(handed)
            raise
        self._pid = self._job.pid
        self._link_id = process_id
        # as multiprocessing: the parent lets go of what only the child needs
        del self._target, self._args, self._kwargs
        if handed:
            # pipe ends in its arguments count as held until it takes them; if it dies first,
            # their readers must still see EOF, as they would when a child's descriptors close
            threading.Thread(target=self._give_back_at_exit, args=(handed,), daemon=True,
                             name=f"fiberrl-handover-{self._name}").start()
        _register_exit_hook()
        children.add(self)

    def join(self, timeout: float | None = None) -> None:
        self._check_usable()
        if self._job is None:
            raise AssertionError("can only join a started process")
        if self._exitcode is None:
            code = self._backend().wait(self._job, timeout)
            if code is not None:
                self._set_exit(code)

    def is_alive(self) -> bool:
        self._check_usable()
        if self._job is None or self._parent_pid != os.getpid():
            return False
        return self.exitcode is None

    def terminate(self) -> None:
        """Ask the child to stop (SIGTERM locally)."""
        self._check_usable()
        if self._job is not None:
            self._backend().terminate(self._job, force=False)

    def kill(self) -> None:
        """Stop the child at once (SIGKILL locally)."""
        self._check_usable()
        if self._job is not None:
            self._backend().terminate(self._job, force=True)

    @property
    def link_id(self) -> bytes | None:
        """What names its job's link to this process (``Hub.heard_from``); None before it started."""
        return self._link_id

    def silent_for(self) -> float | None:
        """Seconds since its job last spoke to this process (it beats four times in ``silence_timeout``,
        see ``lifeline.beat_interval``); None before it started running and once it has ended.
        Long silence means its host is cut off or stalled, or this process was."""
        heard = None if self._link_id is None else get_hub().heard_from(self._link_id)
        return None if heard is None else time.monotonic() - heard

    def unheard(self) -> bool:
        """Whether its job has gone unheard past ``silence_limit()``: its host cut off or stalled,
        so that it is to be given up (``cut_off``) and its work done elsewhere."""
        limit, quiet = silence_limit(), self.silent_for()
        return bool(limit) and quiet is not None and quiet > limit

    def cut_off(self) -> None:
        """Give it up for lost: end its link, so that a job which was only cut off exits once
        it can hear (never to come back), and kill its job through the backend."""
        self._check_usable()
        if self._link_id is not None:
            get_hub().hang_up_on(self._link_id)
        self.kill()

    def close(self) -> None:
        if self._job is not None and self.exitcode is None:
            raise ValueError("cannot close a process while it is still running; join or terminate it first")
        if self._sentinel is not None:
            os.close(self._sentinel)
            self._sentinel = None
        self._closed = True

    def __repr__(self):
        if self._job is None:
            state = "initial"
        elif self.exitcode is None:
            state = "started"
        else:
            state = f"stopped exitcode={self._exitcode}"
        daemon = " daemon" if self._daemon else ""
        return f"<{type(self).__name__} name={self._name!r} pid={self._pid} parent={self._parent_pid} {state}{daemon}>"


class _ParentProcess(BaseProcess):
    """What ``parent_process()`` gives in a child.  A child ends with its parent
    (the lifeline), so the parent is alive for as long as anyone here can ask;
    its sentinel is ready only once this process ends."""

    def __init__(self, pid: int, name: str):
        self._pid = pid
        self._name = name
        self._sentinel, self._held_open = os.pipe()

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def sentinel(self) -> int:
        return self._sentinel

    def is_alive(self) -> bool:
        return True

    def join(self, timeout: float | None = None) -> None:
        from multiprocessing.connection import wait
        wait([self._sentinel], timeout)

    def __repr__(self):
        return f"<_ParentProcess name={self._name!r} pid={self._pid}>"


_current: BaseProcess = _MainProcess()
_parent: BaseProcess | None = None


def _give_back(handed) -> None:
    for channel, token in handed:
        try:
            channel.unpend(token)
        except ConnectionError:
            pass  # its owner is gone, and the pipe with it


def _with_configured_defaults(resources: dict) -> dict:
    """``resources`` (from @meta or the pool) with cpu_per_job/mem_per_job filling what they leave unset."""
    config = get_config()
    defaults = {"cpu": config.cpu_per_job or None, "mem": config.mem_per_job or None}
    return {**{k: v for k, v in defaults.items() if v is not None}, **resources}


def silence_limit() -> float:
    """How long a job may go unheard before it is given up for lost (``silence_timeout``; 0: never).
    Never on the local backend: a local process cannot be cut off, its death is seen at once, and
    local workers that outnumber the cores may be slow to beat."""
    config = get_config()
    return 0.0 if resolve_name(config.backend) == "local" else float(config.silence_timeout or 0.0)


def current_process() -> BaseProcess:
    return _current


def parent_process() -> BaseProcess | None:
    return _parent


def become(process: Process) -> None:
    """Called in a child: this process is ``process``."""
    global _current, _parent
    process._pid = os.getpid()
    _parent = _ParentProcess(process._parent_pid, getattr(process, "_parent_name", "MainProcess"))
    # code written for multiprocessing asks its module (multiprocessing.parent_process())
    multiprocessing.process._parent_process = _parent
    _current = process
    children.forget_all()


def cpu_count() -> int:
    return os.cpu_count() or 1


def _register_exit_hook() -> None:
    global _exit_hook_registered
    if not _exit_hook_registered:
        _exit_hook_registered = True
        # registered after the hub's own hook, so it runs first: children
        # still reach the hub while they are joined
        atexit.register(children.stop_children, 5.0)
