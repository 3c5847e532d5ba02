"""What the API server reports of a pod, as the backend keeps it: a
``_PodState`` per pod, updated from each version of the pod the watch sees."""
from __future__ import annotations

import signal
from dataclasses import dataclass

from .names import CONTAINER

# a pod waiting for one of these will never start by itself
UNRECOVERABLE = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                 "CreateContainerError"}


def exit_code_of(terminated: dict) -> int:
    """A terminated container's exit code, negative for a signal as in multiprocessing."""
    if terminated.get("signal"):
        return -int(terminated["signal"])
    code = int(terminated.get("exitCode") or 0)
    if terminated.get("reason") == "OOMKilled":
        return -signal.SIGKILL
    # the runtime reports a main process killed by signal N as 128+N
    if code in (128 + signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGSEGV,
                128 + signal.SIGABRT, 128 + signal.SIGHUP):
        return 128 - code
    return code


@dataclass
class _PodState:
    """What the watch last saw of one pod."""

    phase: str = "Pending"
    ran: bool = False               # a container started
    exit_code: int | None = None    # its own exit, seen before any deletion began
    deleting: bool = False
    ended: bool = False             # terminated (or failed) while being deleted
    gone: bool = False
    waiting: str | None = None      # "Reason: message" of a waiting container
    unschedulable: str | None = None
    failed: str | None = None       # a Failed pod without a container exit (evicted...)


def update_state(state: _PodState, pod: dict) -> None:
    """Bring ``state`` up to date with a version of its pod."""
    status = pod.get("status") or {}
    state.phase = status.get("phase") or state.phase
    if pod["metadata"].get("deletionTimestamp"):
        state.deleting = True
    containers = status.get("containerStatuses") or []
    mine = [c for c in containers if c.get("name") == CONTAINER] or containers
    container = (mine or [{}])[0].get("state") or {}
    if "running" in container:
        state.ran = True
    state.waiting = None
    if "waiting" in container:
        waiting = container["waiting"] or {}
        state.waiting = f"{waiting.get('reason', 'waiting')}: {waiting.get('message', '')}".rstrip(": ")
    if "terminated" in container:
        state.ran = True
        if state.deleting:
            state.ended = True
        elif state.exit_code is None:
            state.exit_code = exit_code_of(container["terminated"])
    elif state.phase == "Failed":
        state.failed = f"{status.get('reason', 'Failed')}: {status.get('message', '')}".rstrip(": ")
        if state.deleting:
            state.ended = True
    state.unschedulable = None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            state.unschedulable = condition.get("message") or condition.get("reason")
