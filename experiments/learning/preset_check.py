"""The short learning runs that check a change to an algorithm, its presets or
what they import: ES and PPO on CartPole and ``poet_small``, each on a fixed
seed and budget.  The runs are deterministic, so the same code logs the same
metrics; a restructuring must leave them as they were, row for row.

    python experiments/learning/preset_check.py runs/check/after                   # this checkout
    python experiments/learning/preset_check.py runs/check/before --repo ../before  # another one (a worktree)
    python experiments/learning/preset_check.py --compare runs/check/before runs/check/after

Each run goes into OUT/<name>/ with its output in OUT/<name>.log; ``--compare``
prints, per run, whether the two folders logged the same rows (the timing
columns left out) and the last eval reward of each, and exits 1 if any differs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RUNS = {
    "es_cartpole": ["algo=es", "env=cartpole", "workers=2", "seed=0", "algo.iterations=12"],
    "ppo_cartpole": ["+experiment=ppo_cartpole", "seed=0", "algo.total_timesteps=80000"],
    "poet_small": ["+experiment=poet_small", "workers=2", "seed=1", "algo.iterations=13"],
}
# what depends on the machine's load or clock, not on what the run computes; global_step: PPO's name for timesteps
# before the algorithms shared their metric names
TIMING = {"time_s", "wall_time", "iteration_s", "master_s", "rollout_s", "update_s", "rollout_wait_s",
          "rollout_collect_s", "rollout_inference_s", "charts/SPS", "utilisation", "pool_utilisation", "global_step"}


def run_all(out: Path, repo: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    for name, overrides in RUNS.items():
        if (out / name).exists():
            sys.exit(f"error: {out / name} exists already; choose another OUT")
        began = time.perf_counter()
        with open(out / f"{name}.log", "w") as log:
            code = subprocess.call([sys.executable, "-m", "fiberrl", *overrides, "tensorboard=false",
                                    f"hydra.run.dir={(out / name).resolve()}"], cwd=repo, env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
        print(f"{name}: exit {code} in {time.perf_counter() - began:.0f} s ({out / name})", flush=True)


def rows(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in path.read_text().splitlines()]


def compare(a: Path, b: Path) -> bool:
    same_everywhere = True
    for name in RUNS:
        ours, theirs = rows(a / name), rows(b / name)
        same = bool(ours) and ours == theirs
        same_everywhere &= same
        last = [r[-1].get("eval_reward") if r else None for r in (ours, theirs)]
        print(f"{name}: {len(ours)} and {len(theirs)} rows, {'the same' if same else 'DIFFERENT'} "
              f"(timing left out); last eval reward {last[0]} and {last[1]}")
    return same_everywhere


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, help="folder for the runs")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2],
                        help="the checkout to run (default: this one)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="two OUT folders to compare")
    args = parser.parse_args()
    if args.compare:
        same = compare(*args.compare)
        print(f"preset_check: {'same' if same else 'different'}")
        sys.exit(0 if same else 1)
    if args.out is None:
        parser.error("give OUT, or --compare A B")
    run_all(args.out, args.repo.resolve())


if __name__ == "__main__":
    main()
