"""``python -m fiberrl.runtime.backends.reaper PID BACKEND OWNER``: wait for
process PID to die, then remove the jobs it started on BACKEND.

A process killed with SIGKILL runs no exit handler; its running children
notice the lost connection and exit, but a job still queued (a pending pod,
a Slurm job waiting for a node) has nothing to notice.  The backend starts
this watcher in its own session so it outlives the owner; the owner stops
it at a normal exit, after cleaning up itself.
"""
from __future__ import annotations

import os
import select
import signal
import sys


def wait_for_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    pid, backend_name, owner = int(argv[0]), argv[1], argv[2]
    # the owner stops this watcher when it exits normally: then there is nothing to do
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    wait_for_exit(pid)
    from . import make_backend, resolve_name
    make_backend(resolve_name(backend_name)).cleanup(owner)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
