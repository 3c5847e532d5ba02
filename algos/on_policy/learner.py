"""The learner's side of PPO beyond its network: the optimizer, the random
generator of the minibatch order, and the observation and reward normalisers
(with several learners, ``peers``, whose statistics they share after each
rollout)."""
from __future__ import annotations

import numpy as np
import torch

from .peers import SOLO


class RunningMeanStd:
    """Mean and variance of a stream of batches (Chan et al.'s parallel update), as gymnasium's.
    With several learners each takes in its own envs' rows, and ``peers.share`` makes all of
    theirs since the last share its statistics (``shared`` is what they all had then, ``unshared``
    the count, sum and sum of squares of this learner's rows since)."""

    def __init__(self, shape=(), mean=None, var=None, count: float = 1e-4):
        self.mean = np.zeros(shape, np.float64) if mean is None else np.asarray(mean, np.float64)
        self.var = np.ones(shape, np.float64) if var is None else np.asarray(var, np.float64)
        self.count = float(count)
        self.shared = (self.mean, self.var, self.count)
        self.unshared = (0, 0.0, 0.0)

    def update(self, batch: np.ndarray) -> None:
        rows, (n, total, squares) = np.asarray(batch, np.float64), self.unshared
        self.unshared = (n + rows.shape[0], total + rows.sum(axis=0), squares + np.square(rows).sum(axis=0))
        self.mean, self.var, self.count = combine((self.mean, self.var, self.count),
                                                  (batch.mean(axis=0), batch.var(axis=0), batch.shape[0]))

    def normalize(self, x: np.ndarray, clip: float) -> np.ndarray:
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -clip, clip).astype(np.float32)


def combine(a: tuple, b: tuple) -> tuple:
    """(mean, variance, count) of two sets of rows taken together, from each one's."""
    (mean_a, var_a, count_a), (mean_b, var_b, count_b) = a, b
    delta, total = mean_b - mean_a, count_a + count_b
    mean = mean_a + delta * count_b / total
    var = (var_a * count_a + var_b * count_b + np.square(delta) * count_a * count_b / total) / total
    return mean, var, total


class Learner:
    """The agent, its optimizer, the random generators and the normalisers:
    everything of the learner's side that the run's result depends on
    (``checkpoint.learner_state`` saves it, ``checkpoint.restore_learner`` restores it)."""

    def __init__(self, agent, algo, num_envs: int, obs_shape, seed: int, device: torch.device, peers=SOLO):
        self.agent, self.algo, self.device, self.peers = agent, algo, device, peers
        self.optimizer = torch.optim.Adam(agent.parameters(), lr=algo.learning_rate, eps=1e-5)
        # minibatch order: each learner draws its own over its own data
        self.rng = np.random.Generator(np.random.PCG64([seed, 2] + ([peers.rank] if peers.rank else [])))
        self.obs_rms = RunningMeanStd(obs_shape) if algo.norm_obs else None
        self.ret_rms = RunningMeanStd() if algo.norm_reward else None
        self.discounted = np.zeros(num_envs)  # each env's discounted return so far, for ret_rms

    def observe(self, raw: np.ndarray, update: bool = True) -> torch.Tensor:
        """Observations as the agent sees them (normalised when algo.norm_obs), on its device."""
        if self.obs_rms is not None:
            if update:
                self.obs_rms.update(raw)
            raw = self.obs_rms.normalize(raw, self.algo.obs_clip)
        return torch.as_tensor(raw, device=self.device)

    def scale(self, reward: np.ndarray, ended: np.ndarray) -> np.ndarray:
        """Rewards divided by the std of the discounted return, as gymnasium's NormalizeReward."""
        if self.ret_rms is None:
            return reward
        self.discounted = self.discounted * self.algo.gamma + reward
        self.ret_rms.update(self.discounted)
        self.discounted[ended] = 0.0
        return np.clip(reward / np.sqrt(self.ret_rms.var + 1e-8), -self.algo.reward_clip, self.algo.reward_clip)

    def share_statistics(self, cursor) -> None:
        """With several learners, after each one's rollout: the normalisers' statistics of all of their steps,
        the same for every learner, and ``cursor``'s observation normalised by them."""
        if self.peers.size == 1:
            return
        for rms in (self.obs_rms, self.ret_rms):
            if rms is not None:
                self.peers.share(rms)
        if self.obs_rms is not None:
            cursor.obs = self.observe(cursor.raw, update=False)
