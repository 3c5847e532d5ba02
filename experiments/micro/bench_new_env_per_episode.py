"""What playing each episode in an env made for it costs PPO's env servers
(``env.new_env_per_episode``, on by default so that a resume replays an env
exactly), against reusing the env, in alternating slices of the same run.

    python experiments/micro/bench_new_env_per_episode.py [--envs cartpole,lunar_lander,bipedal_walker] [--seconds 3]

Random actions make the shortest episodes, so the most makes per step: the
worst case of each env.  Both sides are ``RemoteEnvs`` of --servers servers
of --envs-per-server envs, stepped in lockstep as the learner steps them.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from fiberrl.rl.env_servers import EnvSpec
from fiberrl.rl.remote_envs import RemoteEnvs

ENV_IDS = {"cartpole": "CartPole-v1", "lunar_lander": "LunarLander-v3", "bipedal_walker": "BipedalWalker-v3"}


def step_for(envs: RemoteEnvs, actions: np.ndarray, seconds: float) -> tuple[int, int, float]:
    """(env steps, episodes ended, seconds) of stepping for ``seconds``."""
    steps = episodes = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        episodes += len(envs.step(actions[steps // envs.num_envs % len(actions)]).episodes)
        steps += envs.num_envs
    return steps, episodes, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="cartpole,lunar_lander,bipedal_walker")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--envs-per-server", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--slices", type=int, default=5)
    args = parser.parse_args()
    print(f"{args.servers} env servers x {args.envs_per_server} envs, random actions, {args.slices} alternating "
          f"slices of {args.seconds:g} s a side")
    print(f"{'env':<16} {'episode steps':>13} {'reused env/s':>13} {'new env/s':>10} {'ratio':>6} {'range':>12}")
    for name in args.envs.split(","):
        env_id = ENV_IDS.get(name, name)
        sides = {new: RemoteEnvs(EnvSpec(env_id, new_env_per_episode=new), args.servers, args.envs_per_server, seed=0)
                 for new in (False, True)}
        try:
            space = sides[True].single_action_space
            space.seed(0)
            actions = np.array([[space.sample() for _ in range(sides[True].num_envs)] for _ in range(4096)])
            for envs in sides.values():
                envs.reset()
                step_for(envs, actions, 0.5)  # warm up
            rates = {False: [], True: []}
            steps = episodes = 0
            for _ in range(args.slices):
                for new, envs in sides.items():
                    n, ended, seconds = step_for(envs, actions, args.seconds)
                    rates[new].append(n / seconds)
                    steps, episodes = steps + n, episodes + ended
        finally:
            for envs in sides.values():
                envs.close()
        ratios = np.array(rates[True]) / np.array(rates[False])
        print(f"{name:<16} {steps / max(episodes, 1):>13.0f} {np.mean(rates[False]):>13,.0f} "
              f"{np.mean(rates[True]):>10,.0f} {ratios.mean():>6.3f} {ratios.min():>5.3f}-{ratios.max():.3f}")


if __name__ == "__main__":
    main()
