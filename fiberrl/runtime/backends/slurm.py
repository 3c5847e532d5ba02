"""Slurm backend: each job-backed process is one Slurm batch job.

``create_job`` pipes a generated batch script into ``sbatch --parsable``
(no script file is left anywhere).  The script exports the job's
environment: fiberrl's variables, the Python ones, ``forward_env``, PATH and
HOME; sbatch itself runs with a scrubbed environment and ``--export=ALL``,
so nothing else of this shell travels (``--export=NONE`` would also work
but makes each node load the user's login environment, 1-3 s a job).  The
script runs the command in the foreground, and writes its exit code to
``<slurm_dir>/<jobid>.exit``, newline-terminated so that a reader can tell
it is complete.  Output goes to ``<slurm_dir>/<jobid>.log``.  ``slurm_dir``
must be on a file system every node shares: the run's secret travels in a
file there (mode 0600), never in the script or the job's environment,
which Slurm keeps and shows (``scontrol write batch_script``, ``sacct``).

One thread per backend keeps the state of every job it started: one
``squeue`` for all of them per second, and a look at the exit files of
running jobs four times a second, so ``status()`` is a lookup.  A job that
stays pending past ``schedule_timeout``, or whose pending reason can never
change (no node of the partition has what it asks), is cancelled and
reported as never run.

Every job of a run is named ``fiberrl-<run>`` (``scancel --name`` sweeps a
run) and carries ``--comment=fiberrl-owner=<owner>`` (``cleanup(owner)``
finds a process's jobs by it).
"""
from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field

from .base import NEVER_RAN_EXIT, Backend, Job, JobSpec, JobStatus, decode_text, remote_env, working_directory

log = logging.getLogger("fiberrl")

SECRET_ENV = "FIBERRL_RUN_SECRET"
SECRET_FILE_ENV = "FIBERRL_RUN_SECRET_FILE"
OWNER_TAG = "fiberrl-owner="
MASTER_SUFFIX = "-master"
# variables sbatch itself runs with (beyond them its environment is scrubbed):
# its own configuration, and who the job runs as
SBATCH_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "SLURM_CONF")
# variables of this shell a job always gets, beyond remote_env's
JOB_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ")

POLL_INTERVAL = 1.0
"""Seconds between the monitor's squeue calls."""
EXIT_FILE_INTERVAL = 0.25
"""Seconds between its looks at the exit files of running jobs..."""
QUICK_EXIT_CHECKS = 64
"""...while there are at most this many; else once per squeue."""
EXIT_FILE_GRACE = 3.0
"""Seconds a job Slurm says has ended may take to show its exit file (a
shared file system's caches) before Slurm's own exit code is taken."""
COMMAND_TIMEOUT = 60

ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
                 "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
                 "POWER_UP_NODE", "UPDATE_DB"}
QUEUED_STATES = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "CONFIGURING", "RESV_DEL_HOLD",
                 "POWER_UP_NODE"}
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


class SlurmError(RuntimeError):
    """Slurm refused a request; the message has Slurm's words and which setting to look at."""


@dataclass
class _State:
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


def _decode_wait_status(text: str) -> int | None:
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


def _output_pattern(path: str) -> str:
    """``path`` as an sbatch filename pattern (``%`` and ``\\`` are special there)."""
    return path.replace("\\", "\\\\").replace("%", "%%")


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


def _run(args: list[str], timeout: float = COMMAND_TIMEOUT, **kwargs) -> subprocess.CompletedProcess:
    if "input" not in kwargs:
        kwargs["stdin"] = subprocess.DEVNULL
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError:
        raise SlurmError(f"{args[0]} not found: the slurm backend runs where Slurm's client commands "
                         f"(sbatch, squeue, scancel) are installed and configured") from None


