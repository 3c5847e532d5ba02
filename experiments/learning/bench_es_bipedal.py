"""BipedalWalker-v3 learning for a budget of environment steps: fiberrl's ES
(algos/es.py, OpenAI's ES, with the options of ``+experiment=es_bipedal_walker``)
against the peer, evotorch's PGPE with ClipUp, with the same number of workers
(pool workers / ray actors) and seeds.

The peer (--peer pgpe-clipup, the default): evotorch.algorithms.PGPE as
evotorch's own examples/scripts/rl_clipup.py sets it up: ClipUp with max speed
0.15, a step of 0.75 x that, momentum 0.9, an initial search radius of 15 x the
max speed, the standard deviation learnt at 0.1 with at most 20% change per
step, symmetric sampling, centered ranks; on evotorch.neuroevolution.GymNE with
online observation normalisation, one episode per solution, and the same tanh
MLP as fiberrl's (tanh on the outputs too, for BipedalWalker's [-1, 1]
actions).  --peer openai-es instead sets PGPE up as OpenAI's ES (a fixed
standard deviation of fiberrl's sigma, Adam at fiberrl's learning rate).
The peer learns from the env's own rewards, where a fall costs 100; with
--peer-reward-clip C it learns, as fiberrl's preset does, from each step's
reward clipped to +-C (gymnasium's ClipReward), and is evaluated on the env's
own rewards all the same.
evotorch's popsize counts solutions, so it is twice fiberrl's population
(which counts mirrored pairs) unless --peer-popsize says otherwise.

Both stop at the first iteration that reaches --steps environment steps; the
steps are each framework's own count of the training episodes' steps (fiberrl's
metrics "timesteps", evotorch's status "total_interaction_count"); neither
counts the eval episodes.  Each iteration both also evaluate the unperturbed
policy over --eval-episodes episodes (eval_reward): fiberrl in its pool with the
perturbations, evotorch in its main process (GymNE.run), whose time is
reported separately, and left out of its steps/s (which favours the peer).
A seed whose run directory holds checkpoints resumes from them (run the same
command again after an interruption): fiberrl's own, and for evotorch a pickle
of its searcher (which takes its problem's observation statistics and its
actors' step counts with it, as evotorch pickles itself) and of the random
generators, written every --peer-checkpoint-every iterations.

Per seed: final and best eval reward; the policy at the budget scored over 100
episodes seeded 10000 on (final_score.json in the run's folder; fiberrl's last
checkpoint as `python -m fiberrl.evaluate <run> --episodes 100 --seed 10000
--checkpoint latest` scores it, evotorch's center with its observation
normalisation); the env steps and wall time at which the eval reward first
reached 250 (the policy walks the course); env steps, wall time, env steps per
second; a table of both frameworks, the ratio of their env steps/s, and one PNG
with eval reward against env steps and against wall time (every seed).

    python experiments/learning/bench_es_bipedal.py --peer-python /tmp/venv-evo/bin/python   # the full run
    python experiments/learning/bench_es_bipedal.py --steps 20000 --seeds 0                   # smoke test
    python experiments/learning/bench_es_bipedal.py --no-peer --set algo.sigma=0.05           # a variant of the preset
    python experiments/learning/bench_es_bipedal.py --peer-python /tmp/venv-evo/bin/python --speed-slices 3  # speed

The peer runs in a subprocess of --peer-python (default: this interpreter),
one per seed; when that interpreter cannot import evotorch, the peer is
skipped with the reason.  To make such an interpreter:
    python3 -m venv /tmp/venv-evo
    /tmp/venv-evo/bin/pip install -c constraints.txt -e . evotorch

Flags:
    --steps N          environment steps per seed (default 50,000,000)
    --seeds LIST       seeds (default 0,1,2)
    --workers N        pool workers / ray actors (default 2)
    --preset NAME      fiberrl's settings: configs/experiment/NAME.yaml (default es_bipedal_walker)
    --set KEY=VALUE    a Hydra override on top of the preset (repeatable)
    --eval-episodes N  episodes of the unperturbed policy per iteration (default 5)
    --noise-size N     floats in fiberrl's noise table (default 50,000,000: 200 MB)
    --peer NAME        pgpe-clipup (default) or openai-es
    --peer-popsize N   evotorch's solutions per iteration (default: 2 x fiberrl's population)
    --peer-max-speed S ClipUp's max speed for the peer (default 0.15)
    --peer-reward-clip C  the peer learns from each step's reward clipped to +-C (default: the env's own rewards)
    --peer-python PATH interpreter for the evotorch peer (default: this one)
    --peer-checkpoint-every N  evotorch iterations between its checkpoints (default 10)
    --no-peer          run fiberrl only
    --speed-slices K   instead of the learning runs: env steps/s of both in K alternating slices (fiberrl, then
                       evotorch, K times), each a fresh run of --slice-steps steps (default 2,000,000) seeded
                       from --seeds in turn; prints each slice, each slice's ratio and their median (speed_slices.json)
    --peer-only DIR    run only the peer, into the results folder DIR (which may hold fiberrl's runs)
    --out DIR          results folder (default experiments/results/es_bipedal/<timestamp>)
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
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ENV_ID = "BipedalWalker-v3"
WALKS = 250.0  # the eval reward of a policy that walks the course, as the benchmark counts it
FINAL_EPISODES, FINAL_SEED = 100, 10_000  # the policy at the budget is scored over episodes seeded 10000, 10001, ...
FINAL_SCORE = "final_score.json"


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


# --- fiberrl --------------------------------------------------------------------

def fiberrl_overrides(args, seed: int) -> list[str]:
    return [f"+experiment={args.preset}", f"workers={args.workers}", f"seed={seed}", "tensorboard=false",
            "algo.iterations=1000000", f"algo.total_timesteps={args.steps}", f"algo.eval_episodes={args.eval_episodes}",
            f"algo.noise_size={args.noise_size}", *args.set]


def fiberrl_seed(args, seed: int, run_dir: Path) -> None:
    """One seed's run, or the rest of it: a run whose budget is spent ends at once (its last checkpoint
    is the policy at the budget)."""
    from fiberrl.app import run
    from fiberrl.app_config import compose

    overrides = fiberrl_overrides(args, seed)
    if (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("*.npz")):
        overrides.append(f"resume={run_dir}")
    run(compose(overrides), run_dir)
    metrics = read_metrics(run_dir)
    at_budget = metrics and metrics[-1]["timesteps"] >= args.steps
    if at_budget and not args.no_final_score and not (run_dir / FINAL_SCORE).exists():
        from fiberrl.evaluate import evaluate
        write_final_score(run_dir, evaluate(run_dir, FINAL_EPISODES, FINAL_SEED, which="latest"),
                          metrics[-1]["timesteps"])


def write_final_score(run_dir: Path, results: list[tuple[float, int]], timesteps: int) -> None:
    """The policy at the budget over FINAL_EPISODES episodes: [(return, length)] -> final_score.json."""
    returns, lengths = [r for r, _ in results], [n for _, n in results]
    score = dict(timesteps=timesteps, episodes=len(results), first_seed=FINAL_SEED, mean=statistics.mean(returns),
                 std=statistics.pstdev(returns), mean_length=statistics.mean(lengths), returns=returns)
    (run_dir / FINAL_SCORE).write_text(json.dumps(score, indent=1))
    print(f"{run_dir}: the policy at {timesteps:,} steps scores {score['mean']:.1f} ± {score['std']:.1f} over "
          f"{len(results)} episodes (mean length {score['mean_length']:.0f})", flush=True)


def read_final_score(run_dir: Path) -> dict | None:
    path = run_dir / FINAL_SCORE
    return json.loads(path.read_text()) if path.exists() else None


# --- evotorch (runs in a subprocess of --peer-python) ------------------------------

def network_string(hidden: list[int]) -> str:
    sizes = ["obs_length", *map(str, hidden)]
    layers = [f"Linear({a}, {b}) >> Tanh()" for a, b in zip(sizes, sizes[1:], strict=False)]
    return " >> ".join(layers + [f"Linear({sizes[-1]}, act_length) >> Tanh()"])


def clipped_walker(clip: float, **make_kwargs):
    """The env whose rewards the peer learns from under --peer-reward-clip (module level: evotorch pickles its
    env maker into its ray actors and into the checkpoint)."""
    import gymnasium as gym
    return gym.wrappers.ClipReward(gym.make(ENV_ID, **make_kwargs), -clip, clip)


def evotorch_eval(problem, center, args, iteration: int) -> float:
    """Mean return of the center over --eval-episodes episodes, on the env's own rewards: GymNE.run when the
    peer learns from them too, else episodes of its policy on the unclipped env (seeded apart from the final
    score's)."""
    if args.peer_reward_clip is None:
        return float(problem.run(center, num_episodes=args.eval_episodes, update_stats=False)["cumulative_reward"])
    policy = problem.to_policy(center)
    first = 1_000_000 + iteration * args.eval_episodes
    return statistics.mean(evotorch_episode(policy, args.episode_steps, first + i)[0]
                           for i in range(args.eval_episodes))


def evotorch_seed(args, seed: int, run_dir: Path) -> None:
    import functools
    import random

    import numpy as np
    import ray
    import torch
    import yaml
    from evotorch.algorithms import PGPE
    from evotorch.neuroevolution import GymNE

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    ray.init(num_cpus=args.workers, include_dashboard=False, object_store_memory=256 << 20,
             logging_level="warning")
    run_dir.mkdir(parents=True, exist_ok=True)
    network = network_string(args.hidden)
    if args.peer == "pgpe-clipup":  # evotorch's examples/scripts/rl_clipup.py
        searcher_settings = dict(popsize=args.peer_popsize, optimizer="clipup",
                                 optimizer_config=dict(max_speed=args.peer_max_speed, momentum=0.9),
                                 center_learning_rate=0.75 * args.peer_max_speed, stdev_learning_rate=0.1,
                                 stdev_max_change=0.2, radius_init=15 * args.peer_max_speed,
                                 ranking_method="centered", symmetric=True)
    else:  # OpenAI's ES: a fixed standard deviation, Adam
        searcher_settings = dict(popsize=args.peer_popsize, optimizer="adam", center_learning_rate=args.learning_rate,
                                 stdev_learning_rate=0.0, stdev_init=args.sigma, ranking_method="centered",
                                 symmetric=True)
    settings = dict(algo=dict(name=f"evotorch-{args.peer}", **searcher_settings, network=network,
                              observation_normalization=True, episode_length=args.episode_steps,
                              reward_clip=args.peer_reward_clip, eval_episodes=args.eval_episodes),
                    env=dict(name="bipedal_walker", id=ENV_ID), seed=seed, workers=args.workers)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))

    train_s, wall_before, iteration, timesteps = 0.0, 0.0, 0, 0
    checkpoint = run_dir / "checkpoint.pkl"
    if checkpoint.exists():
        searcher, saved = load_evotorch_checkpoint(checkpoint, seed)
        problem = searcher.problem
        iteration, train_s, wall_before, timesteps = (saved[k] for k in ("iteration", "train_s", "wall_s",
                                                                           "timesteps"))
        # its env, clipped or not, came with the checkpoint (which says so since --peer-reward-clip exists)
        if "reward_clip" in saved and saved["reward_clip"] != args.peer_reward_clip:
            raise SystemExit(f"evotorch seed {seed}: its checkpoint {checkpoint} learnt with --peer-reward-clip "
                             f"{saved['reward_clip']}, this run asks for {args.peer_reward_clip}; run it "
                             f"with the same flag, or into another results folder")
        print(f"evotorch seed {seed}: resumed at iteration {iteration}, {timesteps:,} steps", flush=True)
    else:
        env = ENV_ID if args.peer_reward_clip is None else functools.partial(clipped_walker, args.peer_reward_clip)
        problem = GymNE(env=env, network=network, observation_normalization=True, num_episodes=1,
                        episode_length=args.episode_steps, num_actors=args.workers)
        # seeded through torch's global generator (set above): evotorch 0.6.1's actors fail to start when the
        # problem has its own generator (problem.manual_seed: EvaluationActor calls a missing GymNE.seed)
        searcher = PGPE(problem, **searcher_settings)
    kept = [row for row in read_metrics(run_dir) if row["iteration"] < iteration]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in kept))
    began = time.perf_counter() - wall_before
    with open(run_dir / "metrics.jsonl", "a") as log:
        while timesteps < args.steps:
            t0 = time.perf_counter()
            searcher.step()
            t1 = time.perf_counter()
            status = searcher.status
            timesteps = int(status["total_interaction_count"])
            eval_reward = evotorch_eval(problem, status["center"], args, iteration)
            eval_s = time.perf_counter() - t1
            train_s += t1 - t0
            row = dict(iteration=iteration, timesteps=timesteps, reward_mean=float(status["mean_eval"]),
                       reward_max=float(status["pop_best_eval"]),
                       eval_reward=eval_reward, time_s=train_s,
                       wall_s=time.perf_counter() - began, iteration_s=t1 - t0, eval_s=eval_s,
                       episodes=int(status["total_episode_count"]))
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(f"evotorch seed {seed} iter {iteration:>5}  steps {timesteps:,}  reward mean "
                  f"{row['reward_mean']:.2f} max {row['reward_max']:.2f}  eval {row['eval_reward']:.2f}  "
                  f"{row['iteration_s']:.2f} s/iter (+{eval_s:.2f} s eval)  {row['wall_s']:.0f} s", flush=True)
            iteration += 1
            if iteration % args.peer_checkpoint_every == 0 or timesteps >= args.steps:
                save_evotorch_checkpoint(checkpoint, searcher, dict(iteration=iteration, train_s=train_s,
                                                                    wall_s=time.perf_counter() - began,
                                                                    timesteps=timesteps,
                                                                    reward_clip=args.peer_reward_clip))
    if not args.no_final_score and timesteps >= args.steps and not (run_dir / FINAL_SCORE).exists():
        policy = problem.to_policy(searcher.status["center"])  # with its observation normalisation, actions clipped
        write_final_score(run_dir, [evotorch_episode(policy, args.episode_steps, FINAL_SEED + i)
                                    for i in range(FINAL_EPISODES)], timesteps)
    ray.shutdown()


