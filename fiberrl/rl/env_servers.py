"""Environments on remote env servers, stepped as one batch, like a vector env.

Each env server is an ``AsyncManager`` process (so a job on the configured
backend) holding ``envs_per_server`` environments.  ``RemoteEnvs.step(actions)``
sends every server its slice of the actions at once and collects the replies,
so the servers step in parallel; each reply is one round trip carrying
numpy arrays (uint8 frames for Atari), stacked into one batch.

Autoreset, the contract between the servers and the learner: ``step`` steps
every env once, and an env whose episode ends is reset in the same call, so
``obs[i]`` is always an observation to act on (the first of a new episode
when ``terminated[i] or truncated[i]``).  The last observation of a
*truncated* episode, which the learner needs to bootstrap from, comes back in
``final_obs[i]``; a terminated one needs none.  Whole episodes that ended are
reported as ``(env index, return, length)`` from gymnasium's episode
statistics (for Atari: the whole game, unclipped) as ``Episode``s.

Determinism: env ``i`` of the whole batch (its *slot*) resets its ``k``-th
episode with a seed derived from (run seed, slot, generation, k), whichever
server holds it.  An Atari emulator is not reseeded per episode (reloading
the game costs ~70 ms, as much as 150 steps): its episodes after the first
start from a snapshot of the emulator taken before their reset
(``fiberrl.rl.atari.snapshot``, ~15 KB), which the server reports.  Every other
episode is played in an env made for it (``EnvSpec.new_env_per_episode``):
a reused env can carry state that its reset does not clear (BipedalWalker's
Box2D world does, and an episode replayed in a fresh one drifts apart from
its first step).  An episode
is thus a function of its seed or snapshot and its actions; ``RemoteEnvs``
records both for every slot, and ``history()`` rebuilds every env's state
exactly in new servers (``RemoteEnvs(..., history=...)`` replays it): that is
how a resumed run continues as the uninterrupted one would have.

Engines: a server steps its envs one by one in Python (``EnvServer``, the
gymnasium path) or as one EnvPool batch (``EnvPoolServer``,
``fiberrl.rl.envpool_engine``), which keeps this contract but cannot replay
a history: ``history()`` is then None, and a resume starts its envs afresh.

What becomes of a server that is lost, told to stop or cut off: ``fiberrl.rl.remote_envs``
(``RemoteEnvs``, the learner's side).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from ..runtime.managers import AsyncManager
from ..runtime.processes import stop_signal
from . import atari
from .envs import make_env



@dataclass(frozen=True)
class EnvSpec:
    """What an env server needs to make its envs; small, sent once per server."""
    id: str
    kwargs: dict = field(default_factory=dict)
    max_episode_steps: int | None = None
    atari: bool = False
    engine: str = "gymnasium"          # or "envpool": the server's envs as one EnvPool batch (envpool_engine)
    threads: int = 1                   # EnvPool's threads per server
    # each (non-Atari) episode in an env made for it, so that a replay can rebuild it: one make an episode,
    # ~3 ms for BipedalWalker against up to 1600 steps of ~0.2 ms, but ~0.1 ms for CartPole against ~20
    # steps of ~0.02 ms (its config turns it off: its reset sets all its state)
    new_env_per_episode: bool = True

    def make(self, render_mode: str | None = None) -> gym.Env:
        """The env with its episode statistics in ``info["episode"]`` at each episode's end."""
        env = make_env(self.id, self.kwargs, self.max_episode_steps, render_mode, atari=self.atari)
        # the Atari stack has them already, below the lost-life episode ends
        return env if self.atari else gym.wrappers.RecordEpisodeStatistics(env)


def episode_seed(seed: int, slot: int, generation: int, episode: int) -> int:
    return int(np.random.SeedSequence([seed, slot, generation, episode]).generate_state(1)[0])


@dataclass
class SlotHistory:
    """What rebuilds one env's state: the episodes it finished (so the seed of
    the one it is in) or the snapshot its episode started from (Atari), and
    since that episode's reset, its actions and the positions among them of
    the resets that were not new episodes (a lost life)."""
    episode: int
    actions: np.ndarray
    life_resets: np.ndarray
    start: np.ndarray | None = None


class Episode(NamedTuple):
    """A whole episode that ended (for Atari: the game, not a life)."""
    env: int                           # its env's index: in the server's envs, or in the whole batch
    reward: float                      # its return, unclipped
    length: int


class ServerStep(NamedTuple):
    """An env server's reply to ``step``: its envs' part of a ``Step``, indexed in the server."""
    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: dict                    # env -> last obs of its truncated episode
    episodes: list[Episode]
    starts: dict                       # env -> the snapshot its new Atari episode starts from
    leaving: bool = False              # the server was told to stop: its envs are to move


@dataclass
class Step:
    obs: np.ndarray                    # (num_envs, *obs_shape): the observations to act on next
    reward: np.ndarray                 # float32
    terminated: np.ndarray             # bool
    truncated: np.ndarray              # bool
    final_obs: dict = field(default_factory=dict)   # env index -> last obs of its truncated episode
    episodes: list[Episode] = field(default_factory=list)  # whole episodes that ended


def stop_when_told() -> None:
    """An env server's first act: SIGTERM marks its replies (``leaving``) and ends it
    ``preempt_grace`` seconds later."""
    stop_signal.watch(stop_signal.exit_after_grace)


