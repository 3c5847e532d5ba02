"""EnvPool as an env server's engine (``env.engine=envpool``): the server's
envs are one EnvPool batch, stepped by its C++ threads, behind the contract
of the gymnasium path (``fiberrl.rl.env_servers.EnvServer``).

What is made the same as the gymnasium path:
- the autoreset: EnvPool resets a finished env on the *next* step (ignoring
  that step's action); the server steps the finished envs once more at once,
  so ``obs[i]`` is already the next episode's first observation, and a
  truncated episode's last one comes back in ``final_obs``;
- Atari (``env.atari=true``): the ids (``ALE/Breakout-v5`` with sticky actions
  0.25, ``BreakoutNoFrameskip-v4`` without) map to EnvPool's ``Breakout-v5``
  with the same preprocessing: 30 no-op starts, 4 frames skipped and
  max-pooled, 84x84 grey, a stack of 4, FIRE on reset, a lost life ends the
  learner's episode while the game goes on, rewards clipped to their sign;
  the episodes reported are whole games with their unclipped score, and the
  time limit counts emulator frames;
- the seeds: env ``i`` of the whole batch starts from the seed the gymnasium
  path resets its first episode with.

What differs, and why:
- later episodes follow the env's own generator instead of a seed per
  episode (EnvPool takes seeds only when it is made), so a resumed run starts
  its envs' episodes afresh rather than replaying them: it is not bit-exact;
- after a lost life EnvPool keeps the frame stack and presses FIRE, where
  the gymnasium stack presses NOOP, FIRE, RIGHT and refills the stack;
- an Atari episode's length is its agent steps x 4 frames (the no-op starts
  are not counted).
"""
from __future__ import annotations

import re
import warnings

import gymnasium as gym
import numpy as np

from .atari import FRAME_SKIP, FRAME_STACK, NOOP_MAX, SCREEN_SIZE

# gymnasium's Atari ids: ALE/<Game>-v5 (sticky actions) and <Game>NoFrameskip-v4 (none)
ATARI_ID = re.compile(r"^(?:ALE/(?P<v5>[A-Za-z]+)-v5|(?P<v4>[A-Za-z]+)NoFrameskip-v4)$")
# the gymnasium kwargs an Atari game takes that EnvPool takes under the same name
ATARI_KWARGS = ("repeat_action_probability", "full_action_space", "mode", "difficulty")


class NoEnvPoolTask(ValueError):
    """EnvPool cannot make this env as the gymnasium path would; the message says why."""


def unavailable() -> str | None:
    """Why EnvPool cannot be used here, or None."""
    try:
        import envpool  # noqa: F401
    except ImportError as exc:
        return f"envpool is not installed ({exc}); pip install 'fiberrl[envpool]'"
    return None


def task(env_id: str, kwargs: dict, max_episode_steps: int | None, atari: bool) -> tuple[str, dict]:
    """EnvPool's task id and options for the env the gymnasium path makes of these settings."""
    import envpool
    if atari:
        return _atari_task(env_id, kwargs, max_episode_steps)
    if kwargs:
        raise NoEnvPoolTask(f"env.kwargs={kwargs}: EnvPool's {env_id} does not take gymnasium's kwargs")
    if env_id not in envpool.list_all_envs():
        raise NoEnvPoolTask(f"EnvPool has no {env_id}")
    options = {}
    if max_episode_steps is not None:
        options["max_episode_steps"] = int(max_episode_steps)
    return env_id, options


