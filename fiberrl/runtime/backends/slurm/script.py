"""A job's batch script and environment, and the files it shares with this
host through ``slurm_dir``: its exit file and the run's secret."""
from __future__ import annotations

import os
import re
import shlex
import uuid

from ... import env_names
from ..base import JobSpec, remote_env
from .commands import SlurmError

SECRET_ENV = env_names.RUN_SECRET
SECRET_FILE_ENV = env_names.RUN_SECRET_FILE
# variables of this shell a job always gets, beyond remote_env's
JOB_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ")


def make_slurm_dir() -> str:
    """The configured ``slurm_dir``, created if need be."""
    from ...config import get_config
    path = os.path.abspath(os.path.expanduser(get_config().slurm_dir or "~/.fiberrl/slurm"))
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise SlurmError(f"cannot create slurm_dir {path}: {exc}; set slurm_dir to a directory on a file "
                         f"system every node shares") from None
    return path


def _valid_name(name: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None


def batch_script(command: list[str], env: dict[str, str], exit_dir: str | None, title: str,
                 remove_after: str | None = None) -> str:
    """A batch script that exports ``env``, runs ``command`` and writes its
    exit code to ``<exit_dir>/<jobid>.exit`` (negative for a signal, as in
    multiprocessing).

    The command runs in the foreground.  ``scancel --full --signal=SIG``
    reaches it directly; the script traps the signals a job is sent so it
    outlives them and can record the command's code, then dies of the same
    signal so that Slurm records it too."""
    lines = ["#!/bin/bash", f"# {title}"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items()) if _valid_name(name)]
    signals = "TERM INT HUP QUIT USR1 USR2 ALRM"
    lines += [
        f"trap : {signals}",
        " ".join(shlex.quote(arg) for arg in command),
        "fiberrl_status=$?",
    ]
    if remove_after:
        lines.append(f"rm -f {shlex.quote(remove_after)}")
    lines += [
        "fiberrl_code=$fiberrl_status",
        "if [ $fiberrl_status -gt 128 ] && [ $fiberrl_status -lt 193 ]; then",
        "    fiberrl_code=-$((fiberrl_status - 128))",
        "fi",
    ]
    if exit_dir:
        lines += [
            f'fiberrl_exit={shlex.quote(exit_dir)}/"$SLURM_JOB_ID".exit',
            # builtins only from here: Slurm signals every process of the job,
            # and an mv started as it does would die of it.  The newline ends
            # the record: a reader takes the file only once it is there
            'if ! printf \'%s\\n\' "$fiberrl_code" > "$fiberrl_exit"; then',
            '    echo "fiberrl: cannot write the exit code to $fiberrl_exit" >&2',
            "fi",
        ]
    lines += [
        "if [ $fiberrl_status -gt 128 ] && [ $fiberrl_status -lt 193 ]; then",
        f"    trap - {signals}",
        "    ulimit -c 0",
        "    kill -s $((fiberrl_status - 128)) $$",
        "fi",
        "exit $fiberrl_status",
        "",
    ]
    return "\n".join(lines)


def read_exit_file(path: str) -> int | None:
    """The code in an exit file, once it is complete (newline-terminated)."""
    try:
        with open(path) as fh:
            text = fh.read()
        return int(text) if text.endswith("\n") else None
    except (OSError, ValueError):
        return None


def job_env(spec: JobSpec, slurm_dir: str, name: str) -> tuple[dict[str, str], str | None]:
    """The job's environment with the run's secret moved into a 0600 file;
    the file's path if this call wrote it."""
    from ...config import get_config
    env = remote_env(spec.env, get_config().forward_env)
    for key in JOB_ENV:
        if key in spec.env:
            env[key] = spec.env[key]
    secret = env.pop(SECRET_ENV, None)
    if not secret or env.get(SECRET_FILE_ENV):
        return env, None  # no secret, or the parent's file already holds it
    path = os.path.join(slurm_dir, name)
    env[SECRET_FILE_ENV] = path
    if os.path.exists(path):
        return env, None
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(secret + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return env, None
    finally:
        os.unlink(tmp)
    return env, path
