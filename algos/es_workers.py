"""What ES's pool workers run (and POET's, whose evaluator extends this one):
each worker builds its ``Evaluator`` once (``init_worker``), with this host's
noise table and a connection to the parameter server; ``evaluate`` runs the
tasks the master maps: a ``PairTask`` (one perturbation, mirrored) or an
``EvalTask`` (one episode of the unperturbed parameters).  The parameters
travel once per iteration, by the parameter server, never with a task."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

import fiberrl.runtime as mp
from fiberrl.rl.envs import make_env
from fiberrl.rl.noise import NoiseTable
from fiberrl.rl.policies import make_policy, run_episode


class ParamStore:
    """Holds the current iteration's parameters, in the parameter server."""

    def __init__(self):
        self.version, self.params = -1, None

    def publish(self, version: int, params: tuple) -> None:
        self.version, self.params = version, params

    def connect(self) -> None:
        """Nothing: a worker calls it as it starts, so that its connection is made before
        the machine is busy with episodes (at 1024 workers on 2 cores, a handshake made
        in the middle of them outlasted its 10 s)."""

    def fetch(self, version: int) -> tuple:
        if version != self.version:
            raise RuntimeError(f"a worker asked for the parameters of iteration {version}, the server holds "
                               f"iteration {self.version}")
        return self.params


class ParamServer(mp.BaseManager):
    pass


ParamServer.register("ParamStore", ParamStore)


@dataclass
class EvaluatorSpec:
    """What a worker needs to build its evaluator; small, sent once per worker."""
    env_id: str
    env_kwargs: dict
    env_steps: int | None
    policy: str
    hidden: list
    noise_seed: int
    noise_size: int
    obs_clip: float
    episodes_per_eval: int = 1
    reward_clip: float | None = None


class PairTask(NamedTuple):
    """Evaluate theta + eps and theta - eps, eps = sigma * the noise at ``noise_index``, each
    over ``episodes_per_eval`` episodes reset with ``seed``, ``seed + 1``... and cut at
    ``max_steps``; theta and sigma are those published as ``version``."""
    version: int
    noise_index: int
    seed: int
    record_obs: bool               # send back the +eps episode's observation sums
    max_steps: int | None = None   # this iteration's adaptive cap (None: the spec's env_steps)


class EvalTask(NamedTuple):
    """One episode of the unperturbed parameters published as ``version``, reset with ``seed``."""
    version: int
    seed: int


class PairResult(NamedTuple):
    return_pos: float
    return_neg: float
    steps: int                 # of both episodes
    obs_sums: tuple | None     # (sum, sum of squares, count) of the +eps episode's observations, when asked
    at_cap: int = 0            # episodes that ran to the task's max_steps


class EvalResult(NamedTuple):
    reward: float
    steps: int


class Evaluator:
    """One per worker process: its policy, this host's noise table, the current parameters."""

    def __init__(self, spec: EvaluatorSpec, store):
        self.spec, self.store = spec, store
        env = self._make_env()
        self.policy = make_policy(spec.policy, env.observation_space, env.action_space, spec.hidden)
        env.close()
        self.noise = NoiseTable(spec.noise_seed, spec.noise_size)
        self.version = -1
        store.connect()

    def _make_env(self):
        return make_env(self.spec.env_id, self.spec.env_kwargs, self.spec.env_steps)

    def _load(self, version: int) -> None:
        if version != self.version:
            self.theta, self.obs_mean, self.obs_std, self.sigma = self.store.fetch(version)
            self.version = version

    def __call__(self, task: PairTask | EvalTask) -> PairResult | EvalResult:
        self._load(task.version)
        # a fresh env per task: some keep state across resets (a Box2D world does), and
        # a result must not depend on which tasks its worker happened to run before
        env = self._make_env()
        try:
            return self.run(task, env, self.theta, self.obs_mean, self.obs_std, self.sigma)
        finally:
            env.close()

    def run(self, task: PairTask | EvalTask, env, theta, obs_mean, obs_std, sigma) -> PairResult | EvalResult:
        """``task``'s episodes on ``env`` around ``theta``, observations normalised with ``obs_mean``/``obs_std``."""
        def episode(seed: int, record: bool = False, max_steps: int | None = None):
            return run_episode(env, self.policy, obs_mean, obs_std, self.spec.obs_clip, seed, record,
                               max_steps=max_steps, reward_clip=self.spec.reward_clip)

        if isinstance(task, EvalTask):
            self.policy.set_params(theta)
            reward, steps, _ = run_episode(env, self.policy, obs_mean, obs_std, self.spec.obs_clip, task.seed)
            return EvalResult(reward, steps)
        eps = sigma * self.noise.get(task.noise_index, theta.size)
        seeds = range(task.seed, task.seed + self.spec.episodes_per_eval)
        self.policy.set_params(theta + eps)
        positive = [episode(seed, task.record_obs, task.max_steps) for seed in seeds]
        self.policy.set_params(theta - eps)
        negative = [episode(seed, max_steps=task.max_steps) for seed in seeds]
        sums = None
        if task.record_obs:  # every +eps episode's observations
            sums = [sum(s[k] for _, _, s in positive) for k in range(3)]
        lengths = [n for _, n, _ in positive + negative]
        return PairResult(float(np.mean([r for r, _, _ in positive])), float(np.mean([r for r, _, _ in negative])),
                          sum(lengths), sums, sum(n == task.max_steps for n in lengths))


_evaluator: Evaluator | None = None


def init_worker(spec: EvaluatorSpec, store) -> None:
    global _evaluator
    _evaluator = Evaluator(spec, store)


def evaluate(task):
    return _evaluator(task)
