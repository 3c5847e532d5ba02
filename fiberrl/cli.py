"""``fiberrl submit|status|logs|cancel|list``: a run's master as a job on a cluster.

    fiberrl submit --backend kubernetes --gpu 1 -v nfs -- python -m fiberrl algo=es workers=1024

The master job runs COMMAND with the chosen backend configured, so every
process it starts (pool workers, env servers, Ring members) is a job of the
same cluster.  The run gets a fresh secret; its jobs are named by the run's
id, which is what ``cancel`` sweeps.  What was submitted from this machine
is remembered in ``~/.fiberrl/submitted/`` for the other commands.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

from .runtime.backends import BACKENDS, JobSpec, make_backend
from .runtime.config import ENV_PREFIX, ConfigError, RuntimeConfig, configure, get_config
from .runtime.net import auth

CLUSTER_BACKENDS = [name for name in BACKENDS if name != "local"]
RECORDS = Path(os.environ.get("FIBERRL_HOME", Path.home() / ".fiberrl")) / "submitted"
# a bare claim name mounts where Fiber's `fiber run -v nfs` put it
DEFAULT_MOUNT = "/persistent"
# the master picks its own listen address; the rest of this process's settings travel
NOT_FORWARDED = {"host", "backend"}


class CommandError(Exception):
    """Bad input; the message says what was wrong and what to do."""


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.handler(args)
    except (CommandError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="fiberrl", description="Run a command as the master job of a run on a "
                                  "cluster (docker, kubernetes, slurm) and follow it.")
    commands = top.add_subparsers(required=True, metavar="COMMAND")

    submit = commands.add_parser("submit", help="run a command as the master job of a run on a cluster")
    submit.add_argument("--backend", required=True, choices=CLUSTER_BACKENDS)
    submit.add_argument("--image", help="image of the master (and, by default, of its workers)")
    submit.add_argument("--build", metavar="DOCKERFILE", help="build --image from this Dockerfile first")
    submit.add_argument("--context", default=".", help="build context of --build (default: .)")
    submit.add_argument("--push", action="store_true", help="push the built image to its registry")
    submit.add_argument("--cpu", type=float, help="cores of the master")
    submit.add_argument("--mem", type=int, help="memory of the master in MiB")
    submit.add_argument("--gpu", type=int, help="GPUs of the master")
    submit.add_argument("-v", "--volume", action="append", default=[], metavar="SRC[:DST[:ro]]",
                        help=f"mount a host path or a claim/volume (a bare name mounts at {DEFAULT_MOUNT})")
    submit.add_argument("-e", "--env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment variable of the master")
    submit.add_argument("--name", help="a name for the run (default: the command's program)")
    submit.add_argument("-d", "--detach", action="store_true", help="print the id and return; do not follow logs")
    submit.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    submit.set_defaults(handler=do_submit)

    for name, handler, text in (("status", do_status, "state of a submitted run"),
                                ("logs", do_logs, "output of a submitted run's master"),
                                ("cancel", do_cancel, "stop a submitted run and all its jobs")):
        command = commands.add_parser(name, help=text)
        command.add_argument("id", help="the id `fiberrl submit` printed (see `fiberrl list`)")
        if name == "logs":
            command.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
        command.set_defaults(handler=handler)

    listing = commands.add_parser("list", help="runs submitted from this machine")
    listing.set_defaults(handler=do_list)
    return top


# --- submit -------------------------------------------------------------------
def do_submit(args) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise CommandError("nothing to run: put the command after --, e.g. "
                         "fiberrl submit --backend docker -- python -m fiberrl algo=es")
    if args.build:
        build_image(args.build, args.context, args.image, args.push)
    elif args.push:
        raise CommandError("--push pushes what --build built; add --build DOCKERFILE")

    secret = secrets.token_bytes(32)
    run = auth.run_id(secret)
    config = get_config()
    if args.image:
        config = dataclasses.replace(config, image=args.image)
    # mounted for the master and, through its settings, for every job it starts: the code
    # a worker re-imports and the outputs it writes are where the master's are
    config = dataclasses.replace(config, volumes=",".join(filter(None, [config.volumes,
                                                                      *parse_mounts(args.volume)])))
    env = {**forwarded_settings(config), f"{ENV_PREFIX}BACKEND": args.backend,
           auth.SECRET_ENV: secret.hex(), "PYTHONUNBUFFERED": "1", **parse_env(args.env)}
    spec = JobSpec(command=command, name=args.name or Path(command[0]).name, env=env, cpu=args.cpu, mem=args.mem,
                   gpu=args.gpu, image=args.image or config.image or None, cwd=os.getcwd(), run=run, owner="")
    backend = cluster_backend(args.backend, config)
    try:
        job_id = backend.submit(spec)
    except (ValueError, RuntimeError, OSError) as exc:
        raise CommandError(f"the {args.backend} backend could not submit the run: {exc}") from None
    save_record(job_id, dict(id=job_id, backend=args.backend, run=run, command=command,
                             submitted=time.time(), settings=dataclasses.asdict(config)))
    print(f"submitted {job_id} on {args.backend} (run {run})", file=sys.stderr)
    print(f"  fiberrl logs -f {job_id}   fiberrl status {job_id}   fiberrl cancel {job_id}", file=sys.stderr)
    if args.detach:
        print(job_id)
        return 0
    return follow_to_the_end(backend, job_id)


def build_image(dockerfile: str, context: str, image: str | None, push: bool) -> None:
    if not image:
        raise CommandError("--build needs --image NAME[:TAG] to tag what it builds "
                         "(with --push, a name in your registry)")
    if not Path(dockerfile).is_file():
        raise CommandError(f"--build {dockerfile}: no such Dockerfile")
    steps = [["docker", "build", "-t", image, "-f", dockerfile, context]]
    if push:
        steps.append(["docker", "push", image])
    for step in steps:
        print("+ " + shlex.join(step), file=sys.stderr)
        try:
            code = subprocess.call(step)
        except FileNotFoundError:
            raise CommandError("--build runs `docker`, which is not installed here") from None
        if code != 0:
            raise CommandError(f"`{shlex.join(step)}` failed with exit code {code}; nothing was submitted")


def forwarded_settings(config: RuntimeConfig) -> dict[str, str]:
    """This process's runtime settings that differ from the defaults, as the
    FIBERRL_* variables that give the master (and so its workers) the same."""
    defaults = RuntimeConfig()
    out = {}
    for field in dataclasses.fields(RuntimeConfig):
        value = getattr(config, field.name)
        if field.name not in NOT_FORWARDED and value != getattr(defaults, field.name):
            out[ENV_PREFIX + field.name.upper()] = str(value)
    return out


def parse_env(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CommandError(f"--env {pair!r}: expected NAME=VALUE")
        out[name] = value
    return out


def parse_mounts(volumes: list[str]) -> list[str]:
    """``-v`` arguments as ``volumes`` entries: a bare name mounts at DEFAULT_MOUNT."""
    mounts = []
    for volume in volumes:
        source, _, rest = volume.partition(":")
        target = rest or DEFAULT_MOUNT
        if not source or not target.split(":")[0].startswith("/") or target.count(":") > 1 \
                or target.count(":") == 1 and not target.endswith((":ro", ":rw")):
            raise CommandError(f"-v {volume!r}: expected SRC, SRC:DST or SRC:DST:ro with DST an absolute path")
        mounts.append(f"{source}:{target}")
    return mounts


def follow_to_the_end(backend, job_id: str) -> int:
    for chunk in backend.logs(job_id, follow=True):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    # the log ends a moment before the cluster records the exit
    deadline = time.monotonic() + 60
    while True:
        info = backend.describe(job_id)
        if info["state"] in ("exited", "unknown") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    code = info.get("exit_code")
    print(f"{job_id}: {info['state']}" + (f" with exit code {code}" if code is not None else ""), file=sys.stderr)
    return code if isinstance(code, int) and 0 <= code < 256 else 1


# --- status, logs, cancel, list -----------------------------------------------
def do_status(args) -> int:
    record, backend = backend_of(args.id)
    info = backend.describe(record["id"])
    print(json.dumps({**info, "backend": record["backend"], "run": record["run"],
                      "command": shlex.join(record["command"])}, indent=2))
    return 0


def do_logs(args) -> int:
    record, backend = backend_of(args.id)
    for chunk in backend.logs(record["id"], follow=args.follow):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    return 0


def do_cancel(args) -> int:
    record, backend = backend_of(args.id)
    backend.cancel(record["id"])
    print(f"cancelled {record['id']} and the jobs of run {record['run']}", file=sys.stderr)
    return 0


def do_list(args) -> int:
    records = sorted((json.loads(p.read_text()) for p in RECORDS.glob("*.json")), key=lambda r: r["submitted"])
    for record in records:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record["submitted"]))
        print(f"{record['id']}\t{record['backend']}\t{when}\t{shlex.join(record['command'])}")
    return 0


def backend_of(job_id: str):
    path = record_path(job_id)
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in RECORDS.glob("*.json"))) or "none"
        raise CommandError(f"no run {job_id!r} was submitted from this machine (known: {known}); see `fiberrl list`")
    record = json.loads(path.read_text())
    valid = {f.name for f in dataclasses.fields(RuntimeConfig)}
    settings = {k: v for k, v in record["settings"].items() if k in valid}
    return record, cluster_backend(record["backend"], RuntimeConfig(**settings))


def cluster_backend(name: str, config: RuntimeConfig):
    """The backend ``name`` under ``config`` (for status/logs/cancel, the
    settings the run was submitted with), which this command then keeps."""
    configure(**dataclasses.asdict(config))
    try:
        return make_backend(name)
    except (ValueError, RuntimeError, OSError) as exc:
        raise CommandError(f"the {name} backend is not usable from here: {exc}") from None


def record_path(job_id: str) -> Path:
    return RECORDS / f"{job_id.replace('/', '_')}.json"


def save_record(job_id: str, record: dict) -> None:
    RECORDS.mkdir(parents=True, exist_ok=True)
    tmp = record_path(job_id).with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(record_path(job_id))


if __name__ == "__main__":
    sys.exit(main())
