"""Where each PPO update's rollout comes from: ``Rollouts.next()`` gives it,
collected there and then, or, with async rollouts (``algo.async_rollouts``),
collected by a thread while the update before trained, by a copy of the agent
as that update found it (Sample Factory's PPO, IMPALA)."""
from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from .evaluation import env_actions
from .learner import Learner

# torch threads of a CPU learner while it steps the envs: its inference batches are a few rows, and
# the OpenMP threads of a second one spin after each op on the cores the env servers need.  Measured
# on 2 cores, a rollout of the BipedalWalker preset (32 envs on 2 servers) 10-12 s -> 6 s, of Breakout's
# defaults 0.83 -> 0.67 s; the update keeps every thread
ROLLOUT_THREADS = 1


@dataclass
class Rollout:
    """One rollout, as CleanRL keeps it: on the learner's device, (steps, envs, ...)."""
    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    rewards: torch.Tensor
    ends: torch.Tensor
    values: torch.Tensor
    next_value: torch.Tensor                      # the critic's value of the observation after the last step
    episodes: list = field(default_factory=list)  # whole episodes that ended in it
    seconds: float = 0.0                          # to collect it...
    inference_s: float = 0.0                      # ...of which the policy's forward passes
    steps: int | None = None                      # steps per env, fewer than num_steps when preempted

    TENSORS = ("obs", "actions", "logprobs", "rewards", "ends", "values", "next_value")

    def collected(self) -> Rollout:
        """Its steps that were collected: all of them unless a straggler's rollout was cut short."""
        if self.steps is None or self.steps == self.obs.shape[0]:
            return self
        cut = {name: getattr(self, name)[:self.steps] for name in self.TENSORS if name != "next_value"}
        return Rollout(**cut, next_value=self.next_value, episodes=self.episodes, seconds=self.seconds,
                       inference_s=self.inference_s, steps=self.steps)


def new_rollout(num_steps: int, num_envs: int, observation_space, action_space, algo, device) -> Rollout:
    obs = torch.zeros((num_steps, num_envs, *observation_space.shape), device=device,
                      dtype=torch.uint8 if observation_space.dtype == np.uint8 and not algo.norm_obs
                      else torch.float32)
    actions = torch.zeros((num_steps, num_envs, *action_space.shape), device=device,
                          dtype=torch.float32 if isinstance(action_space, gym.spaces.Box) else torch.long)
    logprobs, rewards, ends, values = (torch.zeros((num_steps, num_envs), device=device) for _ in range(4))
    return Rollout(obs, actions, logprobs, rewards, ends, values, torch.zeros(num_envs, device=device))


@dataclass
class Cursor:
    """Where the envs are: their last observations, raw and as the agent sees them."""
    raw: np.ndarray
    obs: torch.Tensor


def bootstrap_truncated(rewards: np.ndarray, final_values: dict, gamma: float) -> np.ndarray:
    """Rewards with ``gamma * V(final obs)`` added where an episode was truncated:
    its return goes on past the cut, and GAE will treat the step as the last."""
    rewards = rewards.copy()
    for i, value in final_values.items():
        rewards[i] += gamma * value
    return rewards


def collect(rollout: Rollout, actor, envs, learner: Learner, cursor: Cursor, action_space, algo,
            update: int = 0) -> None:
    """Fill ``rollout`` with ``algo.num_steps`` steps of every env from ``cursor`` on, ``actor`` acting;
    fewer when the learner's peers say this straggler's rollout ends early (``algo.preempt_share``)."""
    began, inference = time.perf_counter(), 0.0
    rollout.episodes, rollout.steps = [], algo.num_steps
    peers = learner.peers
    for step in range(algo.num_steps):
        rollout.obs[step] = cursor.obs
        t = time.perf_counter()
        with torch.no_grad():
            action, logprob, _, value = actor.get_action_and_value(cursor.obs)
        inference += time.perf_counter() - t
        rollout.actions[step], rollout.logprobs[step], rollout.values[step] = action, logprob, value
        result = envs.step(env_actions(action, action_space))

        ended = result.terminated | result.truncated
        reward = learner.scale(result.reward.astype(np.float64), ended)
        if result.final_obs:  # truncated episodes: their value goes on past the cut
            index = sorted(result.final_obs)
            with torch.no_grad():
                final = actor.get_value(learner.observe(np.stack([result.final_obs[i] for i in index]), update=False))
            reward = bootstrap_truncated(reward, dict(zip(index, final.cpu().numpy(), strict=True)), algo.gamma)
        rollout.rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=rollout.rewards.device)
        rollout.ends[step] = torch.as_tensor(ended, dtype=torch.float32, device=rollout.ends.device)
        cursor.raw, cursor.obs = result.obs, learner.observe(result.obs)
        rollout.episodes += result.episodes
        if peers.cut_short(update, step):
            rollout.steps = step + 1
            break
    peers.rollout_done(update)
    learner.share_statistics(cursor)
    with torch.no_grad():
        rollout.next_value = actor.get_value(cursor.obs)
    rollout.seconds, rollout.inference_s = time.perf_counter() - began, inference


