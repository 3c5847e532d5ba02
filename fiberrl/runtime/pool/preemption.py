"""A pool worker told to stop: SIGTERM, which is how a cluster takes a host
back (a preempted node, a deleted pod, ``docker stop``, Slurm's preemption),
each then waiting a grace period before it kills.

The worker says so to its master at once (``W_LEAVE``); the master hands the
chunks the worker holds but has not started to other workers and starts its
successor.  The worker finishes the chunk it is running if it can within
``preempt_grace`` seconds, sends its result and exits; a chunk it cannot
finish in time runs again elsewhere.  Nothing it gives back counts as a
crash (``max_task_crashes``).

A thread takes the signal, woken through Python's signal wakeup fd rather
than by the handler, which only runs on the main thread: a task may hold
the main thread in C code for longer than the grace period.
"""
from __future__ import annotations

import os
import signal
import threading
import time

from ..net.errors import LinkError
from .protocol import W_LEAVE

# what a worker that left before it could say so exits with: 128 + SIGTERM, as a shell reports it
PREEMPTED_EXIT = 128 + signal.SIGTERM


def told_to_stop(exitcode: int | None) -> bool:
    """Whether a worker's exit code says it was stopped by SIGTERM (before it could say so itself)."""
    return exitcode in (PREEMPTED_EXIT, -signal.SIGTERM)


def _python_handler(_signum, _frame) -> None:
    """Python writes the wakeup fd only for signals with a Python handler; the work is the watcher's."""


class Preemption:
    """Whether the worker is ``leaving``, and the lock under which it says so and says it starts
    a chunk: the master never hears of a start after it heard the worker leaves."""

    def __init__(self, grace: float):
        self.grace = grace
        self.lock = threading.Lock()
        self.leaving = False
        self._stream = None

    def install(self) -> None:
        """Take SIGTERM from now on; only the main thread can (a worker run on another keeps Python's way)."""
        if threading.current_thread() is not threading.main_thread():
            return
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.signal(signal.SIGTERM, _python_handler)
        signal.set_wakeup_fd(write_end)
        threading.Thread(target=self._watch, args=(read_end,), name="fiberrl-preemption", daemon=True).start()

    def connected(self, stream) -> None:
        """The master took the worker in: from now on it is told of a preemption."""
        with self.lock:  # a signal before this ends the worker at once (_watch)
            self._stream = stream

    def send_unless_leaving(self, stream, parts) -> bool:
        """Send ``parts`` unless the worker leaves; whether it sent them."""
        with self.lock:
            if self.leaving:
                return False
            stream.send(parts)
            return True

    def _watch(self, read_end: int) -> None:
        while signal.SIGTERM not in os.read(read_end, 64):
            pass  # another signal with a Python handler (SIGINT): not ours
        deadline = time.monotonic() + self.grace
        with self.lock:
            self.leaving = True
            stream = self._stream
        if stream is None:
            os._exit(PREEMPTED_EXIT)  # not taken in yet: it holds nothing
        self._say_leaving()
        # the main thread exits once its chunk's result is sent; if it is still running, the
        # chunk runs again elsewhere, uncharged
        time.sleep(max(0.0, deadline - time.monotonic()))
        os._exit(PREEMPTED_EXIT)

    def _say_leaving(self) -> None:
        try:
            self._stream.send([bytes((W_LEAVE,))])
        except LinkError:
            os._exit(PREEMPTED_EXIT)  # the master is gone; so is the work
