"""What a host fault costs a pool's map: a fault-free map and one with the fault, alternating.

    python experiments/micro/bench_host_faults.py [--hosts local|docker]
                                                  [--faults preempt partition:5 partition:30 pause:5 ...]
                                                  [--workers 4] [--tasks 200] [--task-s 0.1] [--rounds 3]

A map of ``--tasks`` tasks of ``--task-s`` seconds each (a sleep: the figures are the pool's, not
this shared machine's CPU), chunksize 1, on ``Pool(--workers)``; ``--hosts docker``: every worker a
container of the docker tests' image, standing in for a host, on a Docker network of the bench's
own (where a healed container gets its address back).  Each task leaves a file per execution in a
folder the workers share (the working directory, which the docker backend mounts), so tasks run
twice are counted, not assumed; results come through ``imap_unordered``, so one delivered twice
would be seen.  The faults, injected into a worker that is running a task, a third of the way into
the map and half-way through a task:

- ``preempt``: the host taken back with notice: SIGTERM (``docker stop -t 30`` on Docker),
  the worker's ``preempt_grace`` left at its default.
- ``partition:S`` (Docker): the host cut off for S seconds (``docker network disconnect``,
  then ``connect``), ``silence_timeout`` at its default.
- ``pause:S`` (Docker): the host stalled for S seconds (``docker pause``, then ``unpause``).

For each: when the master heard (the worker's tasks handed to others, or its loss; "-" where it
was never given up), when the worker had left and when its successor was working, tasks
reassigned, lost (no result), delivered twice and run twice (a cut-off host's task may have run
to its end there, its result never heard), tasks charged as a crash (``worker_restarts``), and
the map's extra time against the fault-free map of the same round.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import fiberrl.runtime as mp

REPO = Path(__file__).resolve().parents[2]


def task(x: int, folder: str, seconds: float) -> int:
    time.sleep(seconds)
    with open(os.path.join(folder, f"{x}.{os.getpid()}.{time.monotonic_ns()}"), "w"):
        pass
    return x


def task_of(args: tuple) -> int:
    return task(*args)


def docker_settings() -> dict:
    sys.path.insert(0, str(REPO / "tests"))
    from helpers import docker_backend  # the docker tests' image: this machine's libraries, this venv mounted
    why = docker_backend.available()
    if why:
        raise SystemExit(f"--hosts docker: {why}")
    return docker_backend.settings()


def a_running_worker(pool):
    """A worker that said it started a task it still runs (the pool's own records: this is a bench)."""
    scheduler = pool._scheduler
    with scheduler.lock:
        return next((w for w in scheduler.policy.workers.values()
                     if w.inflight and w.inflight[0].id == w.running), None)


NETWORK = "fiberrl-bench-host-faults"


def bench_network(api) -> str:
    """A Docker network of the bench's own: on the default bridge a healed container may get another address."""
    from helpers import host_faults
    if not api.networks(names=[NETWORK]):
        host_faults.make_network(api, NETWORK, "172.30.0.0/16", "172.30.0.1")
    return NETWORK


def cut_off(container: str, seconds: float, how: str) -> None:
    """Cut ``container`` off (``partition``) or stall it (``pause``) for ``seconds``, healed on a thread."""
    from helpers import docker_backend, host_faults
    api = docker_backend._client()
    address = host_faults.cut(api, container, how, NETWORK)

    def heal():
        time.sleep(seconds)
        host_faults.heal(api, container, how, NETWORK, address)
    threading.Thread(target=heal, daemon=True).start()


def preempt(process, hosts: str) -> None:
    if hosts == "docker":
        from helpers import docker_backend
        # returns once the container has stopped: on a thread of its own
        threading.Thread(target=docker_backend._client().stop, args=(process._job.handle.id,),
                         kwargs={"timeout": 30}, daemon=True).start()
    else:
        os.kill(process.pid, signal.SIGTERM)


def inject(fault: str, process, hosts: str) -> None:
    """``fault`` on the host of ``process`` (a job-backed Process)."""
    kind, _, seconds = fault.partition(":")
    if kind == "preempt":
        preempt(process, hosts)
    else:
        cut_off(process._job.handle.id, float(seconds), kind)


def fault_name(text: str) -> str:
    kind, _, seconds = text.partition(":")
    if kind == "preempt" and not seconds:
        return text
    if kind in ("partition", "pause"):
        try:
            if float(seconds) > 0:
                return text
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"{text!r}: a fault is preempt, partition:SECONDS or pause:SECONDS")


