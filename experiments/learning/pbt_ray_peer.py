"""The peer of ``bench_pbt.py``: Ray Tune's ``PopulationBasedTraining`` driving fiberrl's PPO as a
function trainable, with the population, ready interval, quantile, mutations and metric that the
bench gives fiberrl's ``hydra/sweeper=pbt``.  Run by an interpreter that has Ray Tune (not a project
dependency) and fiberrl:

    python3 -m venv /tmp/venv-ray
    /tmp/venv-ray/bin/pip install -c constraints.txt --config-settings editable_mode=compat -e . 'ray[tune]'
    /tmp/venv-ray/bin/python experiments/learning/pbt_ray_peer.py --out DIR --seed 0 --population 4 \\
        --interval 98304 --set KEY=VALUE ...

A trial trains one fiberrl run directory and reports the mean eval reward of its last ``--window``
evaluations at each evaluation; every ``interval`` env steps it pauses (``until_timesteps``) to report
it with a checkpoint (the run's newest fiberrl checkpoint): an exploited trial starts again from the
donor's, copied into a fresh run directory, with the settings Ray chose, just as fiberrl's sweeper does.
Ray's perturbations are its own (x0.8 or x1.2, resampled with probability 0.25); values are kept
inside the mutation ranges, as fiberrl's are.  Ray keeps 4 checkpoints a trial (it warns that 2 or
fewer can lose the one another trial exploits).  Writes DIR/ray_results.json: per trial its final run
directory and score.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# PPO's usual set, as fiberrl's algorithm record has it (fiberrl.algos.ppo.ALGORITHM.mutations)
SPACES = {"algo.learning_rate": ("log", 1e-5, 1e-2), "algo.ent_coef": ("lin", 0.0, 0.05),
          "algo.clip_coef": ("lin", 0.05, 0.5), "algo.gae_lambda": ("lin", 0.8, 1.0)}


def trainable(config: dict) -> None:
    from ray import tune

    from fiberrl.app import run
    from fiberrl.app_config import compose

    trial_dir = Path(tune.get_context().get_trial_dir())
    run_dir = trial_dir / f"run_{time.time_ns()}"  # a fresh one for each (re)start of the trial
    (run_dir / "checkpoints").mkdir(parents=True)
    history: list[float] = []
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            for npz in Path(folder).glob("*.npz"):
                shutil.copy(npz, run_dir / "checkpoints" / npz.name)
            history = json.loads((Path(folder) / "history.json").read_text())
    settings = [f"{key}={_fit(key, value)}" for key, value in config["settings"].items()]
    timesteps = _timesteps(run_dir)
    while True:
        overrides = [*config["fixed"], f"seed={config['seed']}", *settings,
                     f"until_timesteps={timesteps + config['interval']}", "tensorboard=false"]
        if any((run_dir / "checkpoints").glob("*.npz")):
            overrides.append(f"resume='{run_dir}'")  # a trial's folder name holds '='
        until = timesteps + config["interval"]

        def report_evaluation(*_):
            # each evaluation reported as it comes, as a Ray trainable reports each iteration: the others are
            # ranked on fresh scores; the one at the interval is reported below, with its checkpoint
            row = _rows(run_dir)[-1]
            if isinstance(row.get("eval_reward"), (int, float)) and row["timesteps"] < until:
                window = (history + [row["eval_reward"]])[-config["window"]:]
                history.append(row["eval_reward"])
                tune.report({"score": sum(window) / len(window), "timesteps": row["timesteps"],
                             "run_dir": str(run_dir), "finished": False})

        seen = len(history)
        summary = run(compose(overrides), run_dir, on_iteration=report_evaluation)
        # none when the trial was restored at its end (Ray's synchronous PBT pauses a trial at its last report too,
        # and starts it again from there): the run has nothing left to do and writes no row
        rows = _rows(run_dir) if (run_dir / "metrics.jsonl").exists() else []
        del history[seen:]
        history += [r["eval_reward"] for r in rows if isinstance(r.get("eval_reward"), (int, float))
                    and r["timesteps"] > timesteps]
        timesteps = rows[-1]["timesteps"] if rows else timesteps
        window = history[-config["window"]:]
        score = sum(window) / len(window) if window else -math.inf
        with tempfile.TemporaryDirectory() as folder:
            newest = sorted((run_dir / "checkpoints").glob("*.npz"))[-1]
            shutil.copy(newest, Path(folder) / newest.name)
            (Path(folder) / "history.json").write_text(json.dumps(history))
            tune.report({"score": score, "timesteps": timesteps, "run_dir": str(run_dir),
                          "finished": not summary["paused"]}, checkpoint=tune.Checkpoint.from_directory(folder))
        if not summary["paused"]:
            return


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _timesteps(run_dir: Path) -> int:
    import numpy as np
    found = sorted((run_dir / "checkpoints").glob("*.npz"))
    if not found:
        return 0
    with np.load(found[-1]) as data:
        return int(json.loads(bytes(data["__values__"]).decode())["timesteps"])


def _kept_in_ranges(config: dict) -> dict:
    config["settings"] = {key: _fit(key, value) for key, value in config["settings"].items()}
    return config


def _fit(key: str, value: float) -> float:
    _, low, high = SPACES[key]
    return float(f"{min(max(value, low), high):.6g}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--population", type=int, default=4)
    parser.add_argument("--interval", type=int, required=True)
    parser.add_argument("--quantile", type=float, default=0.25)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--burn-in", type=int, default=0, help="env steps before a trial may be perturbed")
    parser.add_argument("--cpus", type=float, default=2, help="CPUs Ray may use")
    parser.add_argument("--synch", action="store_true",
                        help="Ray's synchronous PBT: every trial waits for the others at each perturbation interval")
    parser.add_argument("--set", action="append", default=[], help="a fixed override of the runs")
    parser.add_argument("--start", action="append", default=[], help="KEY=VALUE: a mutated setting's start")
    args = parser.parse_args()

    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    start = {key: float(value) for key, value in (s.split("=", 1) for s in args.start)}
    mutations = {}
    for key, (scale, low, high) in SPACES.items():
        mutations[key] = tune.loguniform(low, high) if scale == "log" else tune.uniform(low, high)
    scheduler = PopulationBasedTraining(
        time_attr="timesteps", perturbation_interval=args.interval, burn_in_period=args.burn_in,
        quantile_fraction=args.quantile,
        resample_probability=0.25, hyperparam_mutations={"settings": mutations}, synch=args.synch,
        custom_explore_fn=_kept_in_ranges)
    random.seed(args.seed)  # Ray's PBT draws from Python's generator
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    args.out.mkdir(parents=True, exist_ok=True)
    param_space = {"fixed": args.set, "interval": args.interval, "window": args.window,
                   "seed": tune.grid_search([args.seed * 100 + i for i in range(args.population)]),
                   "settings": {key: start.get(key, mutations[key]) for key in SPACES}}
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": args.cpus / args.population}), param_space=param_space,
        tune_config=tune.TuneConfig(scheduler=scheduler, metric="score", mode="max",
                                    max_concurrent_trials=args.population),
        run_config=tune.RunConfig(name="ray_pbt", storage_path=str(args.out.resolve()),
                                   checkpoint_config=tune.CheckpointConfig(num_to_keep=4), verbose=1))
    began = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - began
    trials = [{"run_dir": r.metrics.get("run_dir"), "score": r.metrics.get("score"),
               "timesteps": r.metrics.get("timesteps"), "settings": r.config["settings"],
               "error": str(r.error) if r.error else None} for r in results]
    (args.out / "ray_results.json").write_text(json.dumps({"wall_s": wall, "trials": trials}, indent=1))
    print(f"ray pbt: {len(trials)} trials in {wall:.0f} s")


if __name__ == "__main__":
    main()
