"""What a process's launch and exit need to know of the pipe ends it holds
(``primitives.connection`` fills it in): the ends pickled into a launch, which
count at their creator until the job takes them, and the ends that can send,
closed when the process ends so that their readers see EOF."""
from __future__ import annotations

import contextlib
import logging
import threading
import weakref

# the handles of this process that can send, closed when it ends
writers: weakref.WeakSet = weakref.WeakSet()
_pickling = threading.local()


@contextlib.contextmanager
def handing_over():
    """Collect the writer handles pickled on this thread inside the block, as
    (channel, token): a process's launch gives back those its job never took."""
    outer = getattr(_pickling, "handed", None)
    _pickling.handed = handed = []
    try:
        yield handed
    finally:
        _pickling.handed = outer


def handed_over(outbox, token: bytes) -> None:
    """A writer handle was pickled: record it when a launch is collecting them."""
    handed = getattr(_pickling, "handed", None)
    if handed is not None:
        handed.append((outbox, token))


def close_active_connections() -> None:
    """Close the handles this process could send on (run at exit)."""
    for conn in list(writers):
        try:
            conn.close()
        except Exception as exc:
            logging.getLogger("fiberrl").warning("could not tell a pipe's reader it was closed: %s", exc)
