"""Entry point of every job-backed process: connect back to the parent,
fetch the pickled ``Process``, become it, run it, exit with its code."""
from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import traceback

import cloudpickle

from .. import env_names
from ..config import get_config
from ..net.errors import PeerGone
from ..net.transport import OK
from .children import stop_children
from .handover import close_active_connections
from .hub import LAUNCH, OUTPUT, REPORT, shutdown_hub
from .lifeline import watch_parent
from .main_module import import_parents_main, refused_start
from .output import FORWARD_OUTPUT_ENV, OutputForwarder
from .parent_link import ParentLink, set_job_link
from .process import become
from .resource_tracking import TRACKER_ENV, use_parents_tracker

log = logging.getLogger("fiberrl")


def _fail(message: str) -> None:
    sys.stderr.write(f"fiberrl child {os.getpid()}: {message}\n")
    sys.stderr.flush()
    os._exit(1)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    try:
        sys.stderr.write(f"{exc.code}\n")
    except (AttributeError, ValueError):  # the child set its stderr to None or closed it
        pass
    return 1


def _print_failure(name: str) -> None:
    """The traceback on this process's stderr, as multiprocessing prints it; where
    a job's output goes to its parent (forwarded, or a shared terminal), so does this."""
    try:
        sys.stderr.write(f"Process {name}:\n")
        traceback.print_exc()
    except Exception:  # noqa: BLE001 -- the child replaced or closed its stderr
        pass


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError):  # the child set it to None or closed it
            pass


def _report(parent: ParentLink, report: str) -> None:
    """Log ``report`` in the parent; print it here if the parent cannot hear."""
    try:
        parent.request(REPORT, report.encode(), timeout=10)
    except (PeerGone, TimeoutError):
        sys.stderr.write(report)


def _join_multiprocessing_children() -> None:
    """What multiprocessing does as a process of its own ends (os._exit below skips it):
    its daemonic children are terminated and the others waited for."""
    import multiprocessing.util
    try:
        multiprocessing.util._exit_function()
    except Exception as exc:  # its finalizers are the user's code
        sys.stderr.write(f"fiberrl child {os.getpid()}: ending its multiprocessing children failed: {exc!r}\n")


def main() -> None:
    parent_address = os.environ.get(env_names.PARENT_ADDRESS)
    process_id = os.environ.pop(env_names.PROCESS_ID, None)
    if not parent_address or not process_id:
        _fail("started without a parent; this module is run by fiberrl.runtime.Process, not by hand")
    timeout = get_config().start_timeout
    try:
        parent = ParentLink(parent_address, connect_timeout=timeout)
        status, payload = parent.request(LAUNCH, bytes.fromhex(process_id), timeout=timeout)
    except (PeerGone, PermissionError, TimeoutError) as exc:
        _fail(f"cannot fetch its task from the parent: {exc}")
    if status != OK:
        _fail("the parent has no task for this process (already started, or withdrawn)")
    set_job_link(parent)
    watch_parent(parent)
    forwarder = OutputForwarder(parent, OUTPUT) if os.environ.pop(FORWARD_OUTPUT_ENV, None) else None

    use_parents_tracker(os.environ.pop(TRACKER_ENV, None))  # before its arguments attach to shared memory
    prep, body = pickle.loads(payload)
    try:
        import_parents_main(prep)
        process = cloudpickle.loads(body)
    except BaseException as exc:
        name = f"Process {prep.get('name', '?')} (pid {os.getpid()})"
        if refused_start() is not None:  # an unguarded script: the cause is all there is to say
            _report(parent, f"{name} cannot run: {exc}")
        else:
            _report(parent, f"{name} could not load its target (is it importable in the child?):\n"
                            f"{traceback.format_exc()}")
        os._exit(1)
    become(process)
    log.info("child process calling self.run()")  # multiprocessing's words, which programs' logs show

    # multiprocessing's bootstrap, step for step: code may count on each
    exitcode = 0
    try:
        try:
            process.run()
        finally:
            _join_multiprocessing_children()
    except SystemExit as exc:
        exitcode = _exit_code(exc)
    except BaseException:
        exitcode = 1
        _print_failure(process.name)
    finally:
        threading._shutdown()  # the non-daemonic threads it started end first
        log.info("process exiting with exitcode %d", exitcode)
        close_active_connections()
        stop_children(5.0)
        _flush_std_streams()
        if forwarder is not None:
            forwarder.stop()
        shutdown_hub()
    # the parent connection closes with the process: closing it first would
    # look to the lifeline like the parent dying
    os._exit(exitcode)
