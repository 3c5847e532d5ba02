"""CartPole that says where it runs: ``Recorded-v0`` leaves an empty file ``<folder>/<RANK>.<pid>`` as it is
made, so that a test finds the env servers of one learner of a Ring (``algo.learners``; a learner's env
servers inherit its ``RANK``) and can stop or kill them."""
import os

import gymnasium as gym


class Recorded(gym.Wrapper):
    def __init__(self, folder: str):
        super().__init__(gym.make("CartPole-v1").unwrapped)
        with open(os.path.join(folder, f"{os.environ.get('RANK', '-')}.{os.getpid()}"), "w"):
            pass


gym.register("Recorded-v0", entry_point=Recorded, max_episode_steps=500)


def servers_of(folder: str, rank: int, learners: list[int]) -> list[int]:
    """The pids of learner ``rank``'s env servers that made an env (``learners``: the Ring's pids; a
    learner makes one too, to read the spaces)."""
    return sorted({int(name.split(".")[1]) for name in os.listdir(folder) if name.split(".")[0] == str(rank)}
                  - set(learners))
