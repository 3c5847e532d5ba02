"""Environment stepping throughput: N AsyncManager env servers stepped in
lockstep from one learner, against gymnasium's AsyncVectorEnv with the same
N environments, in the same run.

    python experiments/micro/bench_env_servers.py [--envs cartpole,breakout] [--servers 1,2,4,8] [--seconds 5] \
        [--rounds 40]

With --engine envpool: fiberrl's env servers (``RemoteEnvs``, PPO's) on the
EnvPool engine against EnvPool used directly (one batch of the same envs,
as many threads as the servers have together) and against AsyncVectorEnv,
all three making the same envs (for Breakout: BreakoutNoFrameskip-v4 with
the Atari preprocessing: fiberrl's wrappers for AsyncVectorEnv, EnvPool's own
for both others), timed in alternating slices.  A fourth stepper, servers
that step nothing but answer with the same observations, times the round
trip alone; "sync bound" is the most a synchronous step through servers can
reach against EnvPool used directly, EnvPool's step time over itself plus
that round trip:

    python experiments/micro/bench_env_servers.py --engine envpool --envs breakout --num-envs 8 --servers 1,2

and past one host: --hosts docker puts each env server in a container of its
own with a quota of --cpus cores (each container standing in for a host; the
image is the one the docker tests make from this machine, with this
environment mounted), and prints the aggregate steps/s of the servers beside
the same servers as local processes, in alternating slices:

    python experiments/micro/bench_env_servers.py --engine envpool --envs breakout --num-envs 16 --servers 2 \
        --hosts docker

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


# --- the EnvPool engine against EnvPool and AsyncVectorEnv ----------------------------------

ENGINE_ENVS = {"cartpole": ("CartPole-v1", False), "breakout": ("BreakoutNoFrameskip-v4", True)}


def remote_envpool_stepper(stack: contextlib.ExitStack, env: str, num_envs: int, servers: int) -> Stepper:
    from fiberrl.rl.env_servers import EnvSpec
    from fiberrl.rl.remote_envs import RemoteEnvs
    env_id, atari = ENGINE_ENVS[env]
    envs = RemoteEnvs(EnvSpec(env_id, atari=atari, engine="envpool"), servers, num_envs // servers, seed=0)
    stack.callback(envs.close)
    envs.reset()
    rng = np.random.default_rng(0)
    return Stepper(lambda: envs.step(rng.integers(envs.single_action_space.n, size=num_envs)), num_envs)


class NullEnvServer:
    """An env server that does no env work: its step returns the same arrays each time."""

    def __init__(self, obs_shape: tuple, obs_dtype: str, num_envs: int):
        from fiberrl.rl.env_servers import ServerStep
        self.result = ServerStep(np.zeros((num_envs, *obs_shape), obs_dtype), np.zeros(num_envs, np.float32),
                                 np.zeros(num_envs, bool), np.zeros(num_envs, bool), {}, [], {})

    def step(self, actions):
        return self.result


class NullServers(AsyncManager):
    pass


NullServers.register("Null", NullEnvServer)


def null_servers_stepper(stack: contextlib.ExitStack, env: str, num_envs: int, servers: int) -> Stepper:
    """What a synchronous step through ``servers`` env servers costs beyond the env work: the same
    calls and the same observations as ``RemoteEnvs.step``, from servers that step nothing."""
    from fiberrl.rl.envs import make_env as make_fiberrl_env
    env_id, atari = ENGINE_ENVS[env]
    space = make_fiberrl_env(env_id, atari=atari).observation_space
    managers = [NullServers() for _ in range(servers)]
    for manager in managers:
        manager.start()
        stack.callback(manager.shutdown)
    nulls = [m.Null(space.shape, space.dtype.str, num_envs // servers) for m in managers]
    actions = np.zeros(num_envs // servers, np.int64)

    def step():
        return [h.get() for h in [null.step(actions) for null in nulls]]

    return Stepper(step, num_envs)


def envpool_stepper(stack: contextlib.ExitStack, env: str, num_envs: int, threads: int) -> Stepper:
    import envpool

    from fiberrl.rl.envpool_engine import task
    env_id, atari = ENGINE_ENVS[env]
    name, options = task(env_id, {}, None, atari)
    pool = envpool.make(name, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs, num_threads=threads,
                        seed=0, **options)
    stack.callback(pool.close)
    pool.reset()
    rng = np.random.default_rng(0)
    return Stepper(lambda: pool.step(rng.integers(pool.action_space.n, size=num_envs)), num_envs)


def async_vector_stepper(stack: contextlib.ExitStack, env: str, num_envs: int) -> Stepper:
    from fiberrl.rl.envs import make_env as make_fiberrl_env
    env_id, atari = ENGINE_ENVS[env]
    envs = gym.vector.AsyncVectorEnv([lambda: make_fiberrl_env(env_id, atari=atari)] * num_envs)
    stack.callback(envs.close)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    return Stepper(lambda: envs.step(rng.integers(envs.single_action_space.n, size=num_envs)), num_envs)


def compare_engine(env: str, num_envs: int, servers: int, seconds: float, rounds: int) -> list[Stepper]:
    """fiberrl's servers on EnvPool, EnvPool itself, AsyncVectorEnv, servers that step nothing:
    alternating slices."""
    with contextlib.ExitStack() as stack:
        steppers = [remote_envpool_stepper(stack, env, num_envs, servers),
                    envpool_stepper(stack, env, num_envs, servers), async_vector_stepper(stack, env, num_envs),
                    null_servers_stepper(stack, env, num_envs, servers)]
        for _ in range(rounds):
            for stepper in steppers:
                stepper.run(seconds / rounds)
        return steppers


def compare_hosts(env: str, num_envs: int, servers: int, seconds: float, rounds: int, cpus: float) -> list[Stepper]:
    """The same EnvPool servers as local processes and as containers of ``cpus`` cores each."""
    import sys
    from pathlib import Path

    import fiberrl.runtime as mp
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from helpers import docker_backend  # the docker tests' image: this machine's libraries, this environment mounted

    why = docker_backend.available()
    if why is not None:
        raise SystemExit(f"--hosts docker: {why}")
    with contextlib.ExitStack() as stack:
        local = remote_envpool_stepper(stack, env, num_envs, servers)
        mp.configure(**docker_backend.settings(), cpu_per_job=cpus)
        try:
            containers = remote_envpool_stepper(stack, env, num_envs, servers)
        finally:
            mp.configure(backend="local", cpu_per_job=0.0)
        for _ in range(rounds):
            local.run(seconds / rounds)
            containers.run(seconds / rounds)
        return [local, containers]


def hosts_main(args) -> None:
    print(f"{'env':10} {'envs':>4} {'servers':>7} {'local processes':>15} {f'containers of {args.cpus:g} cpu':>20} "
          f"{'ratio':>17}")
    for env in args.envs.split(","):
        for servers in map(int, args.servers.split(",")):
            local, containers = compare_hosts(env, args.num_envs, servers, args.seconds, args.rounds, args.cpus)
            low, high = paired_interval(containers, local)
            print(f"{env:10} {args.num_envs:4d} {servers:7d} {local.rate():15.0f} {containers.rate():20.0f} "
                  f"{containers.rate() / local.rate():5.2f} ({low:.2f}-{high:.2f})", flush=True)


def engine_main(args) -> None:
    print(f"{'env':10} {'envs':>4} {'servers':>7} {'fiberrl+envpool':>15} {'envpool':>8} {'AsyncVectorEnv':>14} "
          f"{'vs envpool':>17} {'vs AsyncVectorEnv':>17} {'sync bound':>10}")
    for env in args.envs.split(","):
        for servers in map(int, args.servers.split(",")):
            ours, pool, vector, null = compare_engine(env, args.num_envs, servers, args.seconds, args.rounds)
            cells = []
            for peer in (pool, vector):
                low, high = paired_interval(ours, peer)
                cells.append(f"{ours.rate() / peer.rate():5.2f} ({low:.2f}-{high:.2f})")
            # a synchronous step through servers costs EnvPool's step plus a round trip that steps nothing
            bound = null.rate() / (pool.rate() + null.rate())
            print(f"{env:10} {args.num_envs:4d} {servers:7d} {ours.rate():15.0f} {pool.rate():8.0f} "
                  f"{vector.rate():14.0f} {cells[0]:>17} {cells[1]:>17} {bound:10.2f}", flush=True)


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
    parser.add_argument("--engine", choices=("gymnasium", "envpool"), default="gymnasium",
                        help="envpool: fiberrl's env servers on EnvPool against EnvPool and AsyncVectorEnv")
    parser.add_argument("--num-envs", type=int, default=8, help="with --engine envpool: envs in all")
    parser.add_argument("--hosts", choices=("local", "docker"), default="local",
                        help="with --engine envpool: docker puts each server in a container of --cpus cores")
    parser.add_argument("--cpus", type=float, default=1.0, help="with --hosts docker: each container's quota")
    args = parser.parse_args()
    if args.engine == "envpool":
        (hosts_main if args.hosts == "docker" else engine_main)(args)
        return
    print(f"{'env':10} {'N':>3} {'fiberrl steps/s':>16} {'AsyncVectorEnv':>15} {'ratio':>6} {'paired 95%':>12}")
    for name in args.envs.split(","):
        for n in map(int, args.servers.split(",")):
            ours, theirs = compare(ENV_IDS[name], n, args.seconds, args.rounds)
            low, high = paired_interval(ours, theirs)
            print(f"{name:10} {n:3d} {ours.rate():16.0f} {theirs.rate():15.0f} {ours.rate() / theirs.rate():6.2f} "
                  f"{low:6.2f}-{high:.2f}", flush=True)


if __name__ == "__main__":
    main()
