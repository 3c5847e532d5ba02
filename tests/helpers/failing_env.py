"""CartPole that fails on purpose: ``Failing-v0`` raises ValueError at its 20th step in the env servers of
learner ``fail_rank`` of a Ring (a learner's env servers inherit its ``RANK``), so that a test sees what a
learner does with an error that would happen again."""
import os

import gymnasium as gym


class Failing(gym.Wrapper):
    def __init__(self, fail_rank: int = 1):
        super().__init__(gym.make("CartPole-v1").unwrapped)
        self.fails = os.environ.get("RANK") == str(fail_rank)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.fails and self.steps == 20:
            raise ValueError("the env failed on purpose")
        return super().step(action)


gym.register("Failing-v0", entry_point=Failing, max_episode_steps=500)