def evotorch_episode(policy, max_steps: int | None, seed: int) -> tuple[float, int]:
    """(return, length) of one episode of an evotorch policy, reset with ``seed`` as fiberrl.evaluate does."""
    import gymnasium as gym
    import torch

    env = gym.make(ENV_ID) if max_steps is None else gym.make(ENV_ID, max_episode_steps=max_steps)
    observation, _ = env.reset(seed=seed)
    total, steps, done = 0.0, 0, False
    with torch.no_grad():
        while not done:
            action = policy(torch.as_tensor(observation, dtype=torch.float32)).numpy()
            observation, reward, terminated, truncated, _ = env.step(action)
            total, steps, done = total + float(reward), steps + 1, terminated or truncated
    env.close()
    return total, steps


def save_evotorch_checkpoint(path: Path, searcher, progress: dict) -> None:
    import pickle
    import random

    import numpy as np
    import torch
    state = dict(searcher=searcher, progress=progress, torch_rng=torch.get_rng_state(),
                 numpy_rng=np.random.get_state(), python_rng=random.getstate())
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as f:
        pickle.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def load_evotorch_checkpoint(path: Path, seed: int):
    """(searcher, progress) from a checkpoint; a damaged one ends the run with a line saying so."""
    import pickle
    import random

    import numpy as np
    import torch
    try:
        with open(path, "rb") as f:
            state = pickle.load(f)
        searcher, progress = state["searcher"], state["progress"]
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
    except Exception as exc:  # noqa: BLE001 -- whatever a damaged pickle raises
        raise SystemExit(f"evotorch seed {seed}: its checkpoint {path} cannot be read ({type(exc).__name__}: "
                         f"{exc}); delete it to run the seed from its start") from None
    return searcher, progress


