"""sbatch: the options a JobSpec and the slurm_* settings translate to, and
submitting a batch script with them, naming the setting to fix when sbatch
refuses."""
from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import threading

from ..base import JobSpec, working_directory
from .commands import SlurmError, run_command

# variables sbatch itself runs with (beyond them its environment is scrubbed):
# its own configuration, and who the job runs as
SBATCH_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "SLURM_CONF")

# sbatch's complaints and the setting that fixes each
_SBATCH_HINTS = [
    (re.compile(r"account|association", re.IGNORECASE), "slurm_account"),
    (re.compile(r"partition", re.IGNORECASE), "slurm_partition"),
    (re.compile(r"time limit|--time", re.IGNORECASE), "slurm_time"),
    (re.compile(r"gres|generic resource|gpu", re.IGNORECASE), "meta(gpu=...)"),
    (re.compile(r"memory", re.IGNORECASE), "meta(mem=...)"),
    (re.compile(r"cpu|processor", re.IGNORECASE), "meta(cpu=...)"),
    (re.compile(r"node configuration is not available", re.IGNORECASE), "meta(cpu=, mem=, gpu=)"),
    (re.compile(r"unrecognized option|invalid option|unknown option|invalid argument|qos", re.IGNORECASE),
     "slurm_options"),
]


def _output_pattern(path: str) -> str:
    """``path`` as an sbatch filename pattern (``%`` and ``\\`` are special there)."""
    return path.replace("\\", "\\\\").replace("%", "%%")


def sbatch_env() -> dict[str, str]:
    """sbatch's own environment: its settings (SBATCH_*) and identity, nothing else,
    since with --export=ALL it is what the job starts from."""
    return {k: v for k, v in os.environ.items() if k in SBATCH_ENV or k.startswith("SBATCH_")}


def sbatch_options(spec: JobSpec, slurm_dir: str, job_name: str, comment: str | None) -> list[str]:
    from ...config import get_config
    config = get_config()
    # --no-requeue: a process starts once (its parent hands its task out once); a job
    # whose node failed is a lost process, not one to run again
    args = ["sbatch", "--parsable", f"--job-name={job_name}", "--export=ALL", "--nodes=1", "--ntasks=1",
            "--no-requeue", f"--chdir={working_directory(spec)}", f"--output={_output_pattern(slurm_dir)}/%j.log"]
    if comment:
        args.append(f"--comment={comment}")
    if spec.cpu:
        args.append(f"--cpus-per-task={max(1, math.ceil(spec.cpu))}")
    if spec.mem:
        args.append(f"--mem={math.ceil(spec.mem)}M")
    if spec.gpu:
        args.append(f"--gres=gpu:{int(spec.gpu)}")
    if config.slurm_partition:
        args.append(f"--partition={config.slurm_partition}")
    if config.slurm_account:
        args.append(f"--account={config.slurm_account}")
    if config.slurm_time:
        args.append(f"--time={config.slurm_time}")
    if config.slurm_options:
        try:
            args += shlex.split(config.slurm_options)
        except ValueError as exc:
            raise SlurmError(f"slurm_options={config.slurm_options!r} cannot be split like a command "
                             f"line: {exc}") from None
    return args


def sbatch(args: list[str], script: str, what: str, lock: threading.Lock) -> str:
    """Submit ``script`` with ``args`` (from sbatch_options), one sbatch at a
    time under ``lock``; the job's id."""
    with lock:
        try:
            done = run_command(args, input=script, env=sbatch_env(), timeout=120)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"sbatch did not answer within 120 s submitting {what}; is slurmctld up "
                             f"(`scontrol ping`)?") from None
    if done.returncode != 0:
        message = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}")
        raise SlurmError(f"sbatch refused {what}: {message}\n{_hint(message)}")
    job_id = done.stdout.strip().split(";")[0].strip()
    if not job_id.split("_")[0].isdigit():
        raise SlurmError(f"sbatch answered {done.stdout.strip()!r} for {what}, not a job id")
    return job_id


def _hint(message: str) -> str:
    """Which setting to fix, by what sbatch complained about."""
    from ...config import get_config
    config = get_config()
    current = {"slurm_partition": config.slurm_partition or "unset: the cluster's default partition",
               "slurm_account": config.slurm_account or "unset: your default account",
               "slurm_time": config.slurm_time or "unset: the partition's default",
               "slurm_options": config.slurm_options or "unset"}
    how = {"slurm_partition": "; `sinfo -s` lists the partitions",
           "slurm_account": "; `sacctmgr show assoc user=$USER` lists your accounts",
           "slurm_time": ", e.g. 1-00:00:00 or 30:00"}
    also = (f"; or slurm_options (now {config.slurm_options})" if config.slurm_options else "")
    for pattern, key in _SBATCH_HINTS:
        if not pattern.search(message):
            continue
        if key == "slurm_options":
            return f"hint: check the slurm_options setting (now {config.slurm_options or 'unset'})"
        if key in current:
            return f"hint: check the {key} setting (now {current[key]}){how.get(key, '')}{also}"
        return (f"hint: the process asks for more than the cluster's nodes have: lower {key}, pick a "
                f"partition that has it (slurm_partition, now {current['slurm_partition']}){also}")
    return ("hint: check the settings " + ", ".join(f"{k} ({v})" for k, v in current.items()))
