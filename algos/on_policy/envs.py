"""Where PPO's envs are and what steps them: the env servers' spec, the engine
``env.engine`` picks (EnvPool or gymnasium), and the spaces, probed from one
env made here so that a bad env setting fails before any server starts."""
from __future__ import annotations

import gymnasium as gym

from fiberrl.rl import envpool_engine
from fiberrl.rl.atari import NotAtari
from fiberrl.rl.env_servers import EnvSpec
from fiberrl.rl.remote_envs import RemoteEnvs
from fiberrl.validation import UsageError, shown


def env_spec(cfg) -> EnvSpec:
    env = cfg.env
    atari = bool(env.get("atari", False))
    return EnvSpec(env.id, dict(env.kwargs), env.max_episode_steps, atari,
                   env_engine(env.get("engine", "auto"), env.id, dict(env.kwargs), env.max_episode_steps, atari),
                   int(env.get("envpool_threads", 1)), bool(env.get("new_env_per_episode", True)))


def env_engine(requested: str, env_id: str, kwargs: dict, max_episode_steps: int | None, atari: bool) -> str:
    """What steps the env servers' envs: ``env.engine=auto`` is EnvPool when it is installed and can
    make this env as the gymnasium path does, gymnasium otherwise."""
    if requested == "gymnasium":
        return requested
    why = envpool_engine.unavailable()
    if why is None:
        try:
            envpool_engine.task(env_id, kwargs, max_episode_steps, atari)
            return "envpool"
        except envpool_engine.NoEnvPoolTask as exc:
            why = str(exc)
    if requested == "envpool":
        raise UsageError(f"env.engine=envpool: {why}; env.engine=gymnasium (or auto) steps {env_id} with gymnasium")
    return "gymnasium"


def probe_spaces(spec: EnvSpec, fits=None) -> tuple[gym.Space, gym.Space]:
    """The env's (observation, action) spaces, from one made here; ``fits(observation_space, action_space)``
    raises ValueError where the algorithm cannot take them."""
    try:
        env = spec.make()
    except NotAtari as exc:
        raise UsageError(str(exc)) from None
    except TypeError as exc:  # gymnasium's message names the env and the argument it does not take
        raise UsageError(f"env.kwargs={shown(spec.kwargs)}: {str(exc).splitlines()[0]}") from None
    try:
        if fits is not None:
            fits(env.observation_space, env.action_space)
    except ValueError as exc:
        raise UsageError(f"env {spec.id}: {exc}") from None
    finally:
        env.close()
    return env.observation_space, env.action_space


def remote_envs(cfg, spec: EnvSpec, history=None, generations=None, learner: int = 0, learners: int = 1) -> RemoteEnvs:
    """``cfg.workers`` env servers of ``algo.envs_per_worker`` envs each, rebuilt from ``history`` on a resume;
    with several learners, learner ``learner``'s share of them, its envs numbered on from the learners' before."""
    servers = cfg.workers // learners
    return RemoteEnvs(spec, servers, cfg.algo.envs_per_worker, cfg.seed, timeout=cfg.algo.env_timeout,
                      history=history, generations=generations,
                      first_slot=learner * servers * cfg.algo.envs_per_worker)