def peer_unavailable(args) -> str | None:
    """Why --peer-python cannot run the peer, with what to do, or None when it can."""
    from peer_python import missing_imports  # beside this script
    why = missing_imports(args.peer_python, ["evotorch", "ray", "torch"])
    return why and (f"{why} (pass --peer-python with an interpreter that has evotorch; see this script's "
                    f"docstring)")


def peer_seed(args, seed: int, out: Path) -> bool:
    command = [args.peer_python, str(Path(__file__).resolve()), "--peer-child", "--seeds", str(seed),
               "--out", str(out), "--steps", str(args.steps), "--workers", str(args.workers),
               "--peer", args.peer, "--peer-popsize", str(args.peer_popsize),
               "--peer-max-speed", str(args.peer_max_speed), "--sigma", str(args.sigma),
               "--peer-checkpoint-every", str(args.peer_checkpoint_every),
               "--learning-rate", str(args.learning_rate), "--eval-episodes", str(args.eval_episodes),
               "--hidden", ",".join(map(str, args.hidden))]
    if args.episode_steps is not None:
        command += ["--episode-steps", str(args.episode_steps)]
    if args.peer_reward_clip is not None:
        command += ["--peer-reward-clip", str(args.peer_reward_clip)]
    if args.no_final_score:
        command.append("--no-final-score")
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=path)
    return subprocess.run(command, env=env).returncode == 0