class EnvServer:
    """Lives in an env server process: its envs, stepped together."""

    def __init__(self, spec: EnvSpec, seed: int, slots: list[int], generation: int = 0):
        self.spec, self.seed, self.slots, self.generation = spec, seed, list(slots), generation
        self.envs = [spec.make() for _ in self.slots]
        self.stepped = [False] * len(self.envs)  # since it was made: a new episode then needs a new env
        self.episode = [0] * len(self.envs)
        space = self.envs[0].observation_space
        self.obs_dtype = space.dtype if isinstance(space, gym.spaces.Box) else np.float32
        self.discrete = isinstance(self.envs[0].action_space, gym.spaces.Discrete)

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        return self.envs[0].observation_space, self.envs[0].action_space

    def reset(self) -> np.ndarray:
        """The first observations."""
        return self._batch([self._new_episode(i) for i in range(len(self.envs))])

    def replay(self, history: list[SlotHistory]) -> tuple[np.ndarray, list[int]]:
        """The observations of the envs rebuilt from ``history``, and the envs that ended before their
        record did (an env that is not a function of its seed and actions): each of those starts its
        next episode instead of stepping on past its end."""
        obs, ended = [], []
        for i, h in enumerate(history):
            o, whole = self._replay(i, h)
            obs.append(o)
            if not whole:
                ended.append(i)
        return self._batch(obs), ended

    def step(self, actions) -> ServerStep:
        n = len(self.envs)
        obs, rewards = [], np.zeros(n, np.float32)
        terminated, truncated = np.zeros(n, bool), np.zeros(n, bool)
        final, episodes, starts = {}, [], {}
        for i, env in enumerate(self.envs):
            self.stepped[i] = True
            o, rewards[i], terminated[i], truncated[i], info = env.step(self._action(actions[i]))
            if terminated[i] or truncated[i]:
                if truncated[i] and not terminated[i]:
                    final[i] = np.asarray(o, self.obs_dtype)
                if "episode" in info:  # the real end of the episode (of the game, for Atari)
                    episodes.append(Episode(i, float(info["episode"]["r"]), int(info["episode"]["l"])))
                    self.episode[i] += 1
                    if self.spec.atari:
                        starts[i] = atari.snapshot(env)
                        o, _ = env.reset()
                    else:
                        o = self._new_episode(i)
                else:  # a lost life: the game goes on from a reset that starts no new episode
                    o, _ = env.reset()
            obs.append(o)
        return ServerStep(self._batch(obs), rewards, terminated, truncated, final, episodes, starts,
                          stop_signal.told())

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def _action(self, action):
        return int(action) if self.discrete else np.asarray(action)

    def _new_episode(self, i: int):
        if self.stepped[i] and self.spec.new_env_per_episode and not self.spec.atari:
            self.envs[i].close()
            self.envs[i], self.stepped[i] = self.spec.make(), False
        obs, _ = self.envs[i].reset(seed=episode_seed(self.seed, self.slots[i], self.generation, self.episode[i]))
        return obs

    def _replay(self, i: int, history: SlotHistory):
        """(the env's observation, whether all of ``history`` was replayed)."""
        self.episode[i] = history.episode
        if history.start is None:
            obs = self._new_episode(i)
        else:
            atari.restore(self.envs[i], history.start)
            obs, _ = self.envs[i].reset()
        resets = list(history.life_resets)
        for k, action in enumerate(history.actions):
            while resets and resets[0] == k:
                obs, _ = self.envs[i].reset()
                resets.pop(0)
            self.stepped[i] = True
            obs, _, terminated, truncated, _ = self.envs[i].step(self._action(action))
            if (terminated or truncated) and not (resets and resets[0] == k + 1):
                self.episode[i] += 1  # the recorded episode went on from here: this one cannot
                return self._new_episode(i), False
        for _ in resets:  # a life lost on the last step
            obs, _ = self.envs[i].reset()
        return obs, True

    def _batch(self, obs: list) -> np.ndarray:
        return np.stack(obs).astype(self.obs_dtype, copy=False)


class EnvPoolServer(EnvServer):
    """An env server whose envs are one EnvPool batch (``fiberrl.rl.envpool_engine``).  It keeps no
    history to replay (``RemoteEnvs`` never asks it to)."""

    def __init__(self, spec: EnvSpec, seed: int, slots: list[int], generation: int = 0):
        from .envpool_engine import EnvPoolBatch
        self.spec, self.seed, self.slots, self.generation = spec, seed, list(slots), generation
        self.batch = EnvPoolBatch(spec.id, spec.kwargs, spec.max_episode_steps, spec.atari,
                                  [episode_seed(seed, slot, generation, 0) for slot in self.slots], spec.threads)

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        return self.batch.observation_space, self.batch.action_space

    def reset(self) -> np.ndarray:
        return self.batch.reset()

    def step(self, actions) -> ServerStep:
        obs, reward, terminated, truncated, final, episodes = self.batch.step(actions)
        return ServerStep(obs, reward, terminated, truncated, final, [Episode(*e) for e in episodes], {},
                          stop_signal.told())

    def close(self) -> None:
        self.batch.close()


def make_env_server(spec: EnvSpec, seed: int, slots: list[int], generation: int = 0) -> EnvServer:
    """The server ``spec.engine`` names."""
    server = EnvPoolServer if spec.engine == "envpool" else EnvServer
    return server(spec, seed, slots, generation)


class EnvServerManager(AsyncManager):
    """The process that holds an ``EnvServer``."""

    # PPO's learner runs torch between steps, and its OpenMP threads spin a while after each
    # op: a batch-scheduled server cannot preempt them (rollout 1-8% slower with 4 servers here)
    batch_scheduling = False


EnvServerManager.register("EnvServer", make_env_server, exposed=("spaces", "reset", "replay", "step", "close"))
