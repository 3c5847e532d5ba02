"""The rest of ``multiprocessing``'s module-level API, so code written for it
runs with only the import changed: start methods, contexts, its exceptions
and its logger (a pool's ``TimeoutError`` is ``fiberrl.runtime.pool``'s).

Every job starts with spawn semantics (a fresh interpreter, or a fork of one
that has imported nothing of the parent's state), whatever start method is
asked for: a cluster backend can start nothing else, and a fork of a process
that runs the runtime would have none of its threads (the hub, the streams'
readers) and whatever locks they held at the fork.  A context is this
module's API itself.
"""
from __future__ import annotations

import logging
import multiprocessing
import sys

ProcessError = multiprocessing.ProcessError
AuthenticationError = multiprocessing.AuthenticationError
BufferTooShort = multiprocessing.BufferTooShort

START_METHODS = ("spawn", "forkserver", "fork")


def _check_method(method) -> None:
    if method is not None and method not in START_METHODS:
        raise ValueError(f"cannot find context for {method!r}: the start methods are {', '.join(START_METHODS)} "
                         f"(every one starts jobs with spawn semantics here)")


def get_context(method: str | None = None):
    """The runtime's API (``Process``, ``Pool``, ``Queue``...), for any start method."""
    _check_method(method)
    return sys.modules["fiberrl.runtime"]


def set_start_method(method: str, force: bool = False) -> None:
    """Accepted for compatibility; jobs always start with spawn semantics."""
    _check_method(method)


def get_start_method(allow_none: bool = False) -> str:
    return "spawn"


def get_all_start_methods() -> list[str]:
    return ["spawn"]


def freeze_support() -> None:
    """Nothing to do: jobs are not started from a frozen executable's copy."""


def get_logger() -> logging.Logger:
    """The runtime's logger (``fiberrl``): jobs' failures and pool events."""
    return logging.getLogger("fiberrl")


def log_to_stderr(level: int | None = None) -> logging.Logger:
    """Print the runtime's log on stderr, as ``multiprocessing.log_to_stderr`` does for its own."""
    logger = get_logger()
    if not any(getattr(handler, "_fiberrl_stderr", False) for handler in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s/%(processName)s] %(message)s"))
        handler._fiberrl_stderr = True
        logger.addHandler(handler)
    if level is not None:
        logger.setLevel(level)
    return logger
