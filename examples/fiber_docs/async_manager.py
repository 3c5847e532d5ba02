"""Fiber's SyncManager vs AsyncManager comparison on CartPole, run on fiberrl.

Source: Fiber's repository, examples/async_manager.py, described in Fiber's
documentation, "AsyncManager" > "AsyncManager demo" ("We create 4 asynchronous
managers and each one of them manages a CartPole-v1 environment ... env.step(action)
returns a handle object immediately"), github.com/uber/fiber at
ad6faf02b8e94dee498990e9fd9c588234666725.
Changed besides the import (``from fiber.managers import AsyncManager,
SyncManager`` -> ``from fiberrl.runtime.managers import AsyncManager,
SyncManager``):
  * gymnasium instead of gym (gym is not installed here; ``import gymnasium as
    gym`` keeps ``gym.make``).  gymnasium's ``step`` returns five values,
    ``(observation, reward, terminated, truncated, info)``, where gym's returned
    four, so the two unpacking lines read five and set
    ``done = terminated or truncated``;
  * STEPS may be given as the first command-line argument (Fiber's 5000 is the
    default), so that a test can run fewer:
    ``python examples/fiber_docs/async_manager.py [STEPS]``.
Output: ``Sync manager took <t>s`` then ``Async manager took <t>s``.
"""
import gymnasium as gym
import sys
import time
from functools import partial
from fiberrl.runtime.managers import AsyncManager, SyncManager

NUM_ENVS = 4
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5000

class EnvSyncManager(SyncManager):
    pass

class EnvAsyncManager(AsyncManager):
    pass

def sync_manager():
    EnvManager = EnvSyncManager

    create_cart_pole = partial(gym.make, "CartPole-v1")
    local_env = create_cart_pole()
    EnvManager.register("CartPoleEnv", create_cart_pole)

    managers = [EnvManager() for i in range(NUM_ENVS)]
    [manager.start() for manager in managers]

    envs = [manager.CartPoleEnv() for manager in managers]
    [env.reset() for env in envs]

    for i in range(STEPS):
        actions = [local_env.action_space.sample() for _ in range(len(envs))]
        results = [env.step(action) for env, action in zip(envs, actions)]
        for j in range(len(results)):
            observation, reward, terminated, truncated, info = results[j]
            done = terminated or truncated
            if done:
                envs[j].reset()
        if len(envs) == 0:
            break

def async_manager():
    EnvManager = EnvAsyncManager
    create_cart_pole = partial(gym.make, "CartPole-v1")
    local_env = create_cart_pole()
    EnvManager.register("CartPoleEnv", create_cart_pole)

    managers = [EnvManager() for i in range(NUM_ENVS)]
    [manager.start() for manager in managers]

    envs = [manager.CartPoleEnv() for manager in managers]
    [env.reset() for env in envs]

    for i in range(STEPS):
        actions = [local_env.action_space.sample() for _ in range(len(envs))]
        handles = [env.step(action) for env, action in zip(envs, actions)]
        results = [handle.get() for handle in handles]
        for j in range(len(results)):
            observation, reward, terminated, truncated, info = results[j]
            done = terminated or truncated
            if done:
                envs[j].reset()
        if len(envs) == 0:
            break

def main():
    start = time.time()
    sync_manager()
    print("Sync manager took {}s".format(time.time() - start))

    start = time.time()
    async_manager()
    print("Async manager took {}s".format(time.time() - start))

if __name__ == '__main__':
    main()
