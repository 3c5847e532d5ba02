"""What a run's job does: Hydra's ``run_job`` on the config the launcher composed, its output into
the run's folder, and its ``JobReturn`` left beside Hydra's own records for the launcher to read."""
from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import sys
import traceback
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals

from fiberrl.runtime.processes.stop_signal import told_to_stop

# in the run's folder: the run's stdout and stderr, where its job runs, and its JobReturn once it has ended
OUTPUT_LOG = "output.log"
WHERE_FILE = Path(".hydra") / "job_where.json"
RETURN_FILE = Path(".hydra") / "job_return.pickle"

log = logging.getLogger(__name__)


def run_sweep_job(hydra_context, task_function, config, overrides, run_dir: str, singleton_state,
                  fingerprint: str) -> None:
    setup_globals()
    Singleton.set_state(singleton_state)
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    _output_into(folder / OUTPUT_LOG)
    _say_where(folder / WHERE_FILE)
    try:
        ret = run_job(hydra_context=hydra_context, task_function=task_function, config=config,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    except SystemExit as exc:  # a task that exits non-zero fails its run, as an exception does
        if told_to_stop(exc.code):
            raise  # told to stop, and checkpointed: the launcher starts it again
        ok = exc.code in (0, None)
        ret = JobReturn(cfg=config, hydra_cfg=config, working_dir=str(folder),
                        status=JobStatus.COMPLETED if ok else JobStatus.FAILED, _return_value=None if ok else exc)
    # its overrides as the sweep gave them, without the resume the launcher may have added
    ret.overrides = list(overrides)
    if ret.status == JobStatus.FAILED:
        error = ret._return_value
        # into the run's log (Hydra's job logging is still pointed there) and its output
        log.error("the run failed", exc_info=(type(error), error, error.__traceback__))
        traceback.print_exception(error, file=sys.stderr)
        ret._return_value = _sendable_error(error)
    _write_return(folder / RETURN_FILE, ret, fingerprint)


def _say_where(path: Path) -> None:
    """Which job is this run's, for whoever has to find it: host, pid, the Slurm job, the container."""
    where = {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job_id": os.environ.get("SLURM_JOB_ID")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(where) + "\n")


def _output_into(path: Path) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _sendable_error(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError holding its traceback."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        text = "".join(traceback.format_exception(error)).rstrip()
        return RuntimeError(f"{type(error).__name__}: {error} (it does not pickle; its traceback:\n{text})")


def _write_return(path: Path, ret: JobReturn, fingerprint: str) -> None:
    """``ret`` with what it was computed by, so that a sweep run again skips it only if that is unchanged."""
    import cloudpickle
    try:
        body = cloudpickle.dumps({"fingerprint": fingerprint, "return": ret})
    except Exception as exc:
        ret.status, ret._return_value = JobStatus.FAILED, RuntimeError(
            f"the run's return value {type(ret._return_value).__name__} does not pickle: {exc}")
        body = cloudpickle.dumps({"fingerprint": fingerprint, "return": ret})
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as fh:
        fh.write(body)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(partial, path)
