"""What a host fault costs PPO's env servers: rollouts on RemoteEnvs with the fault and without, alternating.

    python experiments/micro/bench_env_server_faults.py [--faults preempt partition:5 partition:30 pause:5 ...]
                                                        [--servers 4] [--envs-per-server 4] [--steps 300]
                                                        [--step-s 0.01] [--rounds 2]

CartPole on ``--servers`` env servers of ``--envs-per-server`` envs, every server a container of the
docker tests' image standing in for a host, on a Docker network of the bench's own (as
bench_host_faults.py).  A rollout is ``--steps`` steps of random actions, with ``--step-s`` seconds
between steps standing in for the learner's inference; its servers are started before the clock
starts.  The fault hits server 0 as a step is sent to it, a third of the way in:

- ``preempt``: its host taken back with notice (``docker stop -t 30``): the server answers the step,
  saying so, and a new one takes its envs over.
- ``partition:S``: its host cut off for S seconds (``docker network disconnect``, then ``connect``).
- ``pause:S``: its host stalled for S seconds (``docker pause``, then ``unpause``).

``silence_timeout`` at its default.  For each: how long the step that met the fault took, the
servers rebuilt (unheard past ``silence_timeout``), handed over (told to stop) and restarted (the
crash path, which cuts the envs' episodes short), whether every step was the step of the
undisturbed rollout of the same round (obs, rewards, ends, episodes), and the rollout's extra time.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from bench_host_faults import bench_network, docker_settings, fault_name, inject

import fiberrl.runtime as mp
from fiberrl.rl.env_servers import EnvSpec
from fiberrl.rl.remote_envs import RemoteEnvs


def rollout(args, fault: str | None) -> dict:
    rng = np.random.default_rng(0)
    n = args.servers * args.envs_per_server
    actions = [rng.integers(2, size=n) for _ in range(args.steps)]
    envs = RemoteEnvs(EnvSpec("CartPole-v1"), args.servers, args.envs_per_server, seed=1)
    steps, figures = [], {}
    try:
        envs.reset()
        started = time.monotonic()
        for t, a in enumerate(actions):
            time.sleep(args.step_s)
            if fault and t == args.steps // 3:
                inject(fault, envs.managers[0]._process, "docker")
                sent = time.monotonic()
            step = envs.step(a)
            if fault and t == args.steps // 3:
                figures["step_s"] = time.monotonic() - sent
            steps.append((step.obs, step.reward, step.terminated, step.truncated, sorted(step.final_obs),
                          [tuple(e) for e in step.episodes]))
        figures["wall_s"] = time.monotonic() - started
        # getattr: the bench also measures the commit before unheard servers were rebuilt
        figures.update(rebuilds=getattr(envs, "rebuilds", 0), handovers=envs.handovers, restarts=envs.restarts)
    finally:
        envs.close()
    return figures, steps


def same(a: list, b: list) -> bool:
    return all(all(np.array_equal(x, y) for x, y in zip(p[:4], q[:4])) and p[4:] == q[4:]
               for p, q in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", nargs="+", type=fault_name, default=["preempt", "partition:5", "partition:30"])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--envs-per-server", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-s", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    settings = docker_settings()  # makes the tests' helpers importable
    from helpers import docker_backend
    mp.configure(**settings, docker_network=bench_network(docker_backend._client()))
    rows: dict[str, list[dict]] = {"none": [], **{f: [] for f in args.faults}}
    for round_ in range(args.rounds):
        undisturbed = None
        for fault in (rows if round_ % 2 == 0 else reversed(rows)):
            figures, steps = rollout(args, None if fault == "none" else fault)
            if fault == "none":
                undisturbed = steps
            figures["steps"] = steps
            rows[fault].append(figures)
        for fault, runs in rows.items():
            runs[-1]["exact"] = same(runs[-1].pop("steps"), undisturbed)
            print(f"round {round_ + 1} {fault}: " + ", ".join(
                f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in runs[-1].items()), flush=True)

    base = statistics.median(r["wall_s"] for r in rows["none"])
    print(f"\nenv server faults, Docker hosts, {args.servers} servers of {args.envs_per_server} CartPole envs, "
          f"{args.steps} steps {args.step_s} s apart, {args.rounds} rounds, medians")
    print(f"{'fault':<15}{'step s':>8}{'rebuilt':>9}{'handed over':>13}{'restarted':>11}{'exact':>7}"
          f"{'rollout s':>11}{'extra s':>9}")
    for fault, runs in rows.items():
        step_s = statistics.median(r["step_s"] for r in runs) if fault != "none" else float("nan")
        wall = statistics.median(r["wall_s"] for r in runs)
        exact = f"{sum(r['exact'] for r in runs)}/{len(runs)}"
        print(f"{fault:<15}{step_s:>8.2f}{max(r['rebuilds'] for r in runs):>9}{max(r['handovers'] for r in runs):>13}"
              f"{max(r['restarts'] for r in runs):>11}{exact:>7}{wall:>11.2f}{wall - base:>9.2f}")
    print("bench_env_server_faults: " + " ".join(
        f"{fault}_extra_s={statistics.median(r['wall_s'] for r in runs) - base:.2f}"
        f" {fault}_exact={sum(r['exact'] for r in runs)}/{len(runs)}"
        for fault, runs in rows.items() if fault != "none"))


if __name__ == "__main__":
    main()
