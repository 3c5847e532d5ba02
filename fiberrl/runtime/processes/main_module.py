"""What a job needs to import its parent's main module, as multiprocessing's
spawn hands it over (the main script's path or module name, sys.path, the
working directory), and the import itself."""
from __future__ import annotations

import logging
import multiprocessing.spawn
import os
import sys
import threading


def preparation_data(name: str) -> dict:
    prep = multiprocessing.spawn.get_preparation_data(name)
    prep.pop("authkey", None)  # jobs authenticate with the run's secret, not this
    # the runtime's logger as multiprocessing hands its own to a spawn child: its level and
    # whether it prints on stderr (log_to_stderr)
    logger = logging.getLogger("fiberrl")
    if logger.level != logging.NOTSET:
        prep["fiberrl_log_level"] = logger.level
    prep["fiberrl_log_to_stderr"] = any(getattr(h, "_fiberrl_stderr", False) for h in logger.handlers)
    if prep.get("start_method") not in multiprocessing.get_all_start_methods():
        # a start method another library registered in this process (loky's, in a joblib worker):
        # the job has not imported that library, and sets no method rather than fail to set it
        prep.pop("start_method", None)
    path = prep.get("init_main_from_path")
    if path is not None and not os.path.isfile(path):
        # a script read from stdin ("<stdin>") has no file to import again; its
        # functions travel by value (cloudpickle), so the job can do without it
        del prep["init_main_from_path"]
    return prep


_importing = False  # this process is importing its parent's main module
_refused: str | None = None  # where that import tried to start a process


def import_parents_main(prep: dict) -> None:
    """Import the parent's main module as ``__mp_main__``, as every job does to
    find its target (and the fork server once for all of them)."""
    global _importing
    if prep.get("fiberrl_log_to_stderr"):
        from ..context import log_to_stderr
        log_to_stderr()
    if "fiberrl_log_level" in prep:
        logging.getLogger("fiberrl").setLevel(prep["fiberrl_log_level"])
    _importing = True
    try:
        multiprocessing.spawn.prepare(prep)
    finally:
        _importing = False


def check_not_importing_main() -> None:
    """Refuse to start a process from the parent's main module as a job imports
    it: a script that starts its pool unguarded would start one in every job."""
    global _refused
    if not _importing:
        return
    _refused = _line_of_main() or "the parent's main module"
    raise RuntimeError(f"{_refused}: a process was started while a job imported its parent's main module, as every "
                       f"job does to find its target; start processes, pools and managers only in the parent, "
                       f"under `if __name__ == \"__main__\":`")


def refused_start() -> str | None:
    """Where importing the parent's main module tried to start a process, if it did."""
    return _refused


def _line_of_main() -> str | None:
    """The line of ``__mp_main__`` being run: on this thread, or on the main
    thread (where the import runs) when the start came from another (a pool's)."""
    main_thread = sys._current_frames().get(threading.main_thread().ident)
    for frame in (sys._getframe(), main_thread):
        while frame is not None:
            if frame.f_globals.get("__name__") == "__mp_main__":
                return f"{frame.f_code.co_filename}, line {frame.f_lineno}"
            frame = frame.f_back
    return None
