"""PPO with and without ``algo.async_rollouts``, the same settings and
budget, runs alternating (sync, async, sync, async...) so that a drift of
the machine's load falls on both: env steps per second, what an update's
time goes to (sync: collecting the rollout, then training; async: training,
then waiting for the rollout collected meanwhile), what collecting a
rollout takes (the policy's forward passes, the rest stepping the envs and
moving data), and the training episodes' mean return per budget slice, per
seed and their mean.

    python experiments/learning/bench_async_rollouts.py --env cartpole --steps 100000 --seeds 0,1
    python experiments/learning/bench_async_rollouts.py --env breakout_noframeskip --steps 100000 --seeds 0

Extra Hydra overrides for both: --set KEY=VALUE (repeatable).
"""
from __future__ import annotations

import argparse
import json
import statistics
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def binned_returns(metrics: list[dict], total: int, bins: int) -> list[float | None]:
    sums = [[0.0, 0] for _ in range(bins)]
    for m in metrics:
        if m.get("charts/episodic_return") is None:
            continue
        b = min((m["timesteps"] - 1) * bins // total, bins - 1)
        sums[b][0] += m["charts/episodic_return"] * m["charts/episodes"]
        sums[b][1] += m["charts/episodes"]
    return [s / n if n else None for s, n in sums]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="cartpole")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=lambda text: [int(x) for x in text.split(",") if x.strip()], default=[0, 1])
    parser.add_argument("--bins", type=int, default=5)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from fiberrl.app import run
    from fiberrl.app_config import compose

    out = args.out or REPO / "experiments" / "results" / "async_rollouts" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in args.seeds:
        for mode in ("sync", "async"):
            run_dir = out / f"{args.env}_{mode}_seed{seed}"
            cfg = compose(["algo=ppo", f"env={args.env}", "workers=2", f"seed={seed}", "tensorboard=false",
                           "algo.eval_every=0", f"algo.total_timesteps={args.steps}",
                           f"algo.async_rollouts={str(mode == 'async').lower()}", *args.set])
            print(f"{mode} seed {seed}: {run_dir}", flush=True)
            run(cfg, run_dir)
            metrics = read_metrics(run_dir)
            later = metrics[1:] or metrics  # the first update collects its rollout either way
            rows.append(dict(mode=mode, seed=seed, sps=metrics[-1]["timesteps"] / metrics[-1]["time_s"],
                             rollout_s=statistics.mean(m["rollout_s"] for m in later),
                             update_s=statistics.mean(m["update_s"] for m in later),
                             wait_s=statistics.mean(m.get("rollout_wait_s", 0.0) for m in later),
                             collect_s=statistics.mean(m["rollout_collect_s"] for m in later),
                             inference_s=statistics.mean(m["rollout_inference_s"] for m in later),
                             iteration_s=statistics.mean(m["iteration_s"] for m in later),
                             returns=binned_returns(metrics, args.steps, args.bins)))
    print(f"\n{args.env}, {args.steps:,} env steps a run, {' '.join(args.set)}")
    print(f"{'mode':6} {'seed':>4} {'SPS':>6} {'update s':>9} {'= rollout':>10} {'+ train':>8} {'+ wait':>7} "
          f"{'collect s':>10} {'inference':>10}  mean return per {args.steps // args.bins:,} steps")
    for r in rows:
        cells = " ".join("-" if v is None else f"{v:6.1f}" for v in r["returns"])
        print(f"{r['mode']:6} {r['seed']:>4} {r['sps']:6.0f} {r['iteration_s']:9.3f} {r['rollout_s']:10.3f} "
              f"{r['update_s']:8.3f} {r['wait_s']:7.3f} {r['collect_s']:10.3f} {r['inference_s']:10.3f}  {cells}")
    means = {}
    for mode in ("sync", "async"):
        group = [r for r in rows if r["mode"] == mode]
        means[mode] = statistics.mean(r["sps"] for r in group)
        per_bin = [statistics.mean(v for v in col if v is not None) if any(v is not None for v in col) else None
                   for col in zip(*(r["returns"] for r in group), strict=True)]
        cells = " ".join("-" if v is None else f"{v:6.1f}" for v in per_bin)
        print(f"{mode:6} {'mean':>4} {means[mode]:6.0f} {'':>9} {'':>10} {'':>8} {'':>7} {'':>10} {'':>10}  {cells}")
    print(f"SPS, async / sync: {means['async'] / means['sync']:.2f}")
    (out / "summary.json").write_text(json.dumps(dict(args={k: str(v) for k, v in vars(args).items()}, rows=rows),
                                                 indent=1))


if __name__ == "__main__":
    main()
