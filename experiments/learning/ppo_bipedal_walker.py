"""PPO on BipedalWalker-v3 for 5M environment steps: fiberrl's preset
(``+experiment=ppo_bipedal_walker``: rl-baselines3-zoo's settings on 2 env
servers of 16 envs, its Gaussian starting at std e^-0.5, a std that never
rises, an annealed learning rate) against the peer, Stable-Baselines3's PPO
with the zoo's hyperparameters (32 envs in a DummyVecEnv as the zoo makes
them, VecNormalize with gamma 0.999), the same seeds, one after the other on this machine.

Per seed: the final policy's mean return over --eval-episodes episodes (100:
gymnasium's "solved" is a mean of 300 over 100 episodes), evaluated on its
mean action (SB3's ``deterministic=True``; fiberrl's ``eval_deterministic``)
with episode i reset with seed 10,000 + i; wall time and env steps per second.
A table of both, the ratio of their steps/s, and one PNG: the training
episodes' mean return per update against env steps and against wall time,
one line per seed, with the zoo's published 287.9 and the 300 of "solved".

With --solved-at (fiberrl's runs, made with ``--set keep_checkpoints=null``
so that every checkpoint stays): each checkpoint's policy over the same
--eval-episodes episodes, and the env steps at which the run first solved
the env: the first checkpoint at 300 or more whose policy also scores 300 or
more over as many other episodes (seeds 20,000 + i), so that a checkpoint
picked for a lucky set of episodes does not count (``solved.json``).

A fiberrl seed whose run folder holds a checkpoint but did not finish is
resumed (``resume=``); one that finished is only evaluated.  A peer seed that
has its final.json is kept; one cut short starts again.

    python experiments/learning/ppo_bipedal_walker.py                                # 3 seeds of each
    python experiments/learning/ppo_bipedal_walker.py --steps 131072 --seeds 0 --eval-episodes 2   # smoke test
    python experiments/learning/ppo_bipedal_walker.py --peer-python /tmp/venv-sb3/bin/python

The peer runs in a subprocess of --peer-python (default: this interpreter);
when that cannot import stable_baselines3 the peer is skipped with the
reason.  To make such an interpreter (outside the project's dependencies):
    python3 -m venv /tmp/venv-sb3
    /tmp/venv-sb3/bin/pip install -c constraints.txt stable-baselines3 'gymnasium[box2d]' torch matplotlib

Flags:
    --steps N           env steps per seed (default 5,000,000)
    --seeds LIST        seeds (default 0,1,2)
    --eval-episodes N   episodes of the final policy (default 100)
    --peer-python PATH  interpreter for the SB3 peer (default: this one)
    --set KEY=VALUE     a Hydra override of fiberrl's preset (repeatable), to try a change of it
    --solved-at         score every kept checkpoint: the env steps at which each fiberrl seed first solved the env
    --no-peer           run fiberrl only
    --peer-only         run only the peer (into --out, which may hold fiberrl's runs)
    --out DIR           results folder (default experiments/results/ppo_bipedal/<timestamp>)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV_ID = "BipedalWalker-v3"
ZOO_SCORE, SOLVED = 287.9, 300.0
EVAL_SEED = 10_000
CONFIRM_SEED = 20_000  # the other episodes that confirm a checkpoint found solved on EVAL_SEED's
ZOO = dict(n_envs=32, n_steps=2048, batch_size=64, gae_lambda=0.95, gamma=0.999, n_epochs=10, ent_coef=0.0,
           learning_rate=3e-4, clip_range=0.18)


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


# --- fiberrl ------------------------------------------------------------------------

def fiberrl_seed(args, seed: int, run_dir: Path) -> None:
    """Train (or resume, or skip when done) and write final.json: the final policy's evaluation."""
    overrides = ["+experiment=ppo_bipedal_walker", f"seed={seed}", f"algo.total_timesteps={args.steps}",
                 "tensorboard=false", *args.set]
    from fiberrl.app_config import compose
    cfg = compose(overrides)
    num_updates = args.steps // (cfg.workers * cfg.algo.envs_per_worker * cfg.algo.num_steps)
    metrics = read_metrics(run_dir)
    if not metrics or metrics[-1]["iteration"] + 1 < num_updates:
        command = [sys.executable, "-m", "fiberrl", *overrides]
        if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir()):
            command.append(f"resume={run_dir}")
        else:
            command.append(f"hydra.run.dir={run_dir}")
        if subprocess.run(command, cwd=REPO).returncode != 0:
            raise SystemExit(f"fiberrl seed {seed} failed; run the script again to resume it")
    from fiberrl.evaluate import evaluate
    started = time.perf_counter()
    returns = [r for r, _ in evaluate(run_dir, episodes=args.eval_episodes, seed=EVAL_SEED, which="latest")]
    write_final(run_dir, returns, time.perf_counter() - started)


