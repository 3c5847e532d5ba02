"""What Slurm says about a job: its queue entry (squeue), its accounting
record (sacct), the states they name and the exit codes they give."""
from __future__ import annotations

import subprocess

from .commands import SlurmError, run_command

ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
                 "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
                 "POWER_UP_NODE", "UPDATE_DB"}
QUEUED_STATES = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING", "RESV_DEL_HOLD",
                 "POWER_UP_NODE"}


def decode_wait_status(text: str) -> int | None:
    """squeue's exit_code (a wait status, or ``code:signal``) as a multiprocessing exit code."""
    text = text.strip()
    try:
        if ":" in text:
            code, sig = (int(x) for x in text.split(":", 1))
            return -sig if sig else code
        raw = int(text)
    except ValueError:
        return None
    return -(raw & 0x7F) if raw & 0x7F else raw >> 8


def queue_entry(job_id: str) -> tuple[str, str, str, str, str] | None:
    """The job's (state, reason, node, exit code, name) while squeue lists it."""
    done = run_command(["squeue", "-h", "-t", "all", "-j", job_id, "-O",
                        "JobID:|,State:|,Reason:|,NodeList:|,exit_code:|,Name:|"], timeout=30)
    for line in done.stdout.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) >= 6 and fields[0] == job_id:
            return fields[1], fields[2], fields[3], fields[4], fields[5]
    return None


class Accounting:
    """sacct, for jobs that have left the queue; not asked again once it
    says accounting is disabled."""

    def __init__(self):
        self._enabled: bool | None = None

    def lookup(self, job_id: str) -> tuple[str, int | None, bool] | None:
        """The job's (state, exit code, whether it ran), if sacct knows it."""
        if self._enabled is False:
            return None
        try:
            done = run_command(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode,NodeList"],
                               timeout=30)
        except (subprocess.TimeoutExpired, SlurmError):
            return None
        if done.returncode != 0 or "disabled" in done.stderr:
            self._enabled = False
            return None
        self._enabled = True
        for line in done.stdout.splitlines():
            fields = line.split("|")
            if len(fields) >= 3:
                slurm_state = fields[0].split()[0] if fields[0] else ""
                ran = fields[2].strip() not in ("", "None assigned")
                return slurm_state, decode_wait_status(fields[1]), ran
        return None
