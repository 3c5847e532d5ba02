"""Environment factories: a config names a gymnasium id, this makes it."""
from __future__ import annotations

import difflib
import importlib

import gymnasium as gym

try:  # registers the ALE/... and ...NoFrameskip-v4 ids
    import ale_py  # noqa: F401
except ImportError:  # pragma: no cover -- ale-py is a dependency, but Atari is not needed for other envs
    pass


class UnknownEnvironment(ValueError):
    pass


def check_env_id(env_id: str) -> None:
    """Raise a one-line error naming close matches when ``env_id`` is not registered."""
    if env_id in gym.registry:
        return
    if ":" in env_id:  # "module:Id": importing the module registers the id, as gymnasium.make does
        module, env_id = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 -- any failure here is the user's module
            raise UnknownEnvironment(f"environment module {module!r} could not be imported: {exc!r}") from None
        if env_id in gym.registry:
            return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.pprint_registry() for the ids"
    raise UnknownEnvironment(f"unknown environment id {env_id!r} (env.id){hint}")


def make_env(env_id: str, kwargs: dict | None = None, max_episode_steps: int | None = None,
             render_mode: str | None = None, atari: bool = False) -> gym.Env:
    """``gymnasium.make(env_id, **kwargs)``; with ``atari`` the standard Atari
    preprocessing on top (``fiberrl.rl.atari``), with its episode statistics in ``info``."""
    check_env_id(env_id)
    if atari:
        from .atari import make_atari
        return make_atari(env_id, kwargs, max_episode_steps, render_mode)
    options = dict(kwargs or {})
    if max_episode_steps is not None:
        options["max_episode_steps"] = int(max_episode_steps)
    if render_mode is not None:
        options["render_mode"] = render_mode
    return gym.make(env_id, **options)
