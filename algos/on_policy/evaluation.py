"""A trained agent acting outside training: evaluation episodes, on the
learner during a run and in ``fiberrl.evaluate`` after it."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from .learner import RunningMeanStd


def env_actions(action: torch.Tensor, space: gym.Space) -> np.ndarray:
    """The agent's actions as the env takes them."""
    action = action.cpu().numpy()
    if isinstance(space, gym.spaces.Box):  # the Gaussian is unbounded; the env is not
        return np.clip(action, space.low, space.high).astype(space.dtype)
    return action


class Policy:
    """A trained agent as evaluation runs it: observations normalised as in
    training, actions sampled from the policy (as CleanRL evaluates PPO) or,
    ``deterministic``, its most likely action (as Stable-Baselines3 does)."""

    def __init__(self, agent, action_space: gym.Space, obs_rms: RunningMeanStd | None, obs_clip: float,
                 atari: bool, device: torch.device, deterministic: bool = False):
        self.agent, self.action_space, self.obs_rms, self.obs_clip = agent.eval(), action_space, obs_rms, obs_clip
        self.atari, self.device, self.deterministic = atari, device, deterministic

    def act(self, obs, generator: torch.Generator | None = None):
        obs = np.asarray(obs)[None]
        if self.obs_rms is not None:
            obs = self.obs_rms.normalize(obs, self.obs_clip)
        obs = torch.as_tensor(obs, device=self.device)
        with torch.no_grad():
            if self.deterministic:
                dist, _ = self.agent(obs)
                action = dist.mean if self.agent.continuous else dist.probs.argmax(-1)
            else:
                action = self.agent.get_action_and_value(obs, generator=generator)[0]
        return env_actions(action, self.action_space)[0]


def run_episode(env: gym.Env, policy: Policy, seed: int, on_step=None) -> tuple[float, int]:
    """One whole episode, reset and sampled with ``seed``: (return, length).  On
    Atari a whole game (a lost life resets inside it), with the game's own
    unclipped score and its length in frames, as the training metrics count them."""
    generator = torch.Generator(policy.device).manual_seed(int(seed))
    obs, _ = env.reset(seed=int(seed))
    if on_step is not None:
        on_step()
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(policy.act(obs, generator))
        total, steps = total + float(reward), steps + 1
        if on_step is not None:
            on_step()
        if terminated or truncated:
            if "episode" in info:
                return float(info["episode"]["r"]), int(info["episode"]["l"])
            if not policy.atari:
                return total, steps
            obs, _ = env.reset()


def evaluate(env: gym.Env, policy: Policy, episodes: int, update: int) -> float:
    """The mean return of ``episodes`` evaluation episodes after update ``update``, on seeds of their own
    (evaluating leaves the training's random numbers alone)."""
    reward = float(np.mean([run_episode(env, policy, 1_000_000_007 * (update + 1) + i)[0] for i in range(episodes)]))
    policy.agent.train()
    return reward
