"""What a job prints reaches the terminal of the process that started it.

A local child shares its parent's terminal.  A job in a container, a pod or
a Slurm allocation writes to a log its cluster keeps (or, for a removed
container or pod, throws away), so such a child sends everything written to
its file descriptors 1 and 2 -- by Python, by C extensions and by its own
subprocesses alike -- to its parent, which writes it to its own stdout and
stderr.  The cluster's log keeps a copy.
"""
from __future__ import annotations

import os
import sys
import threading

from .. import env_names
from ..net.errors import PeerGone
from .parent_link import ParentLink

# set in a job's environment when its backend does not share the parent's terminal
FORWARD_OUTPUT_ENV = env_names.FORWARD_OUTPUT
CHUNK = 1 << 16
DRAIN_SECONDS = 2.0  # at exit, how long a grandchild still holding a descriptor may delay the exit


class OutputForwarder:
    """Replaces fd 1 and 2 of this process with pipes read by one thread each."""

    def __init__(self, parent: ParentLink, op: int):
        self._parent = parent
        self._op = op
        self._streams: list[tuple[int, int, threading.Thread]] = []  # (fd, its original, reader)
        for fd in (1, 2):
            original = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            reader = threading.Thread(target=self._pump, args=(fd, read_end, original),
                                      name=f"fiberrl-output-{fd}", daemon=True)
            reader.start()
            self._streams.append((fd, original, reader))

    def _pump(self, fd: int, read_end: int, original: int) -> None:
        forwarding = True
        while True:
            chunk = os.read(read_end, CHUNK)
            if not chunk:
                break
            try:
                os.write(original, chunk)
            except OSError:
                pass  # the cluster's log is a copy: losing it loses nothing the parent has not got
            if forwarding:
                try:
                    self._parent.request(self._op, bytes((fd,)) + chunk)
                except (PeerGone, TimeoutError):
                    forwarding = False  # the parent is gone; the lifeline ends this process
        os.close(read_end)

    def stop(self) -> None:
        """Send what is still in the pipes and give fd 1 and 2 back."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for fd, original, _ in self._streams:
            os.dup2(original, fd)  # closes the pipe's last write end this process holds
        for _, original, reader in self._streams:
            reader.join(DRAIN_SECONDS)
            os.close(original)


def write_forwarded(body: memoryview) -> None:
    """In the parent: write a chunk a job forwarded to the same stream here."""
    stream = sys.stdout if body[0] == 1 else sys.stderr
    try:
        stream.flush()  # what this process printed before stays before it
        target = getattr(stream, "buffer", None)
        if target is not None:
            target.write(body[1:])
        else:  # a replaced stream (a test's capture, a notebook) takes text
            stream.write(bytes(body[1:]).decode(errors="replace"))
        stream.flush()
    except (OSError, ValueError):
        pass  # this process's own stdout is closed: nowhere to write
