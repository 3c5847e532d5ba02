"""Environment stepping throughput: N AsyncManager env servers stepped in
lockstep from one learner, against gymnasium's AsyncVectorEnv with the same
N environments, in the same run.

    python experiments/bench_env_servers.py [--envs cartpole,breakout] [--servers 1,2,4,8] [--seconds 5]

Both sides reset an environment inside the step that ends its episode (the
vector env's autoreset), so each step is one round trip per environment.
"""
from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

from fiberrl.runtime.managers import AsyncManager

ENV_IDS = {"cartpole": "CartPole-v1", "breakout": "ALE/Breakout-v5"}


def make_env(env_id: str) -> gym.Env:
    if env_id.startswith("ALE/"):
        import ale_py
        gym.register_envs(ale_py)
    return gym.make(env_id)


class AutoResetEnv:
    """What each env server holds: one env that starts its next episode by itself."""

    def __init__(self, env_id: str, seed: int):
        self.env = make_env(env_id)
        self.seed = seed

    def reset(self):
        return self.env.reset(seed=self.seed)[0]

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        if terminated or truncated:
            obs, _ = self.env.reset()
        return obs, reward, terminated, truncated


class EnvServer(AsyncManager):
    pass


EnvServer.register("Env", AutoResetEnv)


def time_steps(step, seconds: float) -> float:
    """Steps per second of ``step()`` (which steps every env once) over about ``seconds``."""
    for _ in range(20):  # warm up
        step()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            step()
        n += 20
    return n / (time.perf_counter() - start)


def bench_servers(env_id: str, n: int, seconds: float) -> float:
    servers = [EnvServer() for _ in range(n)]
    for server in servers:
        server.start()
    try:
        envs = [server.Env(env_id, i) for i, server in enumerate(servers)]
        for handle in [env.reset() for env in envs]:
            handle.get()
        action_space = make_env(env_id).action_space
        rng = np.random.default_rng(0)

        def step():
            actions = rng.integers(action_space.n, size=n)
            handles = [env.step(int(a)) for env, a in zip(envs, actions, strict=False)]
            return [h.get() for h in handles]

        return time_steps(step, seconds) * n
    finally:
        for server in servers:
            server.shutdown()


def bench_vector(env_id: str, n: int, seconds: float) -> float:
    envs = gym.vector.AsyncVectorEnv([lambda: make_env(env_id)] * n)
    try:
        envs.reset(seed=0)
        rng = np.random.default_rng(0)

        def step():
            return envs.step(rng.integers(envs.single_action_space.n, size=n))

        return time_steps(step, seconds) * n
    finally:
        envs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="cartpole,breakout")
    parser.add_argument("--servers", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    print(f"{'env':10} {'N':>3} {'fiberrl steps/s':>16} {'AsyncVectorEnv':>15} {'ratio':>6}")
    for name in args.envs.split(","):
        for n in map(int, args.servers.split(",")):
            ours = bench_servers(ENV_IDS[name], n, args.seconds)
            theirs = bench_vector(ENV_IDS[name], n, args.seconds)
            print(f"{name:10} {n:3d} {ours:16.0f} {theirs:15.0f} {ours / theirs:6.2f}", flush=True)


if __name__ == "__main__":
    main()
