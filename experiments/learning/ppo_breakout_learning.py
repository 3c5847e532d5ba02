"""PPO on Breakout for a budget this machine affords: three seeds of
``python -m fiberrl algo=ppo env=breakout`` (CleanRL's ppo_atari.py settings,
2 env servers of 4 envs), their return against env steps, and the plot.

    python experiments/learning/ppo_breakout_learning.py [--steps 100000] [--seeds 0,1,2] [--env breakout]
                                                         [--out experiments/results/ppo_breakout]

An env step is 4 emulator frames.  The learning rate anneals over ``--steps``,
as it would over CleanRL's 10M.  Reference: CleanRL's ppo_atari.py reaches an
episodic return of about 415 on BreakoutNoFrameskip-v4 after 10M steps; a
random policy scores about 1.5.  Prints each seed's mean return over the
episodes of its last 10% of steps, and writes ``curves.png`` beside the runs.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fiberrl.app import run
from fiberrl.app_config import compose
from fiberrl.plot import plot_runs
from fiberrl.run import RunDirectory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per seed (8 envs x 128 per update)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--env", default="breakout", help="env config: breakout (v5, sticky) or breakout_noframeskip")
    parser.add_argument("--out", default="experiments/results/ppo_breakout")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    finals = {}
    for seed in map(int, args.seeds.split(",")):
        run_dir = out / f"seed_{seed}"
        cfg = compose(["algo=ppo", f"env={args.env}", "workers=2", f"seed={seed}",
                       f"algo.total_timesteps={args.steps}", "algo.eval_every=0", "algo.checkpoint_every=25",
                       *([f"resume={run_dir}"] if list((run_dir / "checkpoints").glob("*.npz")) else [])])
        run(cfg, run_dir)
        metrics = RunDirectory(run_dir, {}).read_metrics()
        late = [m for m in metrics if m["timesteps"] > 0.9 * args.steps and m["charts/episodic_return"] is not None]
        finals[seed] = float(np.mean([m["charts/episodic_return"] for m in late])) if late else float("nan")
        print(f"seed {seed}: mean return over the last 10% of {args.steps:,} steps: {finals[seed]:.2f}", flush=True)
    path = plot_runs([out], out / "curves.png", metric="charts/episodic_return")
    values = np.array(list(finals.values()))
    print(f"{args.env}, {args.steps:,} steps ({4 * args.steps:,} frames), {len(values)} seeds: "
          f"{values.mean():.2f} +- {values.std():.2f} (CleanRL at 10M steps: ~415; random: ~1.5); plot: {path}")


if __name__ == "__main__":
    main()
