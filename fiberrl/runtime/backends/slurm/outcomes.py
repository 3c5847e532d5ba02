"""What becomes of a job its exit file says nothing about: a pending job
that can never start or waited past ``schedule_timeout``, one that ended
before it started, and one that ended or left the queue without writing its
exit code."""
from __future__ import annotations

import logging
import re

from ..base import NEVER_RAN_EXIT
from .jobinfo import Accounting
from .state import JobState

log = logging.getLogger("fiberrl")

# pending reasons no amount of waiting changes: the request exceeds what the
# partition, its nodes or the account allow
FATAL_REASONS = {"BadConstraints", "PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "InvalidAccount",
                 "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed", "DependencyNeverSatisfied"}
# per-job limits of an association or QOS (QOSMaxCpuPerJobLimit...), and QOS minimums
FATAL_REASON_PATTERN = re.compile(r"^(Assoc|QOS)Max\w*PerJob\w*$|^QOSMin\w+$")
REASON_HINTS = {
    "BadConstraints": "no node can satisfy the job's constraints (meta cpu/mem/gpu, or slurm_options)",
    "PartitionConfig": "the job asks more than the partition's nodes have (meta cpu/mem/gpu), or a partition "
                       "setting forbids it",
    "PartitionNodeLimit": "the job asks more nodes than the partition allows",
    "PartitionTimeLimit": "slurm_time exceeds the partition's time limit",
    "InvalidAccount": "slurm_account is not a valid account",
    "InvalidQOS": "the QOS in slurm_options is not valid",
    "ReqNodeNotAvail": "the nodes the job needs are down, drained or reserved",
}


def never_schedulable(reason: str) -> bool:
    head = reason.split(",")[0].strip()
    return head in FATAL_REASONS or bool(FATAL_REASON_PATTERN.match(head))


def pending_error(state: JobState, reason: str, now: float) -> str | None:
    """Why a pending job is to be cancelled as never run, or None while it may yet start."""
    waited = now - state.pending_since
    if never_schedulable(reason):
        hint = REASON_HINTS.get(reason.split(",")[0], "the request exceeds what the cluster allows")
        return (f"Slurm job {state.id} can never start: squeue says {reason} ({hint}); "
                f"check meta(cpu/mem/gpu) and slurm_partition, slurm_options")
    if waited > state.schedule_timeout:
        hint = REASON_HINTS.get(reason.split(",")[0], "")
        return (f"Slurm job {state.id} was not scheduled within schedule_timeout="
                f"{state.schedule_timeout:g}s (squeue reason: {reason}"
                f"{'; ' + hint if hint else ''}); raise schedule_timeout or ask for fewer "
                f"resources")
    return None


def never_ran_code(state: JobState, slurm_state: str, reason: str) -> tuple[int, str | None]:
    if state.cancel_code is not None:
        return state.cancel_code, None
    if slurm_state == "CANCELLED":
        return NEVER_RAN_EXIT, f"Slurm job {state.id} was cancelled before it started (scancel by someone else?)"
    return NEVER_RAN_EXIT, f"Slurm job {state.id} ended as {slurm_state} before it started ({reason})"


class Endings:
    """Exit codes of jobs that left no exit file; warns once per backend
    that exit files go missing."""

    def __init__(self, accounting: Accounting):
        self._accounting = accounting
        self._warned_no_exit_file = False

    def ended_code(self, state: JobState) -> tuple[int, str | None]:
        """A job Slurm says has ended, with no exit file after the grace time."""
        if state.cancel_code is not None:
            return state.cancel_code, None
        code = state.slurm_code
        if state.slurm_state in ("COMPLETED", "FAILED") and not self._warned_no_exit_file:
            # the script ran to its end, so it wrote the file where this host cannot see it
            self._warned_no_exit_file = True
            log.warning("Slurm job %s ended (%s) but its exit file %s never appeared; is slurm_dir on a file "
                        "system the nodes share? (log: %s)", state.id, state.slurm_state or "?", state.exit_path,
                        state.log_path)
        if code is not None and (code < 0 or state.slurm_state in ("COMPLETED", "FAILED")):
            return code, None
        log.warning("Slurm job %s ended as %s without writing its exit code (log: %s); taking it as killed",
                    state.id, state.slurm_state or "?", state.log_path)
        return -9, None

    def lost_code(self, state: JobState) -> tuple[int, str | None]:
        """A job gone from the queue without an exit file: Slurm's accounting, else lost (-9)."""
        if state.cancel_code is not None:
            return state.cancel_code, None
        if state.slurm_state:
            return self.ended_code(state)
        accounted = self._accounting.lookup(state.id)
        if accounted is not None:
            slurm_state, code, ran = accounted
            if not ran:
                return NEVER_RAN_EXIT, f"Slurm job {state.id} ended as {slurm_state} before it started"
            if code is not None:
                return code, None
        log.warning("Slurm job %s left the queue without writing its exit code (cancelled with scancel, or its "
                    "node failed; log: %s); taking it as killed", state.id, state.log_path)
        return -9, None