def _atari_task(env_id: str, kwargs: dict, max_episode_steps: int | None) -> tuple[str, dict]:
    import envpool
    match = ATARI_ID.match(env_id)
    if match is None:
        raise NoEnvPoolTask(f"{env_id} is not an ALE/<Game>-v5 or <Game>NoFrameskip-v4 id")
    game = match["v5"] or match["v4"]
    name = f"{game}-v5"
    if name not in envpool.list_all_envs():
        raise NoEnvPoolTask(f"EnvPool has no {game}")
    unknown = sorted(set(kwargs) - set(ATARI_KWARGS))
    if unknown:
        raise NoEnvPoolTask(f"env.kwargs {', '.join(unknown)}: EnvPool's Atari games do not take them")
    registered = gym.spec(env_id)
    frames = max_episode_steps or registered.max_episode_steps or registered.kwargs.get(
        "max_num_frames_per_episode") or 108_000
    options = dict(repeat_action_probability=float(registered.kwargs.get("repeat_action_probability", 0.0)),
                   full_action_space=bool(registered.kwargs.get("full_action_space", False)))
    options.update(kwargs)
    # episodic_life: a lost life ends the learner's episode and EnvPool's next step goes on with the game;
    # reward_clip off: the server clips, and sums the unclipped rewards into the game's score
    options.update(noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, img_height=SCREEN_SIZE, img_width=SCREEN_SIZE,
                   gray_scale=True, stack_num=FRAME_STACK, episodic_life=True, reward_clip=False,
                   use_fire_reset=True, max_episode_steps=max(1, int(frames) // FRAME_SKIP))
    return name, options


class EnvPoolBatch:
    """One EnvPool batch of ``len(seeds)`` envs, env ``i`` seeded with ``seeds[i]``, stepped
    with same-step autoreset.  ``step`` returns the pieces of a ``ServerStep``."""

    def __init__(self, env_id: str, kwargs: dict, max_episode_steps: int | None, atari: bool, seeds: list[int],
                 threads: int = 1):
        import envpool
        name, options = task(env_id, kwargs, max_episode_steps, atari)
        self.atari, self.n = atari, len(seeds)
        with warnings.catch_warnings():  # EnvPool builds its Box spaces from float64 bounds: not the user's to fix
            warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
            self.pool = envpool.make(name, env_type="gymnasium", num_envs=self.n, batch_size=self.n,
                                     num_threads=max(1, min(threads, self.n)),
                                     env_seed=[int(s) % 2**31 for s in seeds], **options)
            self.observation_space, self.action_space = self.pool.observation_space, self.pool.action_space
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self.returns, self.lengths = np.zeros(self.n), np.zeros(self.n, np.int64)
        self.all_ids = np.arange(self.n, dtype=np.int32)

    def reset(self) -> np.ndarray:
        obs, info = self.pool.reset(self.all_ids)
        self.returns[:], self.lengths[:] = 0.0, 0
        return self._in_order(obs, info)

    def step(self, actions) -> tuple:
        """(obs, reward, terminated, truncated, final obs by env, [(env, return, length)] of the
        episodes that ended)."""
        actions = np.asarray(actions)
        if self.discrete:
            actions = actions.astype(np.int32).reshape(self.n)
        obs, reward, terminated, truncated, info = self.pool.step(actions, self.all_ids)
        obs = self._in_order(obs, info)
        order = np.argsort(info["env_id"])
        reward, terminated, truncated = reward[order], terminated[order].astype(bool), truncated[order].astype(bool)
        self.returns += reward  # unclipped: EnvPool's reward_clip is off
        self.lengths += 1
        if self.atari:
            game_over = info["terminated"][order].astype(bool) | truncated  # the game, not the life
            reward = np.sign(reward)
        else:
            game_over = terminated | truncated
        ended = np.flatnonzero(terminated | truncated)
        final = {int(i): obs[i].copy() for i in np.flatnonzero(truncated & ~terminated)}
        episodes = [(int(i), float(self.returns[i]), int(self.lengths[i]) * (FRAME_SKIP if self.atari else 1))
                    for i in np.flatnonzero(game_over)]
        self.returns[game_over], self.lengths[game_over] = 0.0, 0
        if ended.size:
            # EnvPool resets an env on the step after its end, whatever that step's action: take it now
            ids = ended.astype(np.int32)
            filler = np.zeros((ids.size, *self.action_space.shape), self.action_space.dtype)
            after, _, _, _, info_after = self.pool.step(filler, ids)
            obs[info_after["env_id"]] = after
        return obs, reward.astype(np.float32), terminated, truncated, final, episodes

    def close(self) -> None:
        self.pool.close()

    def _in_order(self, obs: np.ndarray, info: dict) -> np.ndarray:
        ordered = np.empty_like(obs)
        ordered[info["env_id"]] = obs
        return ordered
