"""PPO's env throughput on Breakout: N remote env servers (fiberrl.rl.env_servers)
against gymnasium's AsyncVectorEnv with the same number of envs, both driven
by the same PPO rollout loop (batched Nature-CNN inference on the learner,
actions sampled, observations stored), in the same run, in alternating slices.

    python experiments/micro/bench_ppo_envs.py [--servers 1,2,4,8] [--envs 8] [--seconds 10] [--rounds 20] [--updates 0]

For each N the servers hold ``envs / N`` envs each; the vector env always has
``envs`` envs, one process each (what AsyncVectorEnv does).  Both reset an
env within the step that ends its episode (gymnasium's SAME_STEP autoreset)
and apply the same Atari preprocessing.  Printed: env steps per second of
the rollout loop (and with split-batch pipelining: each server's envs are
inferred on as soon as that server answers, while the others still step),
and with ``--updates K`` also ``charts/SPS`` of K whole
PPO updates (rollout + learning) run through ``fiberrl.algos.ppo.train`` with each
kind of envs.  Timings on a shared machine are noisy: compare the ratios.
"""
from __future__ import annotations

import argparse
import contextlib
import tempfile
import time

import gymnasium as gym
import numpy as np
import torch
from rich.console import Console

from fiberrl.algos.on_policy.evaluation import env_actions
from fiberrl.algos.ppo import make_agent, train
from fiberrl.app_config import compose
from fiberrl.rl.env_servers import EnvSpec, Episode, Step
from fiberrl.rl.remote_envs import RemoteEnvs
from fiberrl.run import RunDirectory

SPEC = EnvSpec("ALE/Breakout-v5", atari=True)


