"""PPO with K learners on a Ring (``algo.learners=K``, DD-PPO) against one learner: env steps a
second and the update's time, whole runs of ``python -m fiberrl`` in alternating order.

    python experiments/micro/bench_ppo_learners.py [--preset bipedal_walker|breakout|cartpole] [--learners 1 2 4]
        [--updates 6] [--rounds 2] [--hosts local|docker] [--threads N] [--straggler 0.02]
        [--devices cpu cuda] [--set KEY=VALUE ...] [--json FILE]

Each run is the preset with the same envs in all (``workers`` env servers, split over the K
learners) and the same global minibatch (each learner takes ``num_minibatches`` of its own
batch, so K learners' minibatches together are one learner's); its figures come from its
metrics.jsonl, the first update (start-up) left out: env steps a second, the median rollout
and update times.  A K the backend cannot place is reported as refused (on the local backend,
one core per learner).  ``--hosts docker``: every learner and env server is a container
(the docker tests' image), standing in for hosts; ``--threads N`` sets every learner's torch threads
(``OMP_NUM_THREADS``: containers on one machine each see all of its cores).  ``--straggler D``: one
learner's env servers sleep D seconds a step (``tests/helpers/slow_member_env.py``, CartPole) and K learners run
without and with ``algo.preempt_share=0.5``.  ``--devices cpu cuda``: every K with its learners on each device
(``algo.device``; a K above the GPUs is refused as above).  ``--set KEY=VALUE``: a setting that replaces the
preset's of that key or adds to them (``--set env=breakout_noframeskip``).  ``--json FILE``: every run's
figures, and the refusals.  The machine is shared and noisy: compare ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PRESETS = {
    # the preset's settings with 512-step rollouts: 16,384 env steps an update, minibatches of 64
    "bipedal_walker": ["+experiment=ppo_bipedal_walker", "workers=4", "algo.envs_per_worker=8",
                       "algo.num_steps=512", "algo.num_minibatches=256", "algo.eval_every=0"],
    # CleanRL's ppo_atari.py: 8 envs of 128 steps, 4 minibatches, 4 epochs
    "breakout": ["algo=ppo", "env=breakout", "workers=4", "algo.envs_per_worker=2", "algo.eval_every=0"],
    "cartpole": ["+experiment=ppo_cartpole", "workers=4", "algo.envs_per_worker=1", "algo.num_steps=512",
                 "algo.num_minibatches=4", "algo.eval_every=0"],
}


def batch_of(settings: list[str]) -> int:
    from fiberrl.app_config import compose
    cfg = compose(settings)
    return cfg.workers * cfg.algo.envs_per_worker * cfg.algo.num_steps


def one_run(settings: list[str], learners: int, updates: int, hosts: list[str], env: dict) -> dict:
    """One whole run of ``updates`` updates; its figures, or why it was refused."""
    batch = batch_of(settings)
    with tempfile.TemporaryDirectory(prefix="bench-learners-") as folder:
        command = [sys.executable, "-m", "fiberrl", *settings, f"algo.learners={learners}",
                   f"algo.total_timesteps={batch * updates}", "tensorboard=false", f"hydra.run.dir={folder}", *hosts]
        began = time.perf_counter()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - began
        if done.returncode == 2:
            return {"refused": done.stderr.strip().splitlines()[-1]}
        if done.returncode != 0:
            raise SystemExit(f"algo.learners={learners} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        rows = [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines()]
    steady = rows[1:]
    steps = rows[-1]["timesteps"] - rows[0]["timesteps"]
    seconds = rows[-1]["time_s"] - rows[0]["time_s"]
    return {"sps": steps / seconds, "update_s": statistics.median(r["update_s"] for r in steady),
            "rollout_s": statistics.median(r["rollout_s"] for r in steady),
            "iteration_s": statistics.median(r["iteration_s"] for r in steady),
            "steps_per_update": steps / len(steady), "wall_s": wall}


def with_overrides(settings: list[str], overrides: list[str]) -> list[str]:
    keys = {override.split("=", 1)[0] for override in overrides}
    return [setting for setting in settings if setting.split("=", 1)[0] not in keys] + overrides


def docker_hosts() -> list[str]:
    sys.path.insert(0, str(REPO / "tests"))
    from helpers import docker_backend  # the docker tests' image: this machine's libraries, this venv mounted
    why = docker_backend.available()
    if why:
        raise SystemExit(f"--hosts docker: {why}")
    settings = docker_backend.settings()
    # a learner starts its env servers itself: its container needs the Docker API
    volumes = f"{settings['volumes']},/var/run/docker.sock:/var/run/docker.sock"
    return ["backend=docker", f"+backend.settings.image={settings['image']}", f"+backend.settings.volumes='{volumes}'"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="bipedal_walker")
    parser.add_argument("--learners", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hosts", choices=("local", "docker"), default="local")
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP_NUM_THREADS of every learner (containers on one machine cannot see their share)")
    parser.add_argument("--straggler", type=float, default=None,
                        help="seconds a step of one learner's env servers (CartPole); compares preempt_share")
    parser.add_argument("--devices", nargs="+", choices=("cpu", "cuda"), default=None,
                        help="algo.device of the learners, each K on each (default: the preset's)")
    parser.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                        help="settings that replace the preset's of the same key, or add to them")
    parser.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    hosts = docker_hosts() if args.hosts == "docker" else []

    if args.straggler is not None:
        settings = ["algo=ppo", "env.id=helpers.slow_member_env:Slowed-v0", "env.engine=gymnasium",
                    f"+env.kwargs.delay={args.straggler}", "workers=4", "algo.envs_per_worker=1",
                    "algo.num_steps=128", "algo.num_minibatches=4", "algo.eval_every=0"]
        k = max(args.learners)
        kinds = {f"K={k}, whole rollouts": [], f"K={k}, algo.preempt_share=0.5": ["algo.preempt_share=0.5"]}
    else:
        settings = with_overrides(PRESETS[args.preset], args.overrides)
        if args.devices is None:
            kinds = {f"K={k}": [] for k in args.learners}
        else:
            kinds = {f"K={k}, {device}": [f"algo.device={device}"] for device in args.devices for k in args.learners}
    figures: dict[str, list[dict]] = {name: [] for name in kinds}
    refused: dict[str, str] = {}
    for round_ in range(args.rounds):
        order = list(kinds) if round_ % 2 == 0 else list(reversed(kinds))
        for name in order:
            if name in refused:
                continue
            k = int(name.split(",")[0][2:])
            result = one_run(settings + kinds[name], k, args.updates, hosts, env)
            if "refused" in result:
                refused[name] = result["refused"]
                print(f"{name}: refused: {result['refused']}", flush=True)
                continue
            figures[name].append(result)
            print(f"round {round_ + 1} {name}: {result['sps']:,.0f} env steps/s, update {result['update_s']:.2f} s, "
                  f"rollout {result['rollout_s']:.2f} s, {result['steps_per_update']:,.0f} steps an update",
                  flush=True)

    label = (f"straggler {args.straggler} s a step" if args.straggler is not None
             else " ".join([args.preset, *args.overrides]))
    threads = f", OMP_NUM_THREADS={args.threads}" if args.threads is not None else ""
    print(f"\nPPO, {label}, {args.hosts} hosts{threads}, {args.updates} updates a run, {args.rounds} rounds "
          f"(medians; ratios to the first row)")
    print(f"{'learners':<30}{'env steps/s':>13}{'update s':>10}{'rollout s':>11}{'steps/update':>14}{'ratio':>8}")
    base = None
    for name, runs in figures.items():
        if not runs:
            print(f"{name:<30}refused: {refused.get(name, '-')}")
            continue
        sps = statistics.median(r["sps"] for r in runs)
        base = base or sps
        print(f"{name:<30}{sps:>13,.0f}{statistics.median(r['update_s'] for r in runs):>10.2f}"
              f"{statistics.median(r['rollout_s'] for r in runs):>11.2f}"
              f"{statistics.median(r['steps_per_update'] for r in runs):>14,.0f}{sps / base:>8.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "cores": os.cpu_count(),
                                         "runs": figures, "refused": refused}, indent=1))


if __name__ == "__main__":
    main()
