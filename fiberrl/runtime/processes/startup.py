"""What a process does once, as it starts using the runtime (its first hub):
the ``fiberrl`` logger's level from the settings, and enough open files."""
from __future__ import annotations

import logging

from ..config import get_config

log = logging.getLogger("fiberrl")

OPEN_FILES_WANTED = 1 << 16


def prepare_process() -> None:
    logger = logging.getLogger("fiberrl")
    if logger.level == logging.NOTSET:  # a level the program set (logger.setLevel) stands
        logger.setLevel(get_config().log_level.upper())
    raise_open_files_limit()


def raise_open_files_limit() -> None:
    """Lift this process's soft limit on open files towards its hard limit (to
    65536 at most): a pool's master holds ~4 fds per local worker (each stream
    two pipes), and a soft limit of 1024, common on workstations, would stop a
    pool at a few hundred.  No privilege is needed to go up to the hard limit."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_WANTED)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ImportError, ValueError, OSError) as exc:  # no such limit here, or a sandbox refuses
        log.debug("open files limit left as it is: %s", exc)
