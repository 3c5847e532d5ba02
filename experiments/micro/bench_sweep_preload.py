"""What a PBT segment of PPO costs to start, with its job forked with PPO and torch already imported
(``hydra.launcher.preload=true``, the default) and without (each job imports them itself).

    python experiments/micro/bench_sweep_preload.py [--passes 2] [--population 4] [--segments 5]
                                                    [--out DIR]

A small ``hydra/sweeper=pbt`` sweep of PPO on BipedalWalker-v3 (every member at once, segments of one
PPO iteration of 2 workers x 4 envs x 512 steps, 2 update epochs, so that starting a segment weighs as
much as running it) is run with each setting, in alternating order pass by pass, each in a fresh
folder. A segment's start is the time from the sweeper handing it to the launcher to its first
iteration beginning (its first metrics.jsonl row's ``wall_time - iteration_s``): forking its job,
Hydra's job set-up, the run's imports, its env servers starting, its checkpoint restored.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ITERATION = 2 * 4 * 512  # env steps of one PPO iteration: workers x envs_per_worker x num_steps


def sweep(folder: Path, preload: bool, population: int, segments: int) -> float:
    command = [sys.executable, "-m", "fiberrl", "-m", "hydra/sweeper=pbt", "+experiment=ppo_bipedal_walker",
               "workers=2", "algo.envs_per_worker=4", "algo.num_steps=512", "algo.num_minibatches=32",
               "algo.update_epochs=2", "algo.eval_every=2", "algo.eval_episodes=1", "algo.checkpoint_every=1",
               f"algo.total_timesteps={segments * ITERATION}", "tensorboard=false",
               f"hydra.sweeper.population={population}", f"hydra.sweeper.interval={ITERATION}",
               f"hydra.sweeper.burn_in={ITERATION}", "hydra.sweeper.seed=0", f"hydra.sweep.dir={folder}",
               f"hydra.launcher.runs_at_once={population}", "hydra.launcher.table=off",
               f"hydra.launcher.preload={str(preload).lower()}"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"the sweep in {folder} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return wall


def segment_starts(folder: Path) -> tuple[list[float], float]:
    """Each segment's start (s), and the member-seconds its iterations took in all."""
    events = [json.loads(line) for line in open(folder / "pbt.jsonl")]
    starts, iterating = [], 0.0
    for segment in (e for e in events if e["event"] == "segment"):
        rows = [json.loads(line) for line in open(folder / segment["folder"] / "metrics.jsonl")]
        rows = [row for row in rows if row["wall_time"] >= segment["time"]]  # this segment's, not its copy's
        if rows:
            starts.append(rows[0]["wall_time"] - rows[0]["iteration_s"] - segment["time"])
            iterating += sum(row["iteration_s"] for row in rows)
    return starts, iterating


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--population", type=int, default=4)
    parser.add_argument("--segments", type=int, default=5, help="segments each member runs")
    parser.add_argument("--out", help="keep the sweeps here (default: a temporary folder, removed)")
    args = parser.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_sweep_preload_"))
    results: dict[bool, list[tuple[float, list[float], float]]] = {True: [], False: []}
    print(f"PBT of PPO on BipedalWalker-v3: {args.population} members at once, {args.segments} segments of "
          f"{ITERATION:,} env steps each")
    print(f"{'pass':>4}  {'preload':<7}  {'wall s':>7}  {'segments':>8}  {'start mean s':>12}  {'median s':>8}  "
          f"{'share of member time':>20}")
    for number in range(args.passes):
        for preload in ((True, False) if number % 2 == 0 else (False, True)):
            folder = out / f"pass{number}_{'preload' if preload else 'imports'}"
            shutil.rmtree(folder, ignore_errors=True)
            wall = sweep(folder, preload, args.population, args.segments)
            starts, iterating = segment_starts(folder)
            results[preload].append((wall, starts, iterating))
            print(f"{number:>4}  {str(preload).lower():<7}  {wall:>7.1f}  {len(starts):>8}  "
                  f"{statistics.mean(starts):>12.2f}  {statistics.median(starts):>8.2f}  "
                  f"{sum(starts) / (sum(starts) + iterating):>20.3f}", flush=True)
    on, off = results[True], results[False]
    mean_start = {key: statistics.mean(s for _, starts, _ in runs for s in starts) for key, runs in results.items()}
    print(f"segment start: {mean_start[True]:.2f} s preloaded, {mean_start[False]:.2f} s importing "
          f"({mean_start[True] / mean_start[False]:.2f}x); sweep wall time, pass by pass: "
          + ", ".join(f"{a[0] / b[0]:.2f}x" for a, b in zip(on, off)))
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
