"""The backend's handle on one pod (``Job.handle``), and the verdict on a
job from what the watch last saw of its pod."""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..base import NEVER_RAN_EXIT
from .pod_state import UNRECOVERABLE, _PodState

if TYPE_CHECKING:
    from .connection import _Connection
    from .watch import _Watch


@dataclass
class _PodJob:
    """The backend's handle on one pod (``Job.handle``)."""

    name: str
    namespace: str
    connection: "_Connection"
    created: float
    schedule_timeout: float
    posted: float | None = None     # when the API server had accepted it
    watch: "_Watch | None" = None
    requested: int | None = None    # exit code asked for by terminate()
    final: int | None = None


def judge(handle: _PodJob, state: _PodState | None) -> tuple[int | None, str | None]:
    """The exit code of a job that has ended (and why it never ran), else (None, None)."""
    if state is not None:
        if state.exit_code is not None:
            return state.exit_code, None
        if state.gone or state.ended:
            if handle.requested is not None:
                return handle.requested, None
            if not state.ran:
                return NEVER_RAN_EXIT, f"pod {handle.name} was deleted before it started"
            return -signal.SIGKILL, None  # lost: deleted (or evicted) while it ran
        if state.failed and not state.deleting:
            if state.ran:
                return -signal.SIGKILL, None
            return NEVER_RAN_EXIT, f"pod {handle.name} failed before it started: {state.failed}"
        if not state.ran and state.waiting and state.waiting.split(":")[0] in UNRECOVERABLE:
            return NEVER_RAN_EXIT, f"pod {handle.name} cannot start: {state.waiting}"
        if state.ran or state.deleting:
            return None, None
    waited = time.monotonic() - handle.created
    if waited > handle.schedule_timeout:
        why = (state.unschedulable or state.waiting) if state else None
        if why is None and handle.watch is not None and handle.watch.error:
            why = f"still pending as far as known: watching its pods fails ({handle.watch.error})"
        return NEVER_RAN_EXIT, (f"pod {handle.name} did not start within schedule_timeout "
                                f"({handle.schedule_timeout:g} s): {why or 'still pending'}")
    return None, None
