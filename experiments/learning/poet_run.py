"""A POET run this machine can afford, and what it grew.

    python experiments/learning/poet_run.py [--workers 2] [--iterations 60] [--out runs/poet-bench] [overrides...]

Runs ``+experiment=poet_small`` (short episodes, thresholds scaled to them)
and prints, over the iterations: ANNECS (terrains created and solved),
terrains created, active pairs, the hardest terrain solved (its encoding's
share of the encoding bounds, summed) and worker utilisation (busy time /
(workers x wall time)), then where the plots are: ``poet.png`` (all of that
over time) and ``terrains.png`` (the current population's terrains).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fiberrl.app import run  # noqa: E402
from fiberrl.app_config import compose  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=f"runs/poet-bench/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides")
    args = parser.parse_args()
    cfg = compose(["+experiment=poet_small", f"workers={args.workers}", f"seed={args.seed}",
                   f"algo.iterations={args.iterations}", "tensorboard=false", *args.overrides])
    out = Path(args.out)
    began = time.perf_counter()
    summary = run(cfg, out)
    wall = time.perf_counter() - began

    from fiberrl.run import RunDirectory
    metrics = RunDirectory(out, {}).read_metrics()
    print(f"\n{'iter':>5} {'ANNECS':>6} {'created':>7} {'active':>6} {'hardest solved':>14} {'utilisation':>11} "
          f"{'best score':>10}")
    every = max(1, len(metrics) // 15)
    for m in metrics[::every] + ([metrics[-1]] if (len(metrics) - 1) % every else []):
        hardest = "-" if m["hardest_solved"] is None else f"{m['hardest_solved']:.3f}"
        print(f"{m['iteration']:>5} {m['annecs']:>6} {m['envs_created']:>7} {m['active_pairs']:>6} {hardest:>14} "
              f"{m['utilisation']:>11.2f} {m['eval_reward']:>10.1f}")
    busy = sum(m["utilisation"] * m["iteration_s"] for m in metrics) / sum(m["iteration_s"] for m in metrics)
    print(f"\n{summary['iterations']} iterations, {summary['timesteps']:,} env steps in {wall:.0f} s on "
          f"{args.workers} workers; ANNECS {summary['annecs']}, terrains created {summary['envs_created']}, "
          f"worker utilisation {busy:.2f} (busy / (workers x wall))")
    for pair_id, encoding, score in summary["pairs"]:
        print(f"  pair {pair_id}: {encoding.describe()}  score {score:.1f}")
    print(f"plots: {out / 'poet.png'}  {out / 'terrains.png'}")


if __name__ == "__main__":
    main()
