"""The learner's side of PPO beyond its network: the optimizer, the random
generator of the minibatch order, and the observation and reward normalisers."""
from __future__ import annotations

import numpy as np
import torch


class RunningMeanStd:
    """Mean and variance of a stream of batches (Chan et al.'s parallel update), as gymnasium's."""

    def __init__(self, shape=()):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, batch: np.ndarray) -> None:
        mean, var, n = batch.mean(axis=0), batch.var(axis=0), batch.shape[0]
        delta, total = mean - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + var * n + np.square(delta) * self.count * n / total) / total
        self.count = total

    def normalize(self, x: np.ndarray, clip: float) -> np.ndarray:
        return np.clip((x - self.mean) / np.sqrt(self.var + 1e-8), -clip, clip).astype(np.float32)


class Learner:
    """The agent, its optimizer, the random generators and the normalisers:
    everything of the learner's side that the run's result depends on
    (``checkpoint.learner_state`` saves it, ``checkpoint.restore_learner`` restores it)."""

    def __init__(self, agent, algo, num_envs: int, obs_shape, seed: int, device: torch.device):
        self.agent, self.algo, self.device = agent, algo, device
        self.optimizer = torch.optim.Adam(agent.parameters(), lr=algo.learning_rate, eps=1e-5)
        self.rng = np.random.Generator(np.random.PCG64([seed, 2]))  # minibatch order
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
