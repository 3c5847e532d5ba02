"""SIGTERM heard on a thread: how a cluster tells a process that it is about to
lose its host (a preempted node, a deleted pod, ``docker stop``, Slurm's
preemption), each killing it a grace period later.

Python runs signal handlers on the main thread only, between bytecodes: a
task holding the main thread in C code would hear of it too late.  Python's
signal wakeup fd wakes a thread of ours instead, which sets :func:`told` and
runs each callback given to :func:`watch` on a thread of its own.
"""
from __future__ import annotations

import os
import signal
import threading

from ..config import get_config

# what a process that left when told to stop exits with: 128 + SIGTERM, as a shell reports it
PREEMPTED_EXIT = 128 + signal.SIGTERM

_told = threading.Event()
_callbacks: list = []
_lock = threading.RLock()  # the handler may run on the main thread while it holds it (in watch)
_watching = False


def told_to_stop(exitcode: int | None) -> bool:
    """Whether a process's exit code says it was told to stop: it left (PREEMPTED_EXIT) or the
    signal ended it."""
    return exitcode in (PREEMPTED_EXIT, -signal.SIGTERM)


def told() -> bool:
    """Whether this process was sent SIGTERM since :func:`watch` was first called."""
    return _told.is_set()


def watch(callback=None) -> bool:
    """From now on SIGTERM sets :func:`told` instead of ending the process, and runs ``callback()``
    (once, each callback once however often given) on a thread of its own; whether that could be
    arranged: only the main thread can (elsewhere the process keeps Python's way)."""
    global _watching
    with _lock:
        if not _watching:
            if threading.current_thread() is not threading.main_thread():
                return False
            read_end, write_end = os.pipe()
            os.set_blocking(write_end, False)
            signal.signal(signal.SIGTERM, _python_handler)
            signal.set_wakeup_fd(write_end)
            threading.Thread(target=_watch, args=(read_end,), name="fiberrl-stop-signal", daemon=True).start()
            _watching = True
        if callback is not None and callback not in _callbacks:
            _callbacks.append(callback)
            if _told.is_set():
                _start(callback)
    return True


def exit_after(seconds: float) -> None:
    """End this process, as one told to stop, ``seconds`` from now (a callback's last act)."""
    threading.Event().wait(seconds)
    os._exit(PREEMPTED_EXIT)


def exit_after_grace() -> None:
    """End this process, as one told to stop, once its ``preempt_grace`` has passed (a callback's last act)."""
    exit_after(get_config().preempt_grace)


def _python_handler(_signum, _frame) -> None:
    """Python writes the wakeup fd only for signals with a Python handler.  It also runs, on the main
    thread, where something took the wakeup fd over since (an asyncio loop does): heard either way."""
    _hear()


def _watch(read_end: int) -> None:
    while signal.SIGTERM not in os.read(read_end, 64):
        pass  # another signal with a Python handler (SIGINT): not ours
    _hear()


def _hear() -> None:
    with _lock:
        if _told.is_set():
            return
        _told.set()
        callbacks = list(_callbacks)
    for callback in callbacks:
        _start(callback)


def _start(callback) -> None:
    threading.Thread(target=callback, name="fiberrl-told-to-stop", daemon=True).start()


def _forget_in_child() -> None:
    """A forked child (a job from a fork server, a server forked by a watching process) starts
    deaf, as Python's way: its parent's callbacks are not its own, and the wakeup pipe it would
    inherit is its parent's, whose watcher would take the child's signal for its own."""
    global _told, _lock, _watching
    _told, _lock, _callbacks[:] = threading.Event(), threading.RLock(), []
    if _watching:
        _watching = False
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:  # not the main thread here: nothing of ours can run it
            pass


os.register_at_fork(after_in_child=_forget_in_child)
