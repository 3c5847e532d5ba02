"""PPO against CleanRL, per env step: CleanRL's own script and fiberrl's PPO
with the same settings, the same seeds and budget, each pair run at the same
time with one torch thread each (OMP_NUM_THREADS=1), so that both share the
machine alike.  Two tasks (``--task``):

- ``breakout``: ``ppo_atari.py`` against ``algo=ppo env=breakout_noframeskip``
  (BreakoutNoFrameskip-v4 with the same Atari preprocessing, 8 envs x 128
  steps, 4 minibatches, 4 epochs, lr 2.5e-4 annealed over the budget, clip
  0.1, entropy 0.01); 500k steps, bins of 100k.
- ``cartpole``: ``ppo.py`` against ``+experiment=ppo_cartpole`` (CartPole-v1,
  4 envs x 128 steps, 4 minibatches, 4 epochs, lr 2.5e-4 annealed, clip 0.2,
  entropy 0.01); 150k steps, bins of 25k.

Per seed and framework: the training episodes' mean return in each bin (for
Breakout an episode is a whole game: CleanRL records it before its life-loss
wrapper, fiberrl too), the return over the last 10% of steps, the wall time
from start to exit and the env steps per second (steps / wall time, start-up
included; each framework's own SPS is printed too).  Then the means over the
seeds, the SPS ratio, and one PNG: return against env steps and against wall
time, both frameworks, one line per seed.

    python experiments/learning/ppo_vs_cleanrl.py --task breakout --cleanrl-dir /tmp/cleanrl \
        --cleanrl-python /tmp/venv-cleanrl/bin/python
    python experiments/learning/ppo_vs_cleanrl.py --task cartpole --seeds 0,1,2,3,4 --cleanrl-dir /tmp/cleanrl \
        --cleanrl-python /tmp/venv-cleanrl/bin/python
    python experiments/learning/ppo_vs_cleanrl.py ... --steps 20480 --seeds 0      # smoke test

CleanRL runs from a checkout of https://github.com/vwxyzjn/cleanrl (--cleanrl-dir:
the folder holding cleanrl/ppo.py, cleanrl/ppo_atari.py and cleanrl_utils/) in an
interpreter of its own (--cleanrl-python), which needs CleanRL's gymnasium 0.29
(its wrappers' names changed in 1.0), and for Breakout the Atari ROMs:
    python3 -m venv /tmp/venv-cleanrl
    /tmp/venv-cleanrl/bin/pip install -c constraints.txt gymnasium==0.29.1 ale-py==0.9.1 'numpy<2' torch \\
        tyro tensorboard opencv-python-headless

A pair whose both runs finished is kept; a pair cut short runs again from its
start (the two must run side by side to be compared).

Flags:
    --task NAME            breakout (default) or cartpole
    --steps N              env steps per run (default: the task's; a Breakout env step is 4 frames)
    --seeds LIST           seeds (default 0,1)
    --bin N                steps per bin of the curves (default: the task's)
    --cleanrl-dir DIR      the CleanRL checkout (required)
    --cleanrl-python PATH  its interpreter (default: this one)
    --engine NAME          what steps fiberrl's envs: gymnasium (default, as CleanRL's script) or envpool
    --out DIR              results folder (default experiments/results/ppo_<task>_cleanrl/<timestamp>)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV_ID = "BreakoutNoFrameskip-v4"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# CleanRL's script, unchanged, run as __main__; for Atari after importing ale_py: ale-py 0.9 and later
# register the Atari ids on import (0.8 did it through an entry point, and it has no ROMs without a download)
RUN_CLEANRL_CLASSIC = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
RUN_CLEANRL = "import ale_py; " + RUN_CLEANRL_CLASSIC


@dataclass(frozen=True)
class Task:
    env_id: str
    script: str          # CleanRL's, in cleanrl/
    runner: str          # how CleanRL's interpreter runs it
    fiberrl: tuple       # fiberrl's arguments for the same settings
    steps: int           # the default budget
    bin: int             # the default bin of the curves
    needs: str           # what CleanRL's interpreter must import
    step_unit: str       # the x axis's label


TASKS = {
    "breakout": Task(ENV_ID, "ppo_atari.py", RUN_CLEANRL, ("algo=ppo", "env=breakout_noframeskip"), 500_000,
                     100_000, "gymnasium, tyro, torch, ale_py, tensorboard, cv2", "env steps (x4 frames)"),
    "cartpole": Task("CartPole-v1", "ppo.py", RUN_CLEANRL_CLASSIC, ("+experiment=ppo_cartpole",), 150_000, 25_000,
                     "gymnasium, tyro, torch, tensorboard", "env steps"),
}

# CleanRL's tensorboard events, read in its interpreter (which has tensorboard), printed as JSON lines
READ_EVENTS = """
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
events = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
events.Reload()
for tag in ("charts/episodic_return", "charts/SPS"):
    for e in events.Scalars(tag) if tag in events.Tags()["scalars"] else []:
        print(json.dumps(dict(tag=tag, step=e.step, value=e.value, wall=e.wall_time)))
