"""A pool worker told to stop (SIGTERM: its host taken back, see
:mod:`..processes.stop_signal`).

The worker says so to its master at once (``W_LEAVE``); the master hands the
chunks the worker holds but has not started to other workers and starts its
successor.  The worker finishes the chunk it is running if it can within
``preempt_grace`` seconds, sends its result and exits; a chunk it cannot
finish in time runs again elsewhere.  Nothing it gives back counts as a
crash (``max_task_crashes``).
"""
from __future__ import annotations

import os
import threading
import time

from ..net.errors import LinkError
from ..processes import stop_signal
from ..processes.stop_signal import PREEMPTED_EXIT
from .protocol import W_LEAVE


class Preemption:
    """Whether the worker is ``leaving``, and the lock under which it says so and says it starts
    a chunk: the master never hears of a start after it heard the worker leaves."""

    def __init__(self, grace: float):
        self.grace = grace
        self.lock = threading.Lock()
        self.leaving = False
        self._stream = None

    def install(self) -> None:
        """Take SIGTERM from now on (where the worker runs on its process's main thread)."""
        stop_signal.watch(self._told)

    def connected(self, stream) -> None:
        """The master took the worker in: from now on it is told of a preemption."""
        with self.lock:  # a signal before this ends the worker at once (_told)
            self._stream = stream

    def send_unless_leaving(self, parts) -> bool:
        """Send ``parts`` to the master unless the worker leaves; whether it sent them."""
        with self.lock:
            if self.leaving:
                return False
            self._stream.send(parts)
            return True

    def _told(self) -> None:
        deadline = time.monotonic() + self.grace
        with self.lock:
            if self._stream is None:
                os._exit(PREEMPTED_EXIT)  # not taken in yet: it holds nothing
            try:
                self._stream.send([bytes((W_LEAVE,))])
            except LinkError:
                os._exit(PREEMPTED_EXIT)  # the master is gone; so is the work
            # only now: whatever the worker sends once it sees this must reach the master after W_LEAVE
            self.leaving = True
        # the main thread exits once its chunk's result is sent; if it is still running, the
        # chunk runs again elsewhere, uncharged
        stop_signal.exit_after(max(0.0, deadline - time.monotonic()))
