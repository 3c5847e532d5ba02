"""A toy env whose correct values are known, for PPO's episode-end handling.

``Chain-v0``: the observation is ``[t, L]`` (steps taken, the episode's
length); every step pays 1; the episode terminates after ``L`` steps, ``L``
drawn from {3, 7} at each reset; a time limit truncates it after 5 steps.  So
episodes of 3 terminate and episodes of 7 are truncated at 5, and the value
of ``[t, L]`` (the return the episode would have without the time limit, which
bootstrapping estimates) is ``(1 - gamma**(L - t)) / (1 - gamma)``.

``Drifting-v0``: an env that is not a function of its seed and actions, for
replays that cannot rebuild it: the observation is ``[t]``, and an episode
ends after 10 steps, or after the length ``drift_lengths(n)`` last set when
it began (a file, so that env servers see it too).
"""
import os
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np

LENGTHS = (3, 7)
TIME_LIMIT = 5


class Chain(gym.Env):
    observation_space = gym.spaces.Box(0.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length = 0, int(self.np_random.choice(LENGTHS))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}

    def _obs(self):
        return np.array([self.t, self.length], np.float32)


class Drifting(gym.Env):
    observation_space = gym.spaces.Box(0.0, 10.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        try:
            self.length = int(Path(DRIFT_FILE).read_text())
        except FileNotFoundError:
            self.length = 10
        return np.array([self.t], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 0.0, self.t >= self.length, False, {}


DRIFT_FILE = os.path.join(tempfile.gettempdir(), f"fiberrl-test-drifting-length-{os.getuid()}")


def drift_lengths(length: int | None) -> None:
    if length is None:
        Path(DRIFT_FILE).unlink(missing_ok=True)
    else:
        Path(DRIFT_FILE).write_text(str(length))


def true_value(obs: np.ndarray, gamma: float) -> np.ndarray:
    t, length = obs[..., 0], obs[..., 1]
    return (1 - gamma ** (length - t)) / (1 - gamma)


gym.register("Chain-v0", entry_point=Chain, max_episode_steps=TIME_LIMIT)
gym.register("Drifting-v0", entry_point=Drifting)
