"""Slurm's client commands (scancel, sinfo and the rest) run with a timeout,
and a clear error where they are not installed."""
from __future__ import annotations

import logging
import re
import shutil
import subprocess

log = logging.getLogger("fiberrl")

COMMAND_TIMEOUT = 60


class SlurmError(RuntimeError):
    """Slurm refused a request; the message has Slurm's words and which setting to look at."""


def run_command(args: list[str], timeout: float = COMMAND_TIMEOUT, **kwargs) -> subprocess.CompletedProcess:
    if "input" not in kwargs:
        kwargs["stdin"] = subprocess.DEVNULL
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError:
        raise SlurmError(f"{args[0]} not found: the slurm backend runs where Slurm's client commands "
                         f"(sbatch, squeue, scancel) are installed and configured") from None


def scancel(ids: list[str], *extra: str) -> None:
    if not ids and not extra:
        return
    done = run_command(["scancel", *extra, *ids])
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip()
        if "already completing or completed" not in message and "Invalid job id" not in message:
            log.warning("scancel %s: %s", " ".join([*extra, *ids]), message)


def slurm_available() -> str | None:
    """None when this host can reach a Slurm cluster with a responding node, else why not."""
    if not shutil.which("sinfo"):
        return "sinfo not found (Slurm's client commands are not installed)"
    try:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%T"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 15 s"
    if done.returncode != 0:
        return f"sinfo failed: {(done.stderr or done.stdout).strip()}"
    nodes = [line.split("|") for line in done.stdout.splitlines() if "|" in line]
    usable = [n for n, s in nodes if not s.endswith("*") and not re.match(r"(down|drain|fail|unknown|not_resp)", s)]
    if not usable:
        return "no Slurm node is responding: " + (", ".join(f"{n} {s}" for n, s in nodes) or "sinfo lists none")
    return None
