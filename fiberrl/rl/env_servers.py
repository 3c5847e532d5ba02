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

Preemption: a server told to stop (SIGTERM: its host taken back) answers
the step it is on, saying so, and ends ``preempt_grace`` seconds later if
nothing ends it first; ``RemoteEnvs`` then moves its envs to a new server
where they are (rebuilt from their histories: no step lost, no episode cut;
EnvPool's envs, which cannot be rebuilt, end their episodes there as
truncated and start new ones).  A server told to stop while the learner
updates, and gone before the next step, is a crash.

A lost host: a server whose job goes unheard past ``silence_timeout`` (its
host cut off or stalled; off the local backend) while it holds a step is
given up (``Process.cut_off``: it cannot come back beside its successor), and
a new server rebuilds its envs as they were before that step, from their
histories, and takes the step again: the step comes back as the lost server
would have answered it, nothing cut short (EnvPool's envs, which cannot be
rebuilt, go the crash path below).

Crashes: a server that dies (or does not answer within ``timeout``) is
replaced by a fresh one; its envs start new episodes with new seeds (the
slot's generation goes up), the episodes they were in are reported as
truncated with the last observation the learner had as their final one, the
event is logged on the ``fiberrl`` logger and counted in ``restarts``.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from ..runtime.managers import AsyncManager, ManagerError
from ..runtime.processes import stop_signal
from . import atari
from .envs import make_env

log = logging.getLogger("fiberrl")

# attempts at starting a replacement server before the run gives up
RESTART_ATTEMPTS = 3
# how often a step that has not come back looks whether its server is still heard
UNHEARD_CHECK = 1.0


class EnvServerError(RuntimeError):
    """An env server could not be started or replaced."""


class ServerUnheard(TimeoutError):
    """An env server's job went unheard past ``silence_timeout`` while it held a step."""


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


def _stop_when_told() -> None:
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


class RemoteEnvs:
    """``servers`` env servers of ``envs_per_server`` envs each, as one batch of
    ``num_envs`` envs in slot order (server 0's envs first).  ``first_slot``: where they
    begin in a batch that several learners share (PPO's ``algo.learners``), whose slots
    seed the envs' episodes, so that the batch is the same however it is split.

    It also keeps each slot's ``SlotHistory`` from what it sends and receives,
    so ``history()`` costs no round trip and survives a server's loss."""

    def __init__(self, spec: EnvSpec, servers: int, envs_per_server: int, seed: int, timeout: float = 60.0,
                 history: list[SlotHistory] | None = None, generations: list[int] | None = None,
                 first_slot: int = 0):
        if servers < 1 or envs_per_server < 1:
            raise ValueError(f"{servers} servers of {envs_per_server} envs: each needs at least one")
        self.spec, self.seed, self.timeout, self.first_slot = spec, seed, timeout, first_slot
        self.replayable = spec.engine != "envpool"  # whether history() can rebuild the envs: kept only then
        self.num_servers, self.envs_per_server = servers, envs_per_server
        self.num_envs = servers * envs_per_server
        self.restarts = 0
        self.handovers = 0  # servers told to stop whose envs moved to new ones
        self.rebuilds = 0  # servers unheard mid-step whose envs were rebuilt elsewhere, the step taken again
        self.generations = list(generations) if generations is not None else [0] * servers
        if history is not None and len(history) != self.num_envs:
            raise ValueError(f"a history of {len(history)} envs cannot rebuild {self.num_envs}")
        self._history = history if self.replayable else None  # EnvPool cannot replay: its envs start afresh
        self._episode = [h.episode for h in history] if history else [0] * self.num_envs
        self._actions = [list(h.actions) for h in history] if history else [[] for _ in range(self.num_envs)]
        self._life_resets = ([list(h.life_resets) for h in history] if history
                             else [[] for _ in range(self.num_envs)])
        self._starts = [h.start for h in history] if history else [None] * self.num_envs
        self._pending: list = [None] * servers
        self._obs: np.ndarray | None = None
        self.managers = [EnvServerManager() for _ in range(servers)]
        self.servers: list = [None] * servers
        try:
            # starting a server takes about a second: start them all at once
            with ThreadPoolExecutor(min(servers, 16)) as threads:
                list(threads.map(lambda m: m.start(_stop_when_told), self.managers))
            for k in range(servers):
                self.servers[k] = self.managers[k].EnvServer(spec, seed, self.seed_slots(k), self.generations[k])
            self.single_observation_space, self.single_action_space = self.servers[0].spaces().get(timeout)
        except BaseException:
            self.close()
            raise

    def slots(self, server: int) -> range:
        return range(server * self.envs_per_server, (server + 1) * self.envs_per_server)

    def seed_slots(self, server: int) -> list[int]:
        """Server ``server``'s slots in the whole batch: what seeds its envs' episodes."""
        return [self.first_slot + slot for slot in self.slots(server)]

    def reset(self) -> np.ndarray:
        """The first observations (when made with a history: those of the rebuilt envs)."""
        history, self._history = self._history, None
        if history is None:
            self._obs = np.concatenate([h.get(self.timeout) for h in [server.reset() for server in self.servers]])
            return self._obs.copy()
        handles = [server.replay([history[i] for i in self.slots(k)]) for k, server in enumerate(self.servers)]
        parts = [h.get(self.timeout) for h in handles]
        ended = [k * self.envs_per_server + i for k, (_, indices) in enumerate(parts) for i in indices]
        for slot in ended:
            self._episode[slot] += 1
            self._actions[slot], self._life_resets[slot], self._starts[slot] = [], [], None
        if ended:
            log.warning("envs %s ended before their recorded episodes did (an env that is not a function of its "
                        "seed and actions?): they start new episodes", ended)
        self._obs = np.concatenate([obs for obs, _ in parts])
        return self._obs.copy()

    def step_async(self, actions: np.ndarray) -> None:
        for k in range(self.num_servers):
            self.send(k, actions[self.slots(k).start:self.slots(k).stop])

    def step_wait(self) -> Step:
        parts = [self.receive(k) for k in range(self.num_servers)]
        step = Step(*(np.concatenate([getattr(p, name) for p in parts])
                      for name in ("obs", "reward", "terminated", "truncated")))
        for part in parts:
            step.final_obs.update(part.final_obs)
            step.episodes.extend(part.episodes)
        return step

    def step(self, actions: np.ndarray) -> Step:
        self.step_async(actions)
        return self.step_wait()

    def send(self, k: int, actions: np.ndarray) -> None:
        """Have server ``k`` step its envs with ``actions`` (theirs only); ``receive(k)`` collects it."""
        if self.replayable:
            for slot, action in zip(self.slots(k), actions, strict=True):
                self._actions[slot].append(action.copy())
        try:
            self._pending[k] = self.servers[k].step(actions)
        except ManagerError as exc:  # already gone: it could not even be sent the call
            self._pending[k] = exc

    def receive(self, k: int) -> Step:
        """Server ``k``'s step, as a Step of its envs (their indices in the whole batch)."""
        handle, self._pending[k] = self._pending[k], None
        try:
            if isinstance(handle, ManagerError):
                raise handle
            try:
                part = self._await(k, handle)
            except ServerUnheard as exc:
                if not self.replayable:
                    raise
                part = self._step_again(k, exc)
            if self.replayable:
                self._record(k, part)
        except (ManagerError, TimeoutError) as exc:
            part = self._replace(k, exc)
        if part.leaving:
            part = self._hand_over(k, part)
        base = self.slots(k).start
        self._obs[base:base + self.envs_per_server] = part.obs
        return Step(part.obs, part.reward, part.terminated, part.truncated,
                    {base + i: o for i, o in part.final_obs.items()},
                    [e._replace(env=base + e.env) for e in part.episodes])

    def _await(self, k: int, handle) -> ServerStep:
        """``handle``'s answer from server ``k``; TimeoutError after ``timeout``, ServerUnheard
        as soon as the server's job has gone unheard past ``silence_timeout`` (an answer that may
        never come)."""
        deadline = time.monotonic() + self.timeout
        while not handle.wait(max(0.0, min(UNHEARD_CHECK, deadline - time.monotonic()))):
            if self.managers[k].unheard():
                raise ServerUnheard("its job has not been heard for over silence_timeout: its host is cut off "
                                    "or stalled")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"it gave no answer within {self.timeout} s (algo.env_timeout)")
        return handle.get()

    def history(self) -> list[SlotHistory] | None:
        """Each slot's ``SlotHistory``; None for EnvPool, which cannot replay one (a resume starts its
        envs afresh)."""
        if not self.replayable:
            return None
        return [SlotHistory(self._episode[i], np.array(self._actions[i]), np.array(self._life_resets[i], np.int64),
                            self._starts[i]) for i in range(self.num_envs)]

    def _record(self, k: int, part: ServerStep) -> None:
        """Mirror the server's resets in the slots' histories."""
        ended = {e.env for e in part.episodes}
        for i in np.flatnonzero(part.terminated | part.truncated):
            slot = k * self.envs_per_server + int(i)
            if int(i) in ended:
                self._episode[slot] += 1
                self._actions[slot], self._life_resets[slot] = [], []
                self._starts[slot] = part.starts.get(int(i))
            else:
                self._life_resets[slot].append(len(self._actions[slot]))

    def _replace(self, k: int, cause: BaseException) -> ServerStep:
        """A fresh server for server ``k``, and what its step reports: every
        episode it held truncated, with the last observation we had as the final one."""
        self.restarts += 1
        slots = self.slots(k)
        log.warning("env server %d (envs %d-%d) was lost: %s; starting a replacement, its episodes are "
                    "cut short as truncated", k, slots[0], slots[-1],
                    getattr(cause, "reason", None) or str(cause).split("\n")[0])
        self.generations[k] += 1
        obs = self._new_server(k, lambda server: server.reset())
        for slot in slots:
            self._episode[slot], self._actions[slot], self._life_resets[slot], self._starts[slot] = 0, [], [], None
        n = self.envs_per_server
        last = self._obs[slots.start:slots.stop]
        final = {i: last[i].copy() for i in range(n)}
        return ServerStep(obs, np.zeros(n, np.float32), np.zeros(n, bool), np.ones(n, bool), final, [], {})

    def _step_again(self, k: int, cause: ServerUnheard) -> ServerStep:
        """Server ``k`` went unheard holding a step: it is given up, a new server rebuilds its envs
        as they were before that step (their histories without its actions) and takes the step again,
        so that it comes back as the lost server would have answered it.  An env not rebuilt as it
        was (not a function of its seed and actions) cannot be: then the crash path."""
        self.rebuilds += 1
        slots = self.slots(k)
        log.warning("env server %d (envs %d-%d) was lost: %s; a new server rebuilds its envs and takes the step "
                    "again", k, slots[0], slots[-1], cause)
        actions = np.stack([self._actions[slot].pop() for slot in slots])
        history = self.history()[slots.start:slots.stop]
        obs, ended = self._new_server(k, lambda server: server.replay(history), cut_off=True)
        if ended or not np.array_equal(obs, self._obs[slots.start:slots.stop]):
            for slot, action in zip(slots, actions, strict=True):  # as sent, for the crash path to drop
                self._actions[slot].append(action)
            raise ManagerError(f"env server {k}'s envs were not rebuilt as they were")
        self.send(k, actions)
        handle, self._pending[k] = self._pending[k], None
        if isinstance(handle, ManagerError):
            raise handle
        return self._await(k, handle)

    def _hand_over(self, k: int, part: ServerStep) -> ServerStep:
        """Server ``k`` answered ``part`` saying it was told to stop: a new server takes its envs
        over where they are, rebuilt from their histories.  An env the new server does not rebuild
        as it was (EnvPool's, which cannot be; one that is not a function of its seed and actions)
        ends its episode here as truncated, ``part``'s observation its final one."""
        self.handovers += 1
        slots = self.slots(k)
        log.info("env server %d (envs %d-%d) was told to stop: a new server takes its envs over", k, slots[0],
                 slots[-1])
        if self.replayable:
            history = self.history()[slots.start:slots.stop]
            obs, ended = self._new_server(k, lambda server: server.replay(history))
            for i in ended:
                slot = slots.start + i
                self._episode[slot] += 1
                self._actions[slot], self._life_resets[slot], self._starts[slot] = [], [], None
        else:
            self.generations[k] += 1
            obs = self._new_server(k, lambda server: server.reset())
        cut = [i for i in range(self.envs_per_server) if not np.array_equal(obs[i], part.obs[i])]
        if self.replayable and cut:
            log.warning("env server %d: envs %s were not rebuilt as they were: their episodes end here", k,
                        [slots.start + i for i in cut])
        truncated, final = part.truncated.copy(), dict(part.final_obs)
        for i in cut:
            if not (part.terminated[i] or part.truncated[i]):  # one that just ended has nothing more to cut
                truncated[i], final[i] = True, part.obs[i].copy()
        return part._replace(obs=obs, truncated=truncated, final_obs=final, leaving=False)

    def _new_server(self, k: int, first, cut_off: bool = False):
        """Server ``k`` restarted (``cut_off``: the old one given up for lost, not asked to stop), and
        what ``first(server)`` returns from it (a call's result)."""
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            try:
                self.managers[k].restart(cut_off=cut_off and attempt == 1)
                self.servers[k] = self.managers[k].EnvServer(self.spec, self.seed, self.seed_slots(k),
                                                           self.generations[k])
                return first(self.servers[k]).get(self.timeout)
            except (ManagerError, TimeoutError) as exc:
                if attempt == RESTART_ATTEMPTS:
                    raise EnvServerError(f"env server {k} could not be replaced in {attempt} attempts: {exc}") from exc
                log.warning("env server %d: replacement attempt %d failed: %s", k, attempt, exc)
                time.sleep(1.0)

    def pids(self) -> list[int | None]:
        return [m.pid for m in self.managers]

    def close(self) -> None:
        for manager in self.managers:
            try:
                manager.shutdown()
            except Exception as exc:  # noqa: BLE001 -- closing must reach every server
                log.warning("env server %s did not shut down cleanly: %s", manager, exc)
