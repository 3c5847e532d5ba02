"""CartPole that steps slowly in the env servers of one learner of a Ring (``algo.learners``):
``Slowed-v0`` sleeps ``delay`` seconds a step where the Ring's ``RANK`` (inherited by a learner's
env servers) is ``slow_rank``, so that learner is a straggler."""
import os
import time

import gymnasium as gym


class Slowed(gym.Wrapper):
    def __init__(self, delay: float = 0.01, slow_rank: int = 1):
        super().__init__(gym.make("CartPole-v1").unwrapped)
        self.delay = delay if os.environ.get("RANK") == str(slow_rank) else 0.0

    def step(self, action):
        if self.delay:
            time.sleep(self.delay)
        return self.env.step(action)


gym.register("Slowed-v0", entry_point=Slowed, max_episode_steps=500)