"""


def start_fiberrl(args, seed: int, run_dir: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "fiberrl", *args.task.fiberrl, f"env.engine={args.engine}", "workers=2",
               f"seed={seed}", f"algo.total_timesteps={args.steps}", "algo.eval_every=0",
               "tensorboard=false", f"hydra.run.dir={run_dir}"]
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    return subprocess.Popen(command, cwd=REPO, env=dict(os.environ, **ONE_THREAD), stdout=log,
                            stderr=subprocess.STDOUT)


def start_cleanrl(args, seed: int, run_dir: Path) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    script = args.cleanrl_dir / "cleanrl" / args.task.script
    command = [args.cleanrl_python, "-c", args.task.runner, str(script), "--seed", str(seed), "--total-timesteps",
               str(args.steps), "--env-id", args.task.env_id, "--no-cuda"]
    path = os.pathsep.join(p for p in (str(args.cleanrl_dir), os.environ.get("PYTHONPATH")) if p)
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    return subprocess.Popen(command, cwd=run_dir, env=dict(os.environ, PYTHONPATH=path, **ONE_THREAD), stdout=log,
                            stderr=subprocess.STDOUT)


def run_pair(args, seed: int, out: Path) -> None:
    """Both runs of ``seed`` side by side; writes each run's wall time to pair.json."""
    pair = out / f"seed{seed}"
    record = pair / "pair.json"
    if record.exists():
        print(f"seed {seed}: already ran ({record})", flush=True)
        return
    pair.mkdir(parents=True, exist_ok=True)
    began, launched = time.perf_counter(), time.time()
    runs = {"fiberrl": start_fiberrl(args, seed, pair / "fiberrl"), "cleanrl": start_cleanrl(args, seed,
                                                                                            pair / "cleanrl")}
    print(f"seed {seed}: fiberrl pid {runs['fiberrl'].pid}, CleanRL pid {runs['cleanrl'].pid}; logs in {pair}",
          flush=True)
    wall, codes = {}, {}
    while len(wall) < len(runs):
        for name, process in runs.items():
            if name not in wall and process.poll() is not None:
                wall[name], codes[name] = time.perf_counter() - began, process.returncode
                print(f"seed {seed}: {name} exited with {process.returncode} after {wall[name]:.0f} s", flush=True)
        time.sleep(1)
    if any(codes.values()):
        raise SystemExit(f"seed {seed}: a run failed ({codes}); its log is in {pair}")
    record.write_text(json.dumps(dict(wall_s=wall, launched=launched)))


# --- each run's episodes -------------------------------------------------------------------

