"""An ES iteration with one slow host among four, without and with the pool's backup tasks.

    python experiments/micro/bench_slow_host.py [--iterations 10] [--slow-cpus 0.2] [--population 48]

Four ES workers, each a Docker container (the docker tests' image) standing in for a host; from
the second iteration on, one of them is held to ``--slow-cpus`` of a CPU (``docker update
--cpus``).  Three runs of the same seed, one after another: no slow host; the slow host; the
slow host with ``algo.backup_tasks=true``.  Each iteration's wall time is taken between the
run's iteration callbacks; the figures are medians over the iterations after the second.  The
three runs' parameters must be the same bit for bit.  The tasks are BipedalWalker episodes
capped at ``--episode-steps``, one perturbation a task.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import fiberrl.runtime as mp
from fiberrl.app import run
from fiberrl.app_config import compose

REPO = Path(__file__).resolve().parents[2]


def one_run(args, folder: Path, name: str, slow: bool, backups: bool) -> tuple[list[float], np.ndarray, dict]:
    from helpers import docker_backend
    api = docker_backend._client()
    cfg = compose(["env=bipedal_walker", f"algo.population={args.population}", "algo.eval_episodes=0",
                   f"algo.episode_steps={args.episode_steps}", "algo.chunksize=1", "algo.noise_size=5000000",
                   "workers=4", "tensorboard=false", f"algo.iterations={args.iterations}", "seed=0",
                   f"algo.backup_tasks={str(backups).lower()}"])
    marks, stats = [], {}

    def on_iteration(iteration, pool):
        marks.append(time.monotonic())
        if slow and iteration == 1:
            with pool._scheduler.lock:  # a bench: the pool's own records
                worker = next(iter(pool._scheduler.policy.workers.values()))
            api.update_container(worker.process._job.handle.id, cpu_period=100_000,
                                 cpu_quota=int(args.slow_cpus * 100_000))
        stats.update(vars(pool.statistics()))
    summary = run(cfg, folder / name, on_iteration=on_iteration)
    return [b - a for a, b in zip(marks, marks[1:])], summary["theta"], stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--slow-cpus", type=float, default=0.2)
    parser.add_argument("--population", type=int, default=48)
    parser.add_argument("--episode-steps", type=int, default=200)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    from helpers import docker_backend
    why = docker_backend.available()
    if why:
        raise SystemExit(f"needs the docker backend: {why}")
    mp.configure(**docker_backend.settings())
    rows = {}
    with tempfile.TemporaryDirectory(prefix="bench-slow-host-", dir=REPO / "runs") as folder:
        for name, slow, backups in (("no slow host", False, False), ("slow host", True, False),
                                    ("slow host, backup tasks", True, True)):
            times, theta, stats = one_run(args, Path(folder), name.replace(" ", "_").replace(",", ""), slow, backups)
            rows[name] = (statistics.median(times[2:]), theta, stats)
            print(f"{name}: iterations {', '.join(f'{t:.2f}' for t in times)} s; "
                  f"tasks backed up {stats['tasks_backed_up']}, backups first {stats['backups_first']}", flush=True)
    base = rows["no slow host"][0]
    print(f"\nES on BipedalWalker, population {args.population} (tasks {2 * args.population}, episodes capped at "
          f"{args.episode_steps} steps), 4 Docker workers, one at {args.slow_cpus} CPU; medians of iterations "
          f"3-{args.iterations}")
    print(f"{'run':<26}{'iteration s':>13}{'x no slow host':>16}{'backed up':>11}{'backups first':>15}")
    for name, (median, _, stats) in rows.items():
        print(f"{name:<26}{median:>13.2f}{median / base:>16.2f}{stats['tasks_backed_up']:>11}"
              f"{stats['backups_first']:>15}")
    same = all(np.array_equal(rows["no slow host"][1], theta) for _, theta, _ in rows.values())
    print(f"bench_slow_host: same_parameters={same} slow_x={rows['slow host'][0] / base:.2f} "
          f"backups_x={rows['slow host, backup tasks'][0] / base:.2f}")


if __name__ == "__main__":
    main()