def write_final(run_dir: Path, returns: list[float], seconds: float) -> None:
    final = dict(mean=statistics.mean(returns), std=statistics.pstdev(returns), episodes=len(returns),
                 eval_s=seconds)
    (run_dir / "final.json").write_text(json.dumps(final))
    print(f"{run_dir}: final policy {final['mean']:.1f} ± {final['std']:.1f} over {len(returns)} episodes",
          flush=True)


def solved_at(args, run_dir: Path) -> dict:
    """Every kept checkpoint's policy over --eval-episodes episodes, and the first one that solved the env
    on them and on as many other episodes; written to solved.json, read back when it is there."""
    path = run_dir / "solved.json"
    if path.exists():
        return json.loads(path.read_text())
    from fiberrl.evaluate import RunError, evaluate, read_config
    from fiberrl.run import checkpoint_files
    from fiberrl.runtime import Pool
    kept = read_config(run_dir).get("keep_checkpoints", 3)
    if kept is not None:
        print(f"{run_dir}: --solved-at scores every checkpoint, and this run kept its last {kept}; run it with "
              f"--set keep_checkpoints=null", flush=True)
        return {}
    iterations = list(checkpoint_files(run_dir / "checkpoints"))
    steps = {m["iteration"]: m["timesteps"] for m in read_metrics(run_dir)}
    started = time.perf_counter()

    def returns(pending) -> list[float] | None:
        try:
            return [r for r, _ in pending.get()]
        except RunError as exc:  # a damaged checkpoint: said, and passed over
            print(f"{run_dir}: {exc}", flush=True)
            return None

    with Pool(len(os.sched_getaffinity(0))) as pool:  # one checkpoint a core
        pending = [pool.apply_async(evaluate, (run_dir, args.eval_episodes, EVAL_SEED, str(i))) for i in iterations]
        rows = [dict(iteration=i, timesteps=steps.get(i), mean=statistics.mean(found), std=statistics.pstdev(found))
                for i, task in zip(iterations, pending, strict=True) if (found := returns(task)) is not None]
        solved = None
        for row in rows:
            if row["mean"] < SOLVED:
                continue
            again = returns(pool.apply_async(evaluate, (run_dir, args.eval_episodes, CONFIRM_SEED,
                                                        str(row["iteration"]))))
            if again is None:
                continue
            row["confirmed"] = dict(mean=statistics.mean(again), std=statistics.pstdev(again), seed=CONFIRM_SEED)
            if row["confirmed"]["mean"] >= SOLVED:
                solved = row
                break
    result = dict(checkpoints=rows, episodes=args.eval_episodes, seed=EVAL_SEED,
                  solved_at=None if solved is None else solved["timesteps"],
                  solved_iteration=None if solved is None else solved["iteration"],
                  eval_s=time.perf_counter() - started)
    path.write_text(json.dumps(result, indent=1))
    for row in rows:
        confirmed = row.get("confirmed")
        print(f"{run_dir.name} checkpoint {row['iteration']:>3} ({row['timesteps'] or 0:>9,} steps): "
              f"{row['mean']:7.1f} ± {row['std']:5.1f}"
              + (f"  again on seeds {CONFIRM_SEED}+: {confirmed['mean']:.1f} ± {confirmed['std']:.1f}"
                 if confirmed else ""), flush=True)
    return result


# --- Stable-Baselines3 (runs in a subprocess of --peer-python) -----------------------------