def fiberrl_episodes(run_dir: Path, wall_s: float, launched: float) -> tuple[list[tuple], float | None]:
    """(step, mean return, episodes, seconds since launch) per update, and the last update's own SPS."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    start_up = wall_s - lines[-1]["time_s"] if lines else 0.0  # time_s counts from the first update's start
    points = [(m["timesteps"], m["charts/episodic_return"], m["charts/episodes"], m["time_s"] + start_up)
              for m in lines if m.get("charts/episodic_return") is not None]
    return points, (lines[-1].get("charts/SPS") if lines else None)


def cleanrl_episodes(args, run_dir: Path, wall_s: float, launched: float) -> tuple[list[tuple], float | None]:
    """(step, return, 1, seconds since launch) per episode, and the last SPS CleanRL logged."""
    events = sorted((run_dir / "runs").glob("*/events.out.tfevents.*"))
    if not events:
        raise SystemExit(f"{run_dir}: CleanRL wrote no tensorboard events")
    found = subprocess.run([args.cleanrl_python, "-c", READ_EVENTS, str(events[-1].parent)], capture_output=True,
                           text=True, check=True).stdout
    rows = [json.loads(line) for line in found.splitlines()]
    points = [(r["step"], r["value"], 1, r["wall"] - launched) for r in rows if r["tag"] == "charts/episodic_return"]
    sps = [r["value"] for r in rows if r["tag"] == "charts/SPS"]
    return sorted(points), (sps[-1] if sps else None)


def binned(points, bin_steps: int, total: int) -> list[float | None]:
    """The mean return of the episodes that ended in each bin of ``bin_steps`` steps."""
    sums = [[0.0, 0] for _ in range(-(-total // bin_steps))]
    for step, value, count, _ in points:
        b = min(max(step - 1, 0) // bin_steps, len(sums) - 1)
        sums[b][0] += value * count
        sums[b][1] += count
    return [s / n if n else None for s, n in sums]


def late_mean(points, total: int) -> float | None:
    late = [(v, n) for step, v, n, _ in points if step > 0.9 * total]
    return sum(v * n for v, n in late) / sum(n for _, n in late) if late else None


# --- report ------------------------------------------------------------------------------

def fmt(value, spec=".1f") -> str:
    return "-" if value is None else format(value, spec)


def report(args, out: Path) -> None:
    rows = []
    for seed in args.seeds:
        pair = out / f"seed{seed}"
        if not (pair / "pair.json").exists():
            continue
        record = json.loads((pair / "pair.json").read_text())
        wall = record["wall_s"]
        for name, read in (("fiberrl", fiberrl_episodes), ("cleanrl", partial(cleanrl_episodes, args))):
            points, own_sps = read(pair / name, wall[name], record["launched"])
            rows.append(dict(framework=name, seed=seed, bins=binned(points, args.bin, args.steps),
                             late=late_mean(points, args.steps), wall_s=wall[name], sps=args.steps / wall[name],
                             own_sps=own_sps, points=points))
    if not rows:
        print("no pair finished")
        return
    bins = len(rows[0]["bins"])
    print(f"\n{args.task.env_id}, {args.steps:,} env steps per run, pairs run side by side, one torch thread each")
    head = " ".join(f"{f'<{(i + 1) * args.bin // 1000}k':>7}" for i in range(bins))
    print(f"{'framework':<9} {'seed':>4} {head} {'last 10%':>8} {'wall s':>7} {'SPS':>6} {'own SPS':>8}")
    for r in rows:
        cells = " ".join(f"{fmt(v):>7}" for v in r["bins"])
        print(f"{r['framework']:<9} {r['seed']:>4} {cells} {fmt(r['late']):>8} {r['wall_s']:>7.0f} {r['sps']:>6.0f} "
              f"{fmt(r['own_sps'], '.0f'):>8}")
    means = {}
    for name in ("fiberrl", "cleanrl"):
        group = [r for r in rows if r["framework"] == name]
        per_bin = [statistics.mean(v for v in col if v is not None) if any(v is not None for v in col) else None
                   for col in zip(*(r["bins"] for r in group), strict=True)]
        lates = [r["late"] for r in group if r["late"] is not None]
        means[name] = dict(sps=statistics.mean(r["sps"] for r in group), bins=per_bin,
                           late=statistics.mean(lates) if lates else None)
        cells = " ".join(f"{fmt(v):>7}" for v in per_bin)
        print(f"{name:<9} {'mean':>4} {cells} {fmt(means[name]['late']):>8} {'':>7} {means[name]['sps']:>6.0f}")
    print(f"SPS, fiberrl / CleanRL: {means['fiberrl']['sps'] / means['cleanrl']['sps']:.2f}")
    (out / "summary.json").write_text(json.dumps(dict(steps=args.steps, bin=args.bin, means=means,
                                                      rows=[{k: v for k, v in r.items() if k != "points"}
                                                            for r in rows]), indent=1))
    plot = out / f"ppo_{args.task_name}_cleanrl.png"
    draw(rows, plot, args)
    print(f"plot: {plot}")


def draw(rows, path: Path, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    colors, labelled = {"fiberrl": "C0", "cleanrl": "C1"}, set()
    for r in rows:
        steps = np.array([p[0] for p in r["points"]], float)
        returns = np.array([p[1] for p in r["points"]], float)
        weights = np.array([p[2] for p in r["points"]], float)
        wall = np.array([p[3] for p in r["points"]], float)
        # a running mean over 20,000 steps of episodes: CleanRL logs each episode, fiberrl each update's mean
        smooth = [np.average(returns[(steps > s - 20_000) & (steps <= s)], weights=weights[(steps > s - 20_000)
                                                                                          & (steps <= s)])
                  for s in steps]
        label = None if r["framework"] in labelled else {"fiberrl": "fiberrl",
                                                         "cleanrl": f"CleanRL {args.task.script}"}[r["framework"]]
        labelled.add(r["framework"])
        for ax, x in zip(axes, (steps, wall), strict=True):
            ax.plot(x, smooth, color=colors[r["framework"]], alpha=0.8, linewidth=1.2, label=label)
    axes[0].set_xlabel(args.task.step_unit)
    axes[1].set_xlabel("seconds since launch, side by side on 2 cores")
    axes[0].set_ylabel("training episodes' return (20k-step running mean)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left", fontsize="small")
    fig.suptitle(f"PPO on {args.task.env_id}, {args.steps:,} steps: one line per seed "
                 f"({', '.join(map(str, sorted({r['seed'] for r in rows})))})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(TASKS), default="breakout")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seeds", type=lambda text: [int(x) for x in text.split(",") if x.strip()], default=[0, 1])
    parser.add_argument("--bin", type=int, default=None)
    parser.add_argument("--cleanrl-dir", type=Path, required=True)
    parser.add_argument("--cleanrl-python", default=sys.executable)
    parser.add_argument("--engine", choices=("gymnasium", "envpool"), default="gymnasium")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.task_name, args.task = args.task, TASKS[args.task]
    args.steps = args.steps or args.task.steps
    args.bin = args.bin or args.task.bin
    if not (args.cleanrl_dir / "cleanrl" / args.task.script).is_file():
        parser.error(f"--cleanrl-dir {args.cleanrl_dir}: no cleanrl/{args.task.script} there; pass a checkout of "
                     f"https://github.com/vwxyzjn/cleanrl")
    probe = subprocess.run([args.cleanrl_python, "-c", f"import {args.task.needs}"], capture_output=True, text=True)
    if probe.returncode != 0:
        parser.error(f"--cleanrl-python {args.cleanrl_python} cannot run CleanRL: "
                     f"{(probe.stderr.strip().splitlines() or ['?'])[-1]} (see this script's docstring)")
    out = args.out or REPO / "experiments" / "results" / f"ppo_{args.task_name}_cleanrl" / datetime.now().strftime(
        "%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    print(f"results in {out}", flush=True)
    for seed in args.seeds:
        run_pair(args, seed, out)
    report(args, out)


if __name__ == "__main__":
    main()
