"""``RemoteEnvs``: the learner's side of the env servers (``fiberrl.rl.env_servers``), their
envs stepped as one batch, like a vector env, and what becomes of a server that is lost.

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

import numpy as np

from ..runtime.managers import ManagerError
from .env_servers import EnvServerManager, EnvSpec, ServerStep, SlotHistory, Step, stop_when_told

log = logging.getLogger("fiberrl")

# attempts at starting a replacement server before the run gives up
RESTART_ATTEMPTS = 3
# how often a step that has not come back looks whether its server is still heard
UNHEARD_CHECK = 1.0


class EnvServerError(RuntimeError):
    """An env server could not be started or replaced."""


class ServerUnheard(TimeoutError):
    """An env server's job went unheard past ``silence_timeout`` while it held a step."""


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
                list(threads.map(lambda m: m.start(stop_when_told), self.managers))
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