def sb3_seed(args, seed: int, run_dir: Path) -> None:
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    run_dir.mkdir(parents=True, exist_ok=True)
    env = VecNormalize(make_vec_env(ENV_ID, n_envs=ZOO["n_envs"], seed=seed), gamma=ZOO["gamma"])
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0,
                **{k: v for k, v in ZOO.items() if k != "n_envs"})
    began = time.perf_counter()

    class Log(BaseCallback):
        """Each update's line as fiberrl writes it, once the update has trained: the mean return of the
        episodes that ended in its rollout."""

        def _on_training_start(self):
            self.returns, self.update, self.done = [], 0, None
            self.file = open(run_dir / "metrics.jsonl", "w")

        def _on_step(self):
            self.returns += [info["episode"]["r"] for info in self.locals["infos"] if "episode" in info]
            return True

        def _on_rollout_end(self):
            self.done = (self.num_timesteps, statistics.mean(self.returns) if self.returns else None)
            self.returns = []

        def _on_rollout_start(self):  # the previous rollout's training is over
            self._write()

        def _on_training_end(self):
            self._write()
            self.file.close()

        def _write(self):
            if self.done is None:
                return
            steps, mean = self.done
            line = {"iteration": self.update, "timesteps": steps, "time_s": time.perf_counter() - began,
                    "charts/episodic_return": mean}
            self.file.write(json.dumps(line) + "\n")
            self.file.flush()
            print(f"sb3 seed {seed} update {self.update + 1}: steps {steps:,} return "
                  f"{'-' if mean is None else format(mean, '.2f')} {line['time_s']:.0f} s", flush=True)
            self.done, self.update = None, self.update + 1

    model.learn(total_timesteps=args.steps, callback=Log())
    started = time.perf_counter()
    eval_env, returns = gym.make(ENV_ID), []
    for i in range(args.eval_episodes):
        obs, _ = eval_env.reset(seed=EVAL_SEED + i)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(env.normalize_obs(obs[None]), deterministic=True)
            obs, reward, terminated, truncated, _ = eval_env.step(action[0])
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    write_final(run_dir, returns, time.perf_counter() - started)


def peer_seed(args, seed: int, out: Path) -> None:
    if (out / "sb3" / f"seed{seed}" / "final.json").exists():
        return
    command = [args.peer_python, str(Path(__file__).resolve()), "--peer-child", "--seeds", str(seed),
               "--out", str(out), "--steps", str(args.steps), "--eval-episodes", str(args.eval_episodes)]
    if subprocess.run(command).returncode != 0:
        raise SystemExit(f"the SB3 peer's seed {seed} failed")


# --- report ----------------------------------------------------------------------------

def summarize(framework: str, seed: int, run_dir: Path) -> dict | None:
    metrics, final_path = read_metrics(run_dir), run_dir / "final.json"
    if not metrics or not final_path.exists():
        return None
    final = json.loads(final_path.read_text())
    last = metrics[-1]
    solved = json.loads((run_dir / "solved.json").read_text()) if (run_dir / "solved.json").exists() else {}
    return dict(framework=framework, seed=seed, final=final["mean"], final_std=final["std"],
                episodes=final["episodes"], steps=last["timesteps"], wall_s=last["time_s"],
                steps_per_s=last["timesteps"] / last["time_s"], run_dir=str(run_dir),
                solved_at=solved.get("solved_at"), solved_scored="checkpoints" in solved)


def report(rows: list[dict], out: Path, args) -> None:
    print(f"\n{ENV_ID}, {args.steps:,} env steps per seed; final policy over {args.eval_episodes} episodes "
          f"(mean action); solved: {SOLVED:.0f}, the zoo's PPO: {ZOO_SCORE}")
    print(f"{'framework':<10} {'seed':>4} {'final':>8} {'± std':>7} {'env steps':>11} {'wall s':>8} {'steps/s':>8} "
          f"{'solved at':>10}")
    for r in rows:
        solved = ("-" if not r.get("solved_scored") else "not" if r["solved_at"] is None
                  else f"{r['solved_at']:,}")
        print(f"{r['framework']:<10} {r['seed']:>4} {r['final']:>8.1f} {r['final_std']:>7.1f} {r['steps']:>11,} "
              f"{r['wall_s']:>8.0f} {r['steps_per_s']:>8.0f} {solved:>10}")
    means = {}
    for name in ("fiberrl", "sb3"):
        group = [r for r in rows if r["framework"] == name]
        if group:
            means[name] = {k: statistics.mean(r[k] for r in group) for k in ("final", "steps_per_s", "wall_s")}
            solved = sum(r["final"] >= SOLVED for r in group)
            print(f"{name:<10} mean over {len(group)} seed(s): final {means[name]['final']:.1f}, solved in "
                  f"{solved} of {len(group)}, {means[name]['steps_per_s']:.0f} env steps/s, "
                  f"{means[name]['wall_s'] / 60:.0f} min a seed")
    if len(means) == 2:
        print(f"env steps/s, fiberrl / SB3: {means['fiberrl']['steps_per_s'] / means['sb3']['steps_per_s']:.2f}")
    (out / "summary.json").write_text(json.dumps(dict(args={k: (str(v) if isinstance(v, Path) else v)
                                                           for k, v in vars(args).items()}, rows=rows), indent=1))


