"""The Slurm cluster the tests run on: whether there is one, the settings
that point fiberrl at it, and what tests leave behind on it.

CI starts a single-node cluster with ``.ci/start-slurm``; without one,
``available()`` says why and the slurm tests skip.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile

from fiberrl.runtime.backends.slurm import slurm_available

_session_dir: str | None = None


def available() -> str | None:
    """None when ``sinfo`` answers with a responding node, else the reason."""
    return slurm_available()


def settings() -> dict:
    """Settings for ``fiberrl.runtime.configure`` that run jobs on Slurm, with
    this session's own directory for exit files, logs and the secret.  Every
    node must see it: on the single-node CI cluster /tmp does; on a real
    cluster, set FIBERRL_SLURM_DIR to a shared directory to make it there."""
    global _session_dir
    if _session_dir is None:
        base = os.environ.get("FIBERRL_SLURM_DIR") or None
        if base:
            os.makedirs(base, mode=0o700, exist_ok=True)
        _session_dir = tempfile.mkdtemp(prefix="fiberrl-slurm-", dir=base)
        atexit.register(shutil.rmtree, _session_dir, True)
    return dict(backend="slurm", slurm_dir=_session_dir)


def leftovers() -> list[str]:
    """fiberrl's Slurm jobs of this user still queued or running, as "ID NAME STATE"."""
    done = subprocess.run(["squeue", "-h", "-u", str(os.getuid()), "-t",
                           "PENDING,CONFIGURING,RUNNING,SUSPENDED,REQUEUED", "-o", "%i %j %T"],
                          capture_output=True, text=True, timeout=30)
    return [line.strip() for line in done.stdout.splitlines() if line.split()[1:2]
            and line.split()[1].startswith("fiberrl-")]


def kill_job(process) -> None:
    """Cancel the Slurm job of a started fiberrl Process, as an operator's scancel would."""
    subprocess.run(["scancel", process._job.id], capture_output=True, timeout=30, check=True)