class Rollouts:
    """``next(update)``: the rollout update ``update`` learns from.  Synchronous, it is collected
    then, with the learner's agent, on ROLLOUT_THREADS torch threads of a CPU learner (the update gets
    them all back).  Async, a thread collects the next update's rollout, with a copy of the agent as
    ``next`` left it, while this update trains; ``wait()`` after the update waits for it, and
    ``pending()`` is that rollout, which a checkpoint then holds."""

    def __init__(self, learner: Learner, envs, cursor: Cursor, observation_space, action_space, algo,
                 num_envs: int, updates: int):
        self.learner, self.envs, self.cursor, self.action_space, self.algo = learner, envs, cursor, action_space, algo
        self.updates = updates
        self.asynchronous = algo.async_rollouts
        # two with async rollouts: the next one is collected while the update learns from the other
        self.buffers = [new_rollout(algo.num_steps, num_envs, observation_space, action_space, algo, learner.device)
                        for _ in range(2 if self.asynchronous else 1)]
        self.actor = copy.deepcopy(learner.agent) if self.asynchronous else learner.agent
        self.learner_threads = torch.get_num_threads()
        self.one_thread = learner.device.type == "cpu" and not self.asynchronous
        self.collector = ThreadPoolExecutor(1, thread_name_prefix="rollout") if self.asynchronous else None
        if self.asynchronous and learner.device.type == "cpu":
            torch.set_num_threads(max(1, self.learner_threads - ROLLOUT_THREADS))  # the rest is the rollout's
        self._ready = None      # the update whose rollout was collected already (async, or restored)
        self._following = None  # the collection running for the next update

    def restore_pending(self, update: int) -> Rollout:
        """The buffer that update ``update``'s rollout, collected before a checkpoint, is restored into."""
        self._ready = update
        return self.buffers[update % 2]

    def next(self, update: int) -> Rollout:
        rollout = self.buffers[update % len(self.buffers)]
        self._following = None
        if self._ready != update:
            if self.one_thread:
                torch.set_num_threads(ROLLOUT_THREADS)
            try:
                collect(rollout, self.actor, self.envs, self.learner, self.cursor, self.action_space, self.algo,
                        update)
            finally:
                if self.one_thread:
                    torch.set_num_threads(self.learner_threads)
        if self.asynchronous and update + 1 < self.updates:
            self.actor.load_state_dict(self.learner.agent.state_dict())  # the policy this update starts from
            self._following = self.collector.submit(collect, self.buffers[(update + 1) % 2], self.actor, self.envs,
                                                    self.learner, self.cursor, self.action_space, self.algo)
            self._ready = update + 1
        return rollout

    def wait(self) -> float:
        """Seconds waited for the next rollout's collection to end (async); its failure (an env server
        beyond replacing) raises here."""
        if self._following is None:
            return 0.0
        began = time.perf_counter()
        self._following.result()
        return time.perf_counter() - began

    def pending(self) -> Rollout | None:
        """The rollout collected for the next update and not yet learnt from (async)."""
        return self.buffers[self._ready % 2] if self._following is not None else None

    def close(self) -> None:
        if self.collector is not None:
            self.collector.shutdown(cancel_futures=True)
        torch.set_num_threads(self.learner_threads)
