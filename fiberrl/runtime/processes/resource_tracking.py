"""A job on its parent's host uses the parent's multiprocessing resource tracker,
as a multiprocessing spawn child does.

The tracker unlinks the shared memory blocks (and semaphores) registered with
it once every process holding it has ended.  Python registers a
``SharedMemory`` with the tracker even when it only attaches to a block by
name, so a job with a tracker of its own unlinked, as it ended, a block that
its parent had made and still used.  multiprocessing hands a spawn child the
tracker's pipe; a job is started by a backend, not by this process, so it
opens the pipe through ``/proc`` instead, after checking that it is on the
same kernel (boot id) and that the descriptor is still that pipe (inode).  A
job on another host keeps a tracker of its own, which is the right one there.
"""
from __future__ import annotations

import functools
import os
import time

from .. import env_names

TRACKER_ENV = env_names.RESOURCE_TRACKER


@functools.cache  # read once: the kernel's boot does not change under a process
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


# how long a description of the tracker is handed out unchecked: checking it probes the tracker
# process through its pipe, and a pool of thousands starts thousands of jobs at once
RECHECK_S = 1.0
_described: tuple[float, int, str] | None = None  # (when, pid, description)


def describe_for_children() -> str:
    """This process's tracker, started if need be, as ``boot:pid:fd:device:inode``;
    empty where there is none to share."""
    global _described
    now, pid = time.monotonic(), os.getpid()
    if _described is not None and _described[1] == pid and now - _described[0] < RECHECK_S:
        return _described[2]
    description = _describe()
    _described = (now, pid, description)
    return description


def _describe() -> str:
    from multiprocessing import resource_tracker
    boot = _boot_id()
    if not boot:
        return ""
    try:
        resource_tracker.ensure_running()
        fd = resource_tracker.getfd()
        st = os.fstat(fd)
    except (OSError, ValueError):
        return ""
    return f"{boot}:{os.getpid()}:{fd}:{st.st_dev}:{st.st_ino}"


def use_parents_tracker(description: str | None) -> bool:
    """In a job: take the parent's tracker if it is on this host; whether it was taken."""
    from multiprocessing import resource_tracker
    try:
        boot, pid, fd, dev, ino = (description or "").split(":")
    except ValueError:
        return False
    if boot != _boot_id():
        return False
    try:
        own = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:  # another pid namespace (a container), or the parent is gone
        return False
    st = os.fstat(own)
    if (str(st.st_dev), str(st.st_ino)) != (dev, ino):  # that number names another file now
        os.close(own)
        return False
    # what a multiprocessing spawn child holds: the pipe, and no tracker process of its own to wait for
    tracker = resource_tracker._resource_tracker
    tracker._fd, tracker._pid = own, None
    return True