def draw(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    colors, names, labelled = {"fiberrl": "C0", "sb3": "C1"}, {"fiberrl": "fiberrl PPO",
                                                               "sb3": "Stable-Baselines3 PPO"}, set()
    for r in rows:
        metrics = [m for m in read_metrics(Path(r["run_dir"])) if m.get("charts/episodic_return") is not None]
        label = None if r["framework"] in labelled else names[r["framework"]]
        labelled.add(r["framework"])
        for ax, x_key in zip(axes, ("timesteps", "time_s"), strict=True):
            ax.plot([m[x_key] for m in metrics], [m["charts/episodic_return"] for m in metrics],
                    color=colors[r["framework"]], alpha=0.8, linewidth=1.2, label=label)
    for ax in axes:
        ax.axhline(ZOO_SCORE, color="grey", linestyle="--", linewidth=1, label=f"zoo's PPO at 5M: {ZOO_SCORE}")
        ax.axhline(SOLVED, color="green", linestyle=":", linewidth=1, label=f"solved: {SOLVED:.0f}")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("environment steps")
    axes[1].set_xlabel("wall time (s)")
    axes[0].set_ylabel("training episodes' return (mean per update)")
    axes[0].legend(loc="lower right", fontsize="small")
    fig.suptitle(f"{ENV_ID}: fiberrl's PPO preset and SB3's PPO with the zoo's settings, one line per seed")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5_000_000)
    parser.add_argument("--seeds", type=lambda text: [int(x) for x in text.split(",") if x.strip()],
                        default=[0, 1, 2])
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--peer-python", default=sys.executable)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--solved-at", action="store_true")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--peer-only", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--peer-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # a SIGTERM (kill, pkill) then stops the run in progress too: subprocess.run kills its child on the way out
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    batch = ZOO["n_envs"] * ZOO["n_steps"]
    if args.steps < batch:
        parser.error(f"--steps must be at least one update's {batch:,} steps")
    if args.eval_episodes < 1:
        parser.error("--eval-episodes must be at least 1")

    if args.peer_child:  # one SB3 seed, in the --peer-python interpreter
        sb3_seed(args, args.seeds[0], args.out / "sb3" / f"seed{args.seeds[0]}")
        return

    out = args.out or REPO / "experiments" / "results" / "ppo_bipedal" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    print(f"results in {out}", flush=True)
    if not args.peer_only:
        for seed in args.seeds:
            print(f"\nfiberrl PPO, seed {seed}, {args.steps:,} env steps", flush=True)
            fiberrl_seed(args, seed, out / "fiberrl" / f"seed{seed}")
            if args.solved_at:
                solved_at(args, out / "fiberrl" / f"seed{seed}")
    if not args.no_peer:
        from peer_python import missing_imports  # beside this script
        why = missing_imports(args.peer_python, ["stable_baselines3", "Box2D"])
        if why is not None:
            print(f"\nthe SB3 peer was skipped: {why} (pass --peer-python with an interpreter that has it)")
        else:
            for seed in args.seeds:
                print(f"\nStable-Baselines3 PPO, seed {seed}, {args.steps:,} env steps", flush=True)
                peer_seed(args, seed, out)
    rows = [row for name in ("fiberrl", "sb3") for seed in args.seeds
            if (row := summarize(name, seed, out / name / f"seed{seed}")) is not None]
    report(rows, out, args)
    if rows:
        draw(rows, out / "ppo_bipedal_walker.png")
        print(f"plot: {out / 'ppo_bipedal_walker.png'}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(REPO))
    main()
