"""Environment factories: a config names a gymnasium id, this makes it."""
from __future__ import annotations

import difflib

import gymnasium as gym


class UnknownEnvironment(ValueError):
    pass


def check_env_id(env_id: str) -> None:
    """Raise a one-line error naming close matches when ``env_id`` is not registered."""
    if env_id in gym.registry:
        return
    if ":" in env_id:  # "module:Id" registers itself on import
        try:
            gym.spec(env_id)
            return
        except Exception as exc:  # noqa: BLE001 -- any failure here is the user's id
            raise UnknownEnvironment(f"environment {env_id!r} could not be loaded: {exc}") from None
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.pprint_registry() for the ids"
    raise UnknownEnvironment(f"unknown environment id {env_id!r} (env.id){hint}")


def make_env(env_id: str, kwargs: dict | None = None, max_episode_steps: int | None = None,
             render_mode: str | None = None) -> gym.Env:
    check_env_id(env_id)
    options = dict(kwargs or {})
    if max_episode_steps is not None:
        options["max_episode_steps"] = int(max_episode_steps)
    if render_mode is not None:
        options["render_mode"] = render_mode
    return gym.make(env_id, **options)
