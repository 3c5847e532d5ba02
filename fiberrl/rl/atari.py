"""The standard Atari preprocessing (Mnih et al. 2015, as CleanRL's
``ppo_atari.py`` applies it): episode statistics of the real game, no-op
starts, frame skip with max-pooling, episodic life, FIRE on reset, reward
clipping, 84x84 grey frames, a stack of the last 4.

    make_atari("ALE/Breakout-v5")        # sticky actions (0.25), as the v5 ids publish
    make_atari("BreakoutNoFrameskip-v4")  # no sticky actions, as the DQN/PPO papers

Sticky actions are drawn by gymnasium's ``StickyAction`` wrapper from the
env's ``np_random`` (per emulator frame, as the emulator would), not by the
emulator, whose random generator ``clone_state`` does not capture: so
``snapshot(env)`` before a reset, restored into a fresh env, replays the
episode that follows exactly (how a resumed run rebuilds its envs).

Observations are ``(4, 84, 84)`` uint8 arrays, channels first.  The episode
statistics (``info["episode"]``, gymnasium's ``RecordEpisodeStatistics``) sit
below every other wrapper, so they report the whole game (all lives), its
unclipped score, and its length in emulator frames, as CleanRL reports them.
"""
from __future__ import annotations

import json

import ale_py
import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, RecordEpisodeStatistics, StickyAction

NOOP_MAX = 30
FRAME_SKIP = 4
SCREEN_SIZE = 84
FRAME_STACK = 4

# the emulator's banner, once per env, on stderr
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


class NotAtari(ValueError):
    pass


def is_atari(env: gym.Env) -> bool:
    return hasattr(env.unwrapped, "ale")


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode for the learner (terminated=True), but the
    game goes on: the next ``reset()`` only presses NOOP, unless the game is over."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.real_done = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.real_done = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed=None, options=None):
        if self.real_done:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(seed=seed, options=options)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after every reset: games like Breakout wait for it, and an
    untrained agent would spend most of its first episodes waiting."""

    def reset(self, *, seed=None, options=None):
        self.env.reset(seed=seed, options=options)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            self.env.reset(seed=seed, options=options)
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset(seed=seed, options=options)
        return obs, info


class ClipReward(gym.RewardWrapper):
    """The sign of the reward, so one learning rate suits every game."""

    def reward(self, reward):
        return float(np.sign(reward))


def make_atari(env_id: str, kwargs: dict | None = None, max_episode_steps: int | None = None,
               render_mode: str | None = None) -> gym.Env:
    options = dict(kwargs or {})
    spec = gym.spec(env_id)
    # the preprocessing skips frames itself; an env that skips too would skip 16
    if options.setdefault("frameskip", 1) != 1:
        raise NotAtari(f"env.kwargs.frameskip={options['frameskip']}: with env.atari=true the preprocessing skips "
                       f"{FRAME_SKIP} frames itself; leave frameskip unset")
    if spec.entry_point != "ale_py.env:AtariEnv":
        raise NotAtari(f"env.atari=true applies Atari preprocessing, and {env_id} is not an Atari game "
                       f"(an ALE/... or ...NoFrameskip-v4 id)")
    sticky = float(options.pop("repeat_action_probability", spec.kwargs.get("repeat_action_probability", 0.0)))
    options["repeat_action_probability"] = 0.0
    if max_episode_steps is not None:
        options["max_episode_steps"] = int(max_episode_steps)  # emulator frames: the limit applies below the skip
    if render_mode is not None:
        options["render_mode"] = render_mode
    env = gym.make(env_id, **options)
    if sticky > 0:
        env = StickyAction(env, sticky)
    env = RecordEpisodeStatistics(env)
    env = AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE,
                             terminal_on_life_loss=False, grayscale_obs=True)
    env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    env = ClipReward(env)
    return FrameStackObservation(env, FRAME_STACK)


def snapshot(env: gym.Env) -> np.ndarray:
    """The emulator's state and the env's random generator, as bytes: taken
    before a reset, ``restore`` then that reset replay what followed."""
    ale_state = env.unwrapped.clone_state(include_rng=True).serialize()
    rng = json.dumps(env.unwrapped.np_random.bit_generator.state).encode()
    return np.frombuffer(len(ale_state).to_bytes(8, "little") + ale_state + rng, np.uint8)


def restore(env: gym.Env, saved: np.ndarray) -> None:
    data = saved.tobytes()
    size = int.from_bytes(data[:8], "little")
    env.unwrapped.restore_state(ale_py.ALEState(data[8:8 + size]))
    env.unwrapped.np_random.bit_generator.state = json.loads(data[8 + size:])
