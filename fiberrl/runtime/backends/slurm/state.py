"""What the tracker knows of one job (its ``Job.handle``)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class JobState:
    """The monitor's knowledge of one job (``Job.handle``)."""

    id: str
    submitted: float
    pending_since: float
    schedule_timeout: float
    exit_path: str
    log_path: str
    state: str = "PENDING"
    reason: str = ""
    node: str = ""
    ran: bool = False
    ended_at: float | None = None  # when Slurm first said the job ended (or it left the queue)
    slurm_code: int | None = None  # the exit code Slurm recorded, if it said
    slurm_state: str = ""
    cancel_code: int | None = None  # what terminate() of a job that never ran makes its exit code
    killed: bool = False  # kill() was asked: a signal death is reported as SIGKILL, as multiprocessing's
    exit_code: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