def one_map(pool, args, folder: str, fault: str | None) -> dict:
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    before = pool.statistics()
    started = time.monotonic()
    values = []
    done = threading.Event()

    def collect():
        values.extend(pool.imap_unordered(task_of, [(x, folder, args.task_s) for x in range(args.tasks)]))
        done.set()
    threading.Thread(target=collect, daemon=True).start()
    figures: dict = {}
    if fault:
        # a third of the way in, half-way through a task (the workers run theirs in step)
        time.sleep(args.tasks * args.task_s / args.workers / 3 + args.task_s / 2)
        while (victim := a_running_worker(pool)) is None:
            time.sleep(0.01)
        told = time.monotonic()
        inject(fault, victim.process, args.hosts)
        workers = pool._scheduler.policy.workers
        # getattr: the bench also measures the commit before cut-off workers were given up
        while not (victim.retiring or getattr(victim, "cut_off", False) or victim.id not in workers or done.is_set()):
            time.sleep(0.005)
        if victim.retiring or getattr(victim, "cut_off", False) or victim.id not in workers:  # else never given up
            figures["heard_s"] = time.monotonic() - told
            while victim.id in workers:
                time.sleep(0.01)
            figures["left_s"] = time.monotonic() - told
            while pool.statistics().workers_alive < args.workers:
                time.sleep(0.01)
            figures["replaced_s"] = time.monotonic() - told
    if not done.wait(600):
        raise SystemExit("the map did not end in 600 s")
    figures["wall_s"] = time.monotonic() - started
    after = pool.statistics()
    runs = [int(name.split(".")[0]) for name in os.listdir(folder)]
    figures["lost"] = len(set(range(args.tasks)) - set(values))
    figures["delivered_twice"] = len(values) - len(set(values))
    figures["twice"] = len(runs) - len(set(runs))
    figures["reassigned"] = after.tasks_resubmitted - before.tasks_resubmitted
    figures["crashes"] = after.worker_restarts - before.worker_restarts
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", choices=("local", "docker"), default="local")
    parser.add_argument("--faults", nargs="+", type=fault_name, default=["preempt"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--task-s", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.hosts == "docker":
        settings = docker_settings()  # makes the tests' helpers importable
        from helpers import docker_backend
        mp.configure(**settings, docker_network=bench_network(docker_backend._client()))
    elif any(f != "preempt" for f in args.faults):
        raise SystemExit("partition and pause are faults of --hosts docker")
    folder = tempfile.mkdtemp(prefix="bench-host-faults-", dir=os.getcwd())  # where the docker backend mounts
    rows: dict[str, list[dict]] = {"none": [], **{f: [] for f in args.faults}}
    pool = mp.Pool(args.workers)
    try:
        one_map(pool, args, folder, None)  # warm: every worker up and the function loaded
        for round_ in range(args.rounds):
            for fault in (rows if round_ % 2 == 0 else reversed(rows)):
                figures = one_map(pool, args, folder, None if fault == "none" else fault)
                rows[fault].append(figures)
                print(f"round {round_ + 1} {fault}: " + ", ".join(
                    f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()), flush=True)
        pool.close()
        pool.join()
    finally:
        pool.terminate()
        shutil.rmtree(folder, ignore_errors=True)

    ideal = args.tasks * args.task_s / args.workers
    base = statistics.median(r["wall_s"] for r in rows["none"])
    print(f"\nhost faults, {args.hosts} hosts, Pool({args.workers}), {args.tasks} tasks of {args.task_s} s "
          f"(ideal {ideal:.1f} s), {args.rounds} rounds, medians")
    print(f"{'fault':<15}{'given up':>9}{'heard s':>9}{'left s':>8}{'replaced s':>12}{'reassigned':>12}{'lost':>6}"
          f"{'delivered 2x':>14}{'ran 2x':>8}{'crashes':>9}{'map s':>8}{'extra s':>9}")
    for fault, runs in rows.items():
        def med(key):
            seen = [r[key] for r in runs if key in r]
            return statistics.median(seen) if seen else float("nan")
        given_up = f"{sum('heard_s' in r for r in runs)}/{len(runs)}" if fault != "none" else "-"
        print(f"{fault:<15}{given_up:>9}{med('heard_s'):>9.2f}{med('left_s'):>8.2f}{med('replaced_s'):>12.2f}"
              f"{max(r['reassigned'] for r in runs):>12}{max(r['lost'] for r in runs):>6}"
              f"{max(r['delivered_twice'] for r in runs):>14}{max(r['twice'] for r in runs):>8}"
              f"{max(r['crashes'] for r in runs):>9}{med('wall_s'):>8.2f}{med('wall_s') - base:>9.2f}")
    lost = sum(r["lost"] + r["delivered_twice"] for runs in rows.values() for r in runs)
    print(f"bench_host_faults: hosts={args.hosts} lost_or_delivered_twice={lost} " + " ".join(
        f"{fault}_extra_s={statistics.median(r['wall_s'] for r in runs) - base:.2f}"
        for fault, runs in rows.items() if fault != "none"))


if __name__ == "__main__":
    main()
