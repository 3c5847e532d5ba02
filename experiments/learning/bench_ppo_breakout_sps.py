"""PPO's steps per second on Breakout, four programs with CleanRL's
ppo_atari settings (8 envs x 128 steps, 4 minibatches, 4 epochs), each run
alone on the machine for the same budget, in alternating order over
--rounds rounds:

- fiberrl, ``algo=ppo env=breakout_noframeskip env.engine=envpool`` (2 env
  servers of 4 envs, each an EnvPool batch);
- fiberrl on the gymnasium engine (the same, stepped in Python);
- CleanRL's ``ppo_atari_envpool.py`` (one EnvPool batch of 8 in its process);
- CleanRL's ``ppo_atari.py`` (gymnasium's vector env of 8).

Per program: SPS over the whole run (budget / wall time from launch, start-up
included) and the program's own last SPS; for fiberrl, what an update's time
goes to (the learner's training; the rollout's forward passes; the rest of
the rollout: stepping the envs and moving data), from its metrics.

    python experiments/learning/bench_ppo_breakout_sps.py --cleanrl-dir /tmp/cleanrl \\
        --cleanrl-python /tmp/venv-cleanrl/bin/python [--steps 20480] [--rounds 2]

The CleanRL interpreter needs, beyond what ppo_vs_cleanrl.py lists,
``envpool==0.8.4`` and ``gym==0.23.1``: CleanRL's envpool script is written
for EnvPool's gym API of that era (it sets attributes EnvPool 1.x makes
read-only, and takes ``reset()`` to return the observations alone, as gym
before 0.26 did); 0.8.4 is the oldest EnvPool with a Python 3.11 wheel.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from ppo_vs_cleanrl import ENV_ID, RUN_CLEANRL  # beside this script

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = ("fiberrl-envpool", "fiberrl-gymnasium", "cleanrl-envpool", "cleanrl")


def command(args, program: str, run_dir: Path) -> tuple[list[str], dict]:
    if program.startswith("fiberrl"):
        engine = program.split("-")[1]
        return ([sys.executable, "-m", "fiberrl", "algo=ppo", "env=breakout_noframeskip", f"env.engine={engine}",
                 "workers=2", "seed=0", f"algo.total_timesteps={args.steps}", "algo.eval_every=0",
                 "tensorboard=false", f"hydra.run.dir={run_dir}"], {})
    script = "ppo_atari_envpool.py" if program == "cleanrl-envpool" else "ppo_atari.py"
    env_id = "Breakout-v5" if program == "cleanrl-envpool" else ENV_ID
    path = os.pathsep.join(p for p in (str(args.cleanrl_dir), os.environ.get("PYTHONPATH")) if p)
    return ([args.cleanrl_python, "-c", RUN_CLEANRL, str(args.cleanrl_dir / "cleanrl" / script), "--seed", "0",
             "--total-timesteps", str(args.steps), "--env-id", env_id, "--no-cuda"], dict(PYTHONPATH=path))


def run_once(args, program: str, run_dir: Path) -> dict:
    run_dir.mkdir(parents=True, exist_ok=True)
    argv, env = command(args, program, run_dir)
    began = time.perf_counter()
    with open(run_dir / "out.log", "w") as log:
        code = subprocess.run(argv, cwd=run_dir if program.startswith("cleanrl") else REPO, stdout=log,
                              stderr=subprocess.STDOUT, env=dict(os.environ, **env)).returncode
    wall = time.perf_counter() - began
    if code != 0:
        raise SystemExit(f"{program} exited with {code}: see {run_dir / 'out.log'}")
    row = dict(program=program, wall_s=wall, sps=args.steps / wall)
    if program.startswith("fiberrl"):
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
        row.update(own_sps=metrics[-1]["charts/SPS"], update_s=statistics.mean(m["iteration_s"] for m in metrics),
                   train_s=statistics.mean(m["update_s"] for m in metrics),
                   inference_s=statistics.mean(m["rollout_inference_s"] for m in metrics),
                   collect_s=statistics.mean(m["rollout_collect_s"] for m in metrics))
    else:
        found = re.findall(r"SPS: (\d+)", (run_dir / "out.log").read_text())
        row["own_sps"] = int(found[-1]) if found else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_480)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cleanrl-dir", type=Path, required=True)
    parser.add_argument("--cleanrl-python", default=sys.executable)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or REPO / "experiments" / "results" / "ppo_breakout_sps" / datetime.now().strftime(
        "%Y-%m-%d_%H-%M-%S")
    rows = []
    for r in range(args.rounds):
        order = PROGRAMS if r % 2 == 0 else PROGRAMS[::-1]
        for program in order:
            row = run_once(args, program, out / f"round{r}" / program)
            print(f"round {r} {program:18} {row['sps']:6.0f} SPS from launch, {row['own_sps']} its own", flush=True)
            rows.append(row)
    print(f"\nBreakout, {args.steps:,} steps a run, {args.rounds} runs of each, one program at a time")
    means = {p: statistics.mean(r["sps"] for r in rows if r["program"] == p) for p in PROGRAMS}
    for program in PROGRAMS:
        own = [r["own_sps"] for r in rows if r["program"] == program and r["own_sps"] is not None]
        line = f"{program:18} {means[program]:6.0f} SPS from launch, own {statistics.mean(own):6.0f}"
        fiberrl = [r for r in rows if r["program"] == program and "update_s" in r]
        if fiberrl:
            update, train = (statistics.mean(r[k] for r in fiberrl) for k in ("update_s", "train_s"))
            inference, collect = (statistics.mean(r[k] for r in fiberrl) for k in ("inference_s", "collect_s"))
            stepping = (collect - inference) / update
            line += (f"; an update {update:.2f} s: learner {train / update:.0%}, forward passes "
                     f"{inference / update:.0%}, stepping and the rest of the rollout {stepping:.0%}")
        print(line)
    for ours in ("fiberrl-envpool", "fiberrl-gymnasium"):
        print(f"{ours} / cleanrl-envpool {means[ours] / means['cleanrl-envpool']:.2f}, "
              f"/ cleanrl {means[ours] / means['cleanrl']:.2f}")
    (out / "summary.json").write_text(json.dumps(dict(steps=args.steps, rows=rows, means=means), indent=1))


if __name__ == "__main__":
    main()