# --- speed in alternating slices ------------------------------------------------------

def slice_rate(run_dir: Path, time_key: str) -> float | None:
    """Env steps/s of one slice from its metrics, from the end of its first iteration on (start-up left out)."""
    metrics = read_metrics(run_dir)
    if len(metrics) < 2:
        return None
    first, last = metrics[0], metrics[-1]
    return (last["timesteps"] - first["timesteps"]) / (last[time_key] - first[time_key])


def speed_slices(args, out: Path) -> None:
    """Each framework's env steps/s in alternating slices (fiberrl, evotorch, fiberrl, ...), each a fresh run of
    --slice-steps steps: a machine whose speed drifts over hours, as a shared one does, then weighs on both
    alike, which runs of 50M steps one after the other cannot promise."""
    import shutil
    import tempfile

    why = peer_unavailable(args)
    if why is not None:
        raise SystemExit(f"--speed-slices needs the peer: {why}")
    args.steps, args.no_final_score = args.slice_steps, True
    rates = {"fiberrl": [], "evotorch": [], "evotorch w/o eval": []}
    scratch = Path(tempfile.mkdtemp(prefix="es_speed_"))
    try:
        for k in range(args.speed_slices):
            seed = args.seeds[k % len(args.seeds)]
            fiberrl_dir, peer_dir = scratch / "fiberrl" / f"slice{k}", scratch / f"peer{k}" / "evotorch" / f"seed{seed}"
            fiberrl_seed(args, seed, fiberrl_dir)
            if not peer_seed(args, seed, scratch / f"peer{k}"):
                raise SystemExit(f"the evotorch slice {k} failed (its output is above)")
            rates["fiberrl"].append(slice_rate(fiberrl_dir, "time_s"))
            rates["evotorch"].append(slice_rate(peer_dir, "wall_s"))
            rates["evotorch w/o eval"].append(slice_rate(peer_dir, "time_s"))
            print(f"slice {k} (seed {seed}): " + ", ".join(f"{name} {fmt(r[-1], '.0f')}" for name, r in rates.items())
                  + " env steps/s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {name: statistics.median(r) for name, r in rates.items() if None not in r}
    # a slice's pair ran minutes apart, so its ratio is the one a drifting machine disturbs least
    ratios = ({peer: [f / e for f, e in zip(rates["fiberrl"], rates[peer], strict=True)]
               for peer in ("evotorch", "evotorch w/o eval")} if len(medians) == 3 else {})
    print(f"\n{args.speed_slices} alternating slices of {args.slice_steps:,} env steps, {args.workers} workers, "
          f"medians: " + ", ".join(f"{name} {m:.0f}" for name, m in medians.items()) + " env steps/s")
    if ratios:
        for peer, label in (("evotorch", "evotorch's main-process evals counted"), ("evotorch w/o eval", "left out")):
            print(f"env steps/s, fiberrl / {peer}: per slice " + ", ".join(f"{r:.2f}" for r in ratios[peer])
                  + f", median {statistics.median(ratios[peer]):.2f}; ratio of the medians "
                  f"{medians['fiberrl'] / medians[peer]:.2f} ({label})")
    else:
        print("no ratio: a slice ran fewer than 2 iterations, so its rate is unknown (raise --slice-steps)")
    (out / "speed_slices.json").write_text(json.dumps(dict(slice_steps=args.slice_steps, workers=args.workers,
                                                            seeds=args.seeds, rates=rates, medians=medians,
                                                            ratios=ratios), indent=1))
    print(f"figures: {out / 'speed_slices.json'}")


# --- report ----------------------------------------------------------------------

def summarize(framework: str, seed: int, run_dir: Path, wall_key: str) -> dict | None:
    metrics = read_metrics(run_dir)
    if not metrics:
        return None
    last = metrics[-1]
    evals = [m["eval_reward"] for m in metrics if m.get("eval_reward") is not None]
    walking = next((m for m in metrics if m.get("eval_reward") is not None and m["eval_reward"] >= WALKS), None)
    row = dict(framework=framework, seed=seed, iterations=len(metrics), final_eval=evals[-1] if evals else None,
               best_eval=max(evals) if evals else None, steps=last["timesteps"], wall_s=last[wall_key],
               walks_at_steps=walking and walking["timesteps"], walks_at_s=walking and walking[wall_key],
               run_dir=str(run_dir), final_100=read_final_score(run_dir))
    row["steps_per_s"] = row["steps"] / row["wall_s"]
    if wall_key != "time_s":  # evotorch: also without its main-process evals
        row["train_s"] = last["time_s"]
        row["train_steps_per_s"] = row["steps"] / row["train_s"]
    return row


def peer_name(args) -> str:
    clip = args.peer_reward_clip
    return args.peer if clip is None else f"{args.peer}, rewards clipped to +-{clip:g}"


def fmt(value, spec):
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def report(rows: list[dict], out: Path, args) -> None:
    print(f"\nBipedalWalker-v3, {args.steps:,} env steps per seed, {args.workers} workers; fiberrl: "
          f"+experiment={args.preset} {' '.join(args.set)} (population {args.population} pairs); evotorch: "
          f"{peer_name(args)}, popsize {args.peer_popsize}")
    print(f"{'framework':<10} {'seed':>4} {'iters':>6} {'final eval':>10} {'best eval':>10} "
          f"{f'eval>={WALKS:.0f} at':>15} {f'{FINAL_EPISODES} episodes':>15} {'env steps':>11} {'wall s':>8} "
          f"{'steps/s':>8} {'steps/s w/o eval':>17}")
    for r in rows:
        walks = (f"{r['walks_at_steps'] / 1e6:.1f}M, {r['walks_at_s'] / 60:.0f} min"
                 if r.get("walks_at_steps") is not None else "-")
        scored = r["final_100"]
        scored = f"{scored['mean']:.1f} ± {scored['std']:.1f}" if scored else "-"
        print(f"{r['framework']:<10} {r['seed']:>4} {r['iterations']:>6} {fmt(r['final_eval'], '10.1f')} "
              f"{fmt(r['best_eval'], '10.1f')} {walks:>15} {scored:>15} {r['steps']:>11,} {r['wall_s']:>8.0f} "
              f"{r['steps_per_s']:>8.0f} {fmt(r.get('train_steps_per_s'), '17.0f')}")
    by = {name: [r for r in rows if r["framework"] == name] for name in ("fiberrl", "evotorch")}
    means = {}
    for name, group in by.items():
        if group:
            means[name] = {k: statistics.mean(r[k] for r in group) for k in ("steps_per_s", "wall_s")}
            finals = [r["final_eval"] for r in group if r["final_eval"] is not None]
            bests = [r["best_eval"] for r in group if r["best_eval"] is not None]
            scores = [r["final_100"]["mean"] for r in group if r["final_100"]]
            if group[0].get("train_steps_per_s") is not None:
                means[name]["train_steps_per_s"] = statistics.mean(r["train_steps_per_s"] for r in group)
            final = fmt(statistics.mean(finals), ".1f") if finals else "-"
            best = fmt(statistics.mean(bests), ".1f") if bests else "-"
            scored = (f"{statistics.mean(scores):.1f} over {len(scores)} seed(s) scored at their budget"
                      if scores else "none scored yet")
            print(f"{name:<10} mean over {len(group)} seed(s): final eval {final}, best eval {best}, "
                  f"{FINAL_EPISODES} episodes of the policy at the budget {scored}, "
                  f"{means[name]['steps_per_s']:.0f} env steps/s, {means[name]['wall_s']:.0f} s")
    if "fiberrl" in means and "evotorch" in means:
        f, e = means["fiberrl"], means["evotorch"]
        print(f"env steps/s, fiberrl / evotorch: {f['steps_per_s'] / e['steps_per_s']:.2f} (evotorch's main-process "
              f"evals counted), {f['steps_per_s'] / e['train_steps_per_s']:.2f} (left out)")
    (out / "summary.json").write_text(json.dumps(dict(args={k: (str(v) if isinstance(v, Path) else v)
                                                           for k, v in vars(args).items()}, rows=rows), indent=1))


def draw(rows: list[dict], path: Path, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    colors = {"fiberrl": "C0", "evotorch": "C1"}
    labelled = set()
    for r in rows:
        metrics = [m for m in read_metrics(Path(r["run_dir"])) if m.get("eval_reward") is not None]
        label = None
        if r["framework"] not in labelled:
            labelled.add(r["framework"])
            label = {"fiberrl": "fiberrl ES", "evotorch": f"evotorch PGPE ({peer_name(args)})"}[r["framework"]]
        wall = "time_s" if r["framework"] == "fiberrl" else "wall_s"
        for ax, x_key in zip(axes, ("timesteps", wall), strict=True):
            ax.plot([m[x_key] for m in metrics], [m["eval_reward"] for m in metrics], color=colors[r["framework"]],
                    alpha=0.8, linewidth=1.2, label=label)
    axes[0].set_xlabel("environment steps")
    axes[1].set_xlabel("wall time (s)")
    axes[0].set_ylabel("eval reward (unperturbed policy)")
    for ax in axes:
        ax.axhline(WALKS, color="grey", linestyle="--", linewidth=1,
                   label=f"walks ({WALKS:.0f})" if ax is axes[0] else None)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize="small")
    seeds = sorted({r["seed"] for r in rows})
    fig.suptitle(f"BipedalWalker-v3, ES: one line per seed ({', '.join(map(str, seeds))})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def share_fiberrl_settings(args, parser) -> None:
    """The preset's settings that the peer takes too (its network, its episode cap; for
    openai-es its sigma and step size), and its popsize."""
    from fiberrl.app_config import compose
    try:
        algo = compose(fiberrl_overrides(args, args.seeds[0])).algo
    except Exception as exc:  # a preset that does not exist, a --set Hydra refuses
        parser.error(f"--preset {args.preset} {' '.join(args.set)}: {str(exc).splitlines()[0]}")
    if algo.name != "es":
        parser.error(f"--preset {args.preset} sets algo={algo.name}; this benchmark runs ES")
    args.population, args.sigma, args.learning_rate = algo.population, algo.sigma, algo.learning_rate
    args.hidden = list(algo.hidden)
    # the peer has no adaptive cap: it gets the env's own limit then, as fiberrl's eval episodes
    args.episode_steps = algo.episode_steps if algo.episode_steps_growth == 1 else None
    if args.peer_popsize is None:
        args.peer_popsize = 2 * args.population


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda text: [int(x) for x in text.split(",") if x.strip()]  # noqa: E731
    parser.add_argument("--steps", type=int, default=50_000_000)
    parser.add_argument("--seeds", type=ints, default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--preset", default="es_bipedal_walker")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--noise-size", type=int, default=50_000_000)
    parser.add_argument("--peer", choices=("pgpe-clipup", "openai-es"), default="pgpe-clipup")
    parser.add_argument("--peer-popsize", type=int, default=None)
    parser.add_argument("--peer-max-speed", type=float, default=0.15)
    parser.add_argument("--peer-reward-clip", type=float, default=None)
    parser.add_argument("--peer-checkpoint-every", type=int, default=10)
    # what the peer child is told of fiberrl's settings (the parent reads them from the preset)
    parser.add_argument("--sigma", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--learning-rate", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--episode-steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=ints, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--peer-python", default=sys.executable)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--peer-only", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--speed-slices", type=int, default=0)
    parser.add_argument("--slice-steps", type=int, default=2_000_000)
    parser.add_argument("--no-final-score", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--peer-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # a SIGTERM (kill, pkill) then stops the run in progress too: subprocess.run kills its child on the way out
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.eval_episodes < 1:
        parser.error("--eval-episodes must be at least 1 (the curves plot eval reward)")
    if args.peer_checkpoint_every < 1:
        parser.error("--peer-checkpoint-every must be at least 1")
    if args.peer_reward_clip is not None and args.peer_reward_clip <= 0:
        parser.error("--peer-reward-clip must be above 0 (leave it out for the env's own rewards)")
    if args.speed_slices < 0 or args.slice_steps < 1:
        parser.error("--speed-slices must be 0 or more and --slice-steps at least 1")

    if args.peer_child:  # one evotorch seed, in the --peer-python interpreter
        evotorch_seed(args, args.seeds[0], args.out / "evotorch" / f"seed{args.seeds[0]}")
        return
    share_fiberrl_settings(args, parser)

    out = args.peer_only or args.out or (REPO / "experiments" / "results" / "es_bipedal"
                                         / datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"results in {out}", flush=True)
    if args.speed_slices:
        speed_slices(args, out)
        return
    rows = []
    if args.peer_only is None:
        for seed in args.seeds:
            run_dir = out / "fiberrl" / f"seed{seed}"
            print(f"\nfiberrl ES, seed {seed}, {args.steps:,} env steps, {args.workers} workers", flush=True)
            fiberrl_seed(args, seed, run_dir)
    if not args.no_peer:
        why = peer_unavailable(args)
        if why is not None:
            print(f"\nthe evotorch peer was skipped: {why}", flush=True)
        else:
            for seed in args.seeds:
                done = read_metrics(out / "evotorch" / f"seed{seed}")
                if done and done[-1]["timesteps"] >= args.steps and read_final_score(out / "evotorch" / f"seed{seed}"):
                    print(f"\nevotorch seed {seed} already ran its {args.steps:,} steps", flush=True)
                    continue
                print(f"\nevotorch PGPE, seed {seed}, {args.steps:,} env steps, {args.workers} ray actors", flush=True)
                if not peer_seed(args, seed, out):
                    print(f"the evotorch run of seed {seed} failed (its output is above)", flush=True)
    for seed in args.seeds:
        for framework, wall_key in (("fiberrl", "time_s"), ("evotorch", "wall_s")):
            row = summarize(framework, seed, out / framework / f"seed{seed}", wall_key)
            if row is not None:
                rows.append(row)
    rows.sort(key=lambda r: (r["framework"] != "fiberrl", r["seed"]))
    if not rows:
        print("no run logged any metrics")
        return
    report(rows, out, args)
    png = out / "es_bipedal.png"
    draw(rows, png, args)
    print(f"curves: {png}")


if __name__ == "__main__":
    main()
