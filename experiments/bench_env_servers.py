"""Environment stepping throughput: N AsyncManager env servers stepped in
lockstep from one learner, against gymnasium's AsyncVectorEnv with the same
N environments, in the same run.

    python experiments/bench_env_servers.py [--envs cartpole,breakout] [--servers 1,2,4,8] [--seconds 5] [--rounds 40]

Both sides reset an environment inside the step that ends its episode (the
vector env's autoreset), so each step is one round trip per environment.  Both sides are built
first and then timed in alternating slices, so drifts in the load of a
shared machine fall on both; the interval printed is that of the ratio
over those pairs of slices.
"""
from __future__ import annotations

import argparse
import contextlib
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


class Stepper:
    """Steps every env once per call and counts env steps and the time spent."""

    def __init__(self, step, n: int):
        self.step, self.n = step, n
        self.steps, self.elapsed = 0, 0.0
        self.slices: list[float] = []  # steps/s of each run() call
        for _ in range(20):  # warm up
            step()

    def run(self, seconds: float) -> None:
        start, steps = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            for _ in range(20):
                self.step()
            steps += 20 * self.n
        elapsed = time.perf_counter() - start
        self.steps += steps
        self.elapsed += elapsed
        self.slices.append(steps / elapsed)

    def rate(self) -> float:
        return self.steps / self.elapsed


def servers_stepper(stack: contextlib.ExitStack, env_id: str, n: int) -> Stepper:
    servers = [EnvServer() for _ in range(n)]
    for server in servers:
        server.start()
        stack.callback(server.shutdown)
    envs = [server.Env(env_id, i) for i, server in enumerate(servers)]
    for handle in [env.reset() for env in envs]:
        handle.get()
    action_space = make_env(env_id).action_space
    rng = np.random.default_rng(0)

    def step():
        actions = rng.integers(action_space.n, size=n)
        handles = [env.step(int(a)) for env, a in zip(envs, actions, strict=False)]
        return [h.get() for h in handles]

    return Stepper(step, n)


def vector_stepper(stack: contextlib.ExitStack, env_id: str, n: int) -> Stepper:
    envs = gym.vector.AsyncVectorEnv([lambda: make_env(env_id)] * n)
    stack.callback(envs.close)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)

    def step():
        return envs.step(rng.integers(envs.single_action_space.n, size=n))

    return Stepper(step, n)


def compare(env_id: str, n: int, seconds: float, rounds: int) -> tuple[Stepper, Stepper]:
    """Both, measured in alternating slices so a change in the machine's load
    falls on both alike."""
    with contextlib.ExitStack() as stack:
        ours, theirs = servers_stepper(stack, env_id, n), vector_stepper(stack, env_id, n)
        for _ in range(rounds):
            ours.run(seconds / rounds)
            theirs.run(seconds / rounds)
        return ours, theirs


def paired_interval(ours: Stepper, theirs: Stepper) -> tuple[float, float]:
    """95% interval of the ratio from the slices taken side by side: the
    geometric mean of each pair's ratio, +- 1.96 standard errors."""
    logs = np.log(np.array(ours.slices) / np.array(theirs.slices))
    half = 1.96 * logs.std(ddof=1) / np.sqrt(len(logs))
    return float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="cartpole,breakout")
    parser.add_argument("--servers", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=5.0, help="per side and N")
    # fine slices keep a load swing of a shared machine from falling on one side: at 10 slices Breakout
    # with 2 servers read 0.91-0.97 in runs that read 0.98-1.01 at 40
    parser.add_argument("--rounds", type=int, default=40, help="alternating slices the seconds are cut into")
    args = parser.parse_args()
    print(f"{'env':10} {'N':>3} {'fiberrl steps/s':>16} {'AsyncVectorEnv':>15} {'ratio':>6} {'paired 95%':>12}")
    for name in args.envs.split(","):
        for n in map(int, args.servers.split(",")):
            ours, theirs = compare(ENV_IDS[name], n, args.seconds, args.rounds)
            low, high = paired_interval(ours, theirs)
            print(f"{name:10} {n:3d} {ours.rate():16.0f} {theirs.rate():15.0f} {ours.rate() / theirs.rate():6.2f} "
                  f"{low:6.2f}-{high:.2f}", flush=True)


if __name__ == "__main__":
    main()