def _is_local_address(address: str) -> bool:
    try:
        if ipaddress.ip_address(address).is_loopback:
            return True
    except ValueError:
        return False
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def _route_source(address: str) -> str | None:
    """This host's source address on the route to ``address``."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 6817))
            return probe.getsockname()[0]
    except OSError:
        return None


def _resolve(name: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    addresses = []
    for family, *_, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in addresses:
            addresses.append(sockaddr[0])
    # IPv4 first: what cluster networks mostly route
    return sorted(addresses, key=lambda a: ":" in a)


class SlurmBackend(Backend):
    name = "slurm"

    def __init__(self):
        self._lock = threading.Lock()
        self._sbatch_lock = threading.Lock()
        self._jobs: dict[str, Job] = {}  # jobs not yet known to have ended
        self._wake = threading.Condition(self._lock)
        self._monitor: threading.Thread | None = None
        self._listen_host: str | None = None
        self._accounting: bool | None = None
        self._submitted = False
        self._stopping = False
        self._squeue_failures = 0
        self._warned_no_exit_file = False

    # --- settings -------------------------------------------------------------
    @staticmethod
    def _config():
        from ..config import get_config
        return get_config()

    def slurm_dir(self) -> str:
        path = os.path.abspath(os.path.expanduser(self._config().slurm_dir or "~/.fiberrl/slurm"))
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise SlurmError(f"cannot create slurm_dir {path}: {exc}; set slurm_dir to a directory on a file "
                             f"system every node shares") from None
        return path

    def _sbatch_env(self) -> dict[str, str]:
        """sbatch's own environment: its settings (SBATCH_*) and identity, nothing else,
        since with --export=ALL it is what the job starts from."""
        return {k: v for k, v in os.environ.items() if k in SBATCH_ENV or k.startswith("SBATCH_")}

    def _options(self, spec: JobSpec, slurm_dir: str, job_name: str, comment: str | None) -> list[str]:
        config = self._config()
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

    def _secret_file(self, spec: JobSpec, slurm_dir: str, name: str) -> tuple[dict[str, str], str | None]:
        """The job's environment with the run's secret moved into a 0600 file;
        the file's path if this call wrote it."""
        env = remote_env(spec.env, self._config().forward_env)
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

    def _sbatch(self, args: list[str], script: str, what: str) -> str:
        with self._sbatch_lock:
            try:
                done = _run(args, input=script, env=self._sbatch_env(), timeout=120)
            except subprocess.TimeoutExpired:
                raise SlurmError(f"sbatch did not answer within 120 s submitting {what}; is slurmctld up "
                                 f"(`scontrol ping`)?") from None
        if done.returncode != 0:
            message = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}")
            raise SlurmError(f"sbatch refused {what}: {message}\n{self._hint(message)}")
        job_id = done.stdout.strip().split(";")[0].strip()
        if not job_id.split("_")[0].isdigit():
            raise SlurmError(f"sbatch answered {done.stdout.strip()!r} for {what}, not a job id")
        return job_id

    def _hint(self, message: str) -> str:
        """Which setting to fix, by what sbatch complained about."""
        config = self._config()
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

    # --- jobs -----------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> Job:
        config = self._config()
        slurm_dir = self.slurm_dir()
        run = spec.run or "norun"
        env, _ = self._secret_file(spec, slurm_dir, f"{run}-{spec.owner or 'none'}.secret")
        script = batch_script(spec.command, env, slurm_dir, f"fiberrl process {spec.name!r} of run {run}")
        comment = f"{OWNER_TAG}{spec.owner}" if spec.owner else None
        args = self._options(spec, slurm_dir, f"fiberrl-{run}", comment)
        job_id = self._sbatch(args, script, f"a job for {spec.name}")
        now = time.monotonic()
        state = _State(id=job_id, submitted=now, pending_since=now, schedule_timeout=config.schedule_timeout,
                       exit_path=os.path.join(slurm_dir, f"{job_id}.exit"),
                       log_path=os.path.join(slurm_dir, f"{job_id}.log"))
        job = Job(id=job_id, spec=spec, handle=state)
        with self._lock:
            self._submitted = True
            self._jobs[job_id] = job
            self._ensure_monitor()
        return job

    def status(self, job: Job):
        state: _State = job.handle
        if state.done.is_set():
            return JobStatus.EXITED, state.exit_code
        if self._monitor is None:
            with self._lock:
                self._ensure_monitor()
        return (JobStatus.RUNNING, None) if state.ran else (JobStatus.PENDING, None)

    def wait(self, job: Job, timeout: float | None = None):
        state: _State = job.handle
        if self._monitor is None and not state.done.is_set():
            with self._lock:
                self._ensure_monitor()
        if state.done.wait(timeout):
            return state.exit_code
        return None

    def terminate(self, job: Job, force: bool = False) -> None:
        state: _State = job.handle
        if state.done.is_set():
            return
        with self._lock:
            state.killed = state.killed or force
            if not state.ran and state.cancel_code is None:
                state.cancel_code = -9 if force else -15
        if force or not state.ran:
            # Slurm makes SIGKILL a cancel (SIGTERM to every process of the
            # job, SIGKILL after KillWait), and a queued job takes no signals:
            # scancel it, which also signals it should it have started since
            self._scancel([state.id])
            return
        done = _run(["scancel", "--full", "--signal=TERM", state.id])
        message = (done.stderr or done.stdout).strip()
        if done.returncode != 0 and "completed" not in message and "Invalid job id" not in message:
            self._scancel([state.id])  # pending after all, or requeued

    def _scancel(self, ids: list[str], *extra: str) -> None:
        if not ids and not extra:
            return
        done = _run(["scancel", *extra, *ids])
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip()
            if "already completing or completed" not in message and "Invalid job id" not in message:
                log.warning("scancel %s: %s", " ".join([*extra, *ids]), message)

    # --- the monitor ------------------------------------------------------------
    def _ensure_monitor(self) -> None:
        """Start the monitor thread if it is not running (called with the lock held)."""
        if self._monitor is None and not self._stopping:
            self._monitor = threading.Thread(target=self._watch, name="fiberrl-slurm-monitor", daemon=True)
            self._monitor.start()

    def _watch(self) -> None:
        """The monitor: runs while there are jobs whose end it has not seen."""
        next_poll = 0.0
        while True:
            with self._lock:
                if not self._jobs or self._stopping:
                    self._monitor = None
                    return
                jobs = list(self._jobs.values())
            if time.monotonic() >= next_poll:
                snapshot_at = time.monotonic()
                queue = self._squeue(jobs)
                next_poll = snapshot_at + POLL_INTERVAL
            else:
                snapshot_at, queue = None, None
            try:
                self._update(jobs, queue, snapshot_at)
            except Exception:  # the monitor must survive anything
                log.exception("slurm backend: updating job states failed")
            with self._lock:
                self._wake.wait(EXIT_FILE_INTERVAL)

    def _squeue(self, jobs: list[Job]) -> dict[str, tuple[str, str, str, str]] | None:
        names = sorted({f"fiberrl-{job.spec.run or 'norun'}" for job in jobs})
        args = ["squeue", "-h", "-t", "all", "-u", str(os.getuid()), f"--name={','.join(names)}",
                "-O", "JobID:|,State:|,Reason:|,NodeList:|,exit_code:|"]
        try:
            done = _run(args, timeout=30)
        except (subprocess.TimeoutExpired, SlurmError) as exc:
            self._squeue_failed(str(exc))
            return None
        if done.returncode != 0:
            self._squeue_failed(done.stderr.strip() or f"exit status {done.returncode}")
            return None
        self._squeue_failures = 0
        out = {}
        for line in done.stdout.splitlines():
            fields = [f.strip() for f in line.split("|")]
            if len(fields) >= 5 and fields[0]:
                out[fields[0]] = (fields[1], fields[2], fields[3], fields[4])
        return out

    def _squeue_failed(self, message: str) -> None:
        self._squeue_failures += 1
        if self._squeue_failures == 30:
            log.warning("slurm backend: squeue keeps failing (%s); job states come from exit files only "
                        "until it answers, and no pending job times out", message)

    @staticmethod
    def _read_exit_file(path: str) -> int | None:
        """The code in an exit file, once it is complete (newline-terminated)."""
        try:
            with open(path) as fh:
                text = fh.read()
            return int(text) if text.endswith("\n") else None
        except (OSError, ValueError):
            return None

    def _update(self, jobs: list[Job], queue, snapshot_at: float | None) -> None:
        now = time.monotonic()
        to_cancel: list[Job] = []
        finished: list[tuple[Job, int, str | None]] = []
        # between squeue calls only the exit files of running jobs are looked
        # at, and only while they are few (each look is a lookup on a shared
        # file system); the rest wait for the next squeue
        quick = sum(1 for job in jobs if job.handle.ran) <= QUICK_EXIT_CHECKS
        for job in jobs:
            state: _State = job.handle
            if queue is None and not (quick and state.ran):
                continue
            code = self._read_exit_file(state.exit_path)
            if code is not None:
                finished.append((job, code, None))
                continue
            if queue is None:
                continue
            entry = queue.get(state.id)
            if entry is None:
                # left the queue; a snapshot begun before sbatch returned may not show it yet
                if snapshot_at is None or snapshot_at < state.submitted:
                    continue
                if state.ended_at is None:
                    state.ended_at = now
                if now - state.ended_at >= EXIT_FILE_GRACE:
                    finished.append((job, *self._lost_code(state)))
                continue
            slurm_state, reason, node, raw_code = entry
            slurm_state = slurm_state.split()[0] if slurm_state else ""
            if slurm_state == "PENDING" and state.state != "PENDING":
                state.pending_since = now  # suspended and requeued by an operator, say
            state.state, state.reason = slurm_state, reason
            if node and slurm_state not in QUEUED_STATES:
                state.node = node
                if not state.ran:
                    state.ran = True
                    job.host = node
            if slurm_state in ACTIVE_STATES:
                if slurm_state == "PENDING":
                    waited = now - state.pending_since
                    if self._never_schedulable(reason):
                        hint = REASON_HINTS.get(reason.split(",")[0], "the request exceeds what the cluster allows")
                        job.error = (f"Slurm job {state.id} can never start: squeue says {reason} ({hint}); "
                                     f"check meta(cpu/mem/gpu) and slurm_partition, slurm_options")
                        to_cancel.append(job)
                    elif waited > state.schedule_timeout:
                        hint = REASON_HINTS.get(reason.split(",")[0], "")
                        job.error = (f"Slurm job {state.id} was not scheduled within schedule_timeout="
                                     f"{state.schedule_timeout:g}s (squeue reason: {reason}"
                                     f"{'; ' + hint if hint else ''}); raise schedule_timeout or ask for fewer "
                                     f"resources")
                        to_cancel.append(job)
                continue
            # Slurm says it ended: the exit file should follow at once
            state.slurm_state = slurm_state
            state.slurm_code = _decode_wait_status(raw_code)
            if state.ended_at is None:
                state.ended_at = now
            if not state.ran and slurm_state in ("CANCELLED", "BOOT_FAIL", "DEADLINE", "FAILED"):
                finished.append((job, *self._never_ran_code(state, slurm_state, reason)))
            elif now - state.ended_at >= EXIT_FILE_GRACE:
                finished.append((job, *self._ended_code(state)))
        if to_cancel:
            self._scancel([job.id for job in to_cancel])
            finished += [(job, NEVER_RAN_EXIT, job.error) for job in to_cancel]
        for job, code, error in finished:
            self._finish(job, code, error)

    @staticmethod
    def _never_schedulable(reason: str) -> bool:
        head = reason.split(",")[0].strip()
        return head in FATAL_REASONS or bool(FATAL_REASON_PATTERN.match(head))

    def _never_ran_code(self, state: _State, slurm_state: str, reason: str) -> tuple[int, str | None]:
        if state.cancel_code is not None:
            return state.cancel_code, None
        if slurm_state == "CANCELLED":
            return NEVER_RAN_EXIT, f"Slurm job {state.id} was cancelled before it started (scancel by someone else?)"
        return NEVER_RAN_EXIT, f"Slurm job {state.id} ended as {slurm_state} before it started ({reason})"

    def _ended_code(self, state: _State) -> tuple[int, str | None]:
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

    def _lost_code(self, state: _State) -> tuple[int, str | None]:
        """A job gone from the queue without an exit file: Slurm's accounting, else lost (-9)."""
        if state.cancel_code is not None:
            return state.cancel_code, None
        if state.slurm_state:
            return self._ended_code(state)
        accounted = self._sacct(state.id)
        if accounted is not None:
            slurm_state, code, ran = accounted
            if not ran:
                return NEVER_RAN_EXIT, f"Slurm job {state.id} ended as {slurm_state} before it started"
            if code is not None:
                return code, None
        log.warning("Slurm job %s left the queue without writing its exit code (cancelled with scancel, or its "
                    "node failed; log: %s); taking it as killed", state.id, state.log_path)
        return -9, None

    def _sacct(self, job_id: str) -> tuple[str, int | None, bool] | None:
        if self._accounting is False:
            return None
        try:
            done = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode,NodeList"], timeout=30)
        except (subprocess.TimeoutExpired, SlurmError):
            return None
        if done.returncode != 0 or "disabled" in done.stderr:
            self._accounting = False
            return None
        self._accounting = True
        for line in done.stdout.splitlines():
            fields = line.split("|")
            if len(fields) >= 3:
                slurm_state = fields[0].split()[0] if fields[0] else ""
                ran = fields[2].strip() not in ("", "None assigned")
                return slurm_state, _decode_wait_status(fields[1]), ran
        return None

    def _finish(self, job: Job, code: int, error: str | None) -> None:
        state: _State = job.handle
        with self._lock:
            if state.done.is_set():
                return
            if error and not job.error:
                job.error = error
            if state.killed and code < 0:
                code = -9
            state.exit_code = code
            self._jobs.pop(job.id, None)
            state.done.set()
        for path in (state.exit_path,):
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            if os.path.getsize(state.log_path) == 0:
                os.unlink(state.log_path)
        except OSError:
            pass

    # --- network ----------------------------------------------------------------
    def listen_host(self) -> str:
        if self._listen_host is None:
            self._listen_host = self._find_listen_host()
        return self._listen_host

    def _find_listen_host(self) -> str:
        """The source address of the route to the controller, or else to a
        compute node; when all of them are this host, its name's address, and
        loopback only when that is all it has."""
        targets = []
        try:
            done = _run(["scontrol", "show", "config"], timeout=30)
            for line in done.stdout.splitlines():
                match = re.match(r"\s*(SlurmctldHost|ControlMachine|ControlAddr)\S*\s*=\s*(\S+)", line)
                if match:
                    host, _, addr = match.group(2).partition("(")
                    targets.append(addr.rstrip(")") or host)
            done = _run(["sinfo", "-h", "-N", "-o", "%o"], timeout=30)
            targets += [name.strip() for name in done.stdout.split()[:16] if name.strip()]
        except (subprocess.TimeoutExpired, SlurmError):
            pass
        for target in targets:
            for address in _resolve(target):
                if _is_local_address(address):
                    continue
                source = _route_source(address)
                if source and not ipaddress.ip_address(source.split("%")[0]).is_loopback:
                    return source
        # the controller and the nodes are this host: its name's address, else loopback
        try:
            hostname = socket.gethostname()
        except OSError:
            hostname = ""
        for address in _resolve(hostname) if hostname else []:
            if not ipaddress.ip_address(address.split("%")[0]).is_loopback and _is_local_address(address):
                return address
        return "127.0.0.1"

    # --- cleanup --------------------------------------------------------------
    def needs_reaper(self) -> bool:
        return True

    def cleanup(self, owner: str) -> None:
        from . import OWNER
        if owner == OWNER:
            # this process is exiting: its monitor stops with it
            with self._lock:
                self._stopping = True
                monitor = self._monitor
                self._wake.notify_all()
            if monitor is not None:
                monitor.join(5)
            with self._lock:
                self._stopping = False  # status() and wait() start it again should they be asked
            if not self._submitted:
                return  # this process started no job
        try:
            done = _run(["squeue", "-h", "-u", str(os.getuid()), "-o", "%i|%k"], timeout=30)
            ids = [line.split("|", 1)[0].strip() for line in done.stdout.splitlines()
                   if line.partition("|")[2].strip() == f"{OWNER_TAG}{owner}"]
            self._scancel(ids)
        except (subprocess.TimeoutExpired, SlurmError) as exc:
            log.warning("slurm backend: cannot cancel the jobs of %s: %s", owner, exc)
        try:
            slurm_dir = self.slurm_dir()
            for name in os.listdir(slurm_dir):
                if name.endswith(f"-{owner}.secret"):
                    os.unlink(os.path.join(slurm_dir, name))
        except (OSError, SlurmError):
            pass

    # --- `fiberrl submit` -----------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        slurm_dir = self.slurm_dir()
        run = spec.run or uuid.uuid4().hex[:12]
        spec_env = dict(spec.env)
        spec_env.setdefault("PYTHONUNBUFFERED", "1")  # its log is followed as it runs
        spec = JobSpec(**{**spec.__dict__, "env": spec_env})
        env, secret_path = self._secret_file(spec, slurm_dir, f"{run}-submit-{uuid.uuid4().hex[:8]}.secret")
        script = batch_script(spec.command, env, slurm_dir, f"fiberrl run {run}: master", remove_after=secret_path)
        args = self._options(spec, slurm_dir, f"fiberrl-{run}{MASTER_SUFFIX}", f"fiberrl-run={run}")
        try:
            job_id = self._sbatch(args, script, f"the master of run {run}")
        except BaseException:
            if secret_path:
                os.unlink(secret_path)
            raise
        with open(os.path.join(slurm_dir, f"{job_id}.run"), "w") as fh:
            fh.write(run + "\n")
        return job_id

    def _queue_entry(self, job_id: str) -> tuple[str, str, str, str, str] | None:
        done = _run(["squeue", "-h", "-t", "all", "-j", job_id, "-O",
                     "JobID:|,State:|,Reason:|,NodeList:|,exit_code:|,Name:|"], timeout=30)
        for line in done.stdout.splitlines():
            fields = [f.strip() for f in line.split("|")]
            if len(fields) >= 6 and fields[0] == job_id:
                return fields[1], fields[2], fields[3], fields[4], fields[5]
        return None

    def describe(self, job_id: str) -> dict:
        slurm_dir = self.slurm_dir()
        entry = self._queue_entry(job_id)
        code = self._read_exit_file(os.path.join(slurm_dir, f"{job_id}.exit"))
        if entry is not None:
            slurm_state, reason, node, raw, _ = entry
            if slurm_state in QUEUED_STATES:
                return {"id": job_id, "state": "pending", "exit_code": None, "where": None,
                        "reason": reason, "slurm_state": slurm_state}
            if slurm_state in ACTIVE_STATES and code is None:
                return {"id": job_id, "state": "running", "exit_code": None, "where": node or None,
                        "slurm_state": slurm_state}
            if code is None:
                code = _decode_wait_status(raw) if node else NEVER_RAN_EXIT
            return {"id": job_id, "state": "exited", "exit_code": code, "where": node or None,
                    "slurm_state": slurm_state}
        if code is not None:
            return {"id": job_id, "state": "exited", "exit_code": code, "where": None}
        accounted = self._sacct(job_id)
        if accounted is not None:
            slurm_state, code, ran = accounted
            return {"id": job_id, "state": "exited", "exit_code": code if ran else NEVER_RAN_EXIT, "where": None,
                    "slurm_state": slurm_state}
        return {"id": job_id, "state": "unknown", "exit_code": None, "where": None}

    def logs(self, job_id: str, follow: bool = False):
        return decode_text(self._log_bytes(os.path.join(self.slurm_dir(), f"{job_id}.log"), job_id, follow))

    def _log_bytes(self, path: str, job_id: str, follow: bool):
        position = 0
        while True:
            # the state first: all the output is in the file once the job has ended
            ended = follow and self.describe(job_id)["state"] in ("exited", "unknown")
            try:
                with open(path, "rb") as fh:
                    fh.seek(position)
                    while data := fh.read(65536):
                        position += len(data)
                        yield data
            except FileNotFoundError:
                pass
            if not follow or ended:
                return
            time.sleep(0.5)

    def cancel(self, job_id: str) -> None:
        slurm_dir = self.slurm_dir()
        run = None
        entry = self._queue_entry(job_id)
        if entry is not None and entry[4].startswith("fiberrl-") and entry[4].endswith(MASTER_SUFFIX):
            run = entry[4][len("fiberrl-"):-len(MASTER_SUFFIX)]
        if run is None:
            try:
                with open(os.path.join(slurm_dir, f"{job_id}.run")) as fh:
                    run = fh.read().strip() or None
            except OSError:
                pass
        self._scancel([job_id])
        if run is None:
            return
        user = ["-u", str(os.getuid())]
        self._scancel([], f"--name=fiberrl-{run}", *user)
        # a master still stopping may submit more: sweep again once it has left
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            entry = self._queue_entry(job_id)
            if entry is None or entry[0] not in ACTIVE_STATES:
                break
            time.sleep(0.5)
        self._scancel([], f"--name=fiberrl-{run}", *user)


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