class VectorEnvs:
    """gymnasium's AsyncVectorEnv behind the interface PPO's loop uses (that of RemoteEnvs)."""

    restarts = 0

    def __init__(self, spec: EnvSpec, num_envs: int, seed: int):
        self.num_envs, self.seed = num_envs, seed
        self.envs = gym.vector.AsyncVectorEnv([spec.make] * num_envs,
                                              autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.single_observation_space = self.envs.single_observation_space
        self.single_action_space = self.envs.single_action_space

    def reset(self) -> np.ndarray:
        return self.envs.reset(seed=self.seed)[0]

    def step(self, actions) -> Step:
        obs, reward, terminated, truncated, info = self.envs.step(actions)
        step = Step(obs, reward.astype(np.float32), terminated, truncated)
        if "_final_obs" in info:
            step.final_obs = {int(i): info["final_obs"][i] for i in np.flatnonzero(info["_final_obs"] & truncated
                                                                                    & ~terminated)}
        if "_episode" in info:
            step.episodes = [Episode(int(i), float(info["episode"]["r"][i]), int(info["episode"]["l"][i]))
                             for i in np.flatnonzero(info["_episode"])]
        return step

    def history(self):
        return None  # a vector env cannot be rebuilt: no exact resume

    def close(self) -> None:
        self.envs.close()


class Rollout:
    """PPO's rollout loop (inference, sampling, stepping, storing) over ``envs``,
    run in slices; counts env steps and the time spent."""

    def __init__(self, envs, num_steps: int = 128):
        torch.manual_seed(0)
        self.envs, self.num_steps = envs, num_steps
        self.agent = make_agent(envs.single_observation_space, envs.single_action_space, [])
        self.buffer = torch.zeros((num_steps, envs.num_envs, *envs.single_observation_space.shape), dtype=torch.uint8)
        self.steps, self.elapsed, self.t = 0, 0.0, 0
        self.start()
        self.run_steps(32)  # warm up
        self.steps, self.elapsed = 0, 0.0

    def start(self) -> None:
        self.next_obs = torch.as_tensor(self.envs.reset())

    def run_steps(self, count: int) -> None:
        space = self.envs.single_action_space
        for _ in range(count):
            self.buffer[self.t % self.num_steps] = self.next_obs
            with torch.no_grad():
                action = self.agent.get_action_and_value(self.next_obs)[0]
            self.next_obs = torch.as_tensor(self.envs.step(env_actions(action, space)).obs)
            self.t += 1
        self.steps += count * self.envs.num_envs

    def run(self, seconds: float) -> None:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            self.run_steps(8)
        self.elapsed += time.perf_counter() - start

    def rate(self) -> float:
        return self.steps / self.elapsed


class PipelinedRollout(Rollout):
    """The rollout with split-batch pipelining: each server's envs are inferred on as soon as
    that server answers and sent their next actions at once, while the other servers still step."""

    def start(self) -> None:
        first, n = self.envs.reset(), self.envs.envs_per_server
        for k in range(self.envs.num_servers):
            self._act(k, first[k * n:(k + 1) * n])

    def _act(self, k: int, obs: np.ndarray) -> None:
        n = self.envs.envs_per_server
        x = torch.as_tensor(obs)
        self.buffer[self.t % self.num_steps, k * n:(k + 1) * n] = x
        with torch.no_grad():
            self.envs.send(k, env_actions(self.agent.get_action_and_value(x)[0], self.envs.single_action_space))

    def run_steps(self, count: int) -> None:
        for _ in range(count):
            self.t += 1
            for k in range(self.envs.num_servers):
                self._act(k, self.envs.receive(k).obs)
        self.steps += count * self.envs.num_envs


def ppo_sps(make_envs, servers: int, envs: int, updates: int) -> float:
    """``charts/SPS`` of ``updates`` whole PPO updates (CleanRL's Atari settings) with ``make_envs``."""
    cfg = compose(["algo=ppo", "env=breakout", f"workers={servers}", f"algo.envs_per_worker={envs // servers}",
                   f"algo.total_timesteps={updates * envs * 128}", "algo.eval_every=0", "tensorboard=false",
                   "backend=local"])
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDirectory(tmp, {}, tensorboard=False, console=Console(quiet=True))
        train(cfg, run, make_envs=make_envs)
        return run.read_metrics()[-1]["charts/SPS"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", default="1,2,4,8", help="env server counts to measure")
    parser.add_argument("--envs", type=int, default=8, help="envs in all (CleanRL's Atari setting: 8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring time per kind and configuration")
    parser.add_argument("--rounds", type=int, default=20, help="alternating slices the seconds are cut into")
    parser.add_argument("--updates", type=int, default=0, help="also time this many whole PPO updates of each")
    args = parser.parse_args()
    print(f"Breakout, {args.envs} envs, torch threads {torch.get_num_threads()}")
    print(f"{'servers':>7} {'envs/server':>11} {'fiberrl steps/s':>16} {'AsyncVectorEnv':>15} {'ratio':>6} "
          f"{'pipelined':>10} {'ratio':>6}"
          + (f" {'PPO SPS fiberrl':>16} {'PPO SPS vector':>15} {'ratio':>6}" if args.updates else ""))
    for n in map(int, args.servers.split(",")):
        if args.envs % n:
            print(f"{n:>7} does not divide {args.envs} envs: skipped")
            continue
        with contextlib.ExitStack() as stack:
            ours = stack.enter_context(contextlib.closing(RemoteEnvs(SPEC, n, args.envs // n, seed=0)))
            theirs = stack.enter_context(contextlib.closing(VectorEnvs(SPEC, args.envs, seed=0)))
            rollouts = [Rollout(ours), Rollout(theirs)]
            if n > 1:
                piped = stack.enter_context(contextlib.closing(RemoteEnvs(SPEC, n, args.envs // n, seed=0)))
                rollouts.append(PipelinedRollout(piped))
            for _ in range(args.rounds):  # alternating, so a load swing falls on all alike
                for rollout in rollouts:
                    rollout.run(args.seconds / args.rounds)
            fiberrl_sps, vector_sps = rollouts[0].rate(), rollouts[1].rate()
            pipelined_sps = rollouts[2].rate() if n > 1 else None
        line = f"{n:>7} {args.envs // n:>11} {fiberrl_sps:>16.0f} {vector_sps:>15.0f} {fiberrl_sps / vector_sps:>6.2f} "
        line += (f"{pipelined_sps:>10.0f} {pipelined_sps / vector_sps:>6.2f}" if pipelined_sps is not None
                 else f"{'-':>10} {'-':>6}")
        if args.updates:
            def servers(cfg, spec, history, generations, n=n):
                return RemoteEnvs(spec, n, args.envs // n, cfg.seed)

            def vector(cfg, spec, history, generations):
                return VectorEnvs(spec, args.envs, cfg.seed)
            ppo_ours = ppo_sps(servers, n, args.envs, args.updates)
            ppo_theirs = ppo_sps(vector, n, args.envs, args.updates)
            line += f" {ppo_ours:>16.0f} {ppo_theirs:>15.0f} {ppo_ours / ppo_theirs:>6.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
