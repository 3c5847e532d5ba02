"""What the app needs to know of an algorithm, declared by the algorithm.

Each module in ``algos/`` ends with one ``ALGORITHM = Algorithm(...)`` record,
and ``ALGORITHMS`` below names the module of each; ``algorithm(name)`` imports
it, when it is asked for, and returns its record (PPO's module imports torch,
which ES need not pay for).  The app reads nothing else of an algorithm module
and imports none by itself: the algorithms sit above the app's pieces they
use (this module, ``fiberrl.run``, ``fiberrl.validation``, ``fiberrl.rl``).
This module imports nothing of the app, so an algorithm's workers do not pay
for Hydra.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# algo=<name> -> the module whose ALGORITHM record it is
ALGORITHMS = {"es": "fiberrl.algos.es", "ppo": "fiberrl.algos.ppo", "poet": "fiberrl.algos.poet"}

# top-level settings that do not change what a run computes, unless an algorithm says otherwise
RESUME_MAY_CHANGE = frozenset({"workers", "backend", "resume", "tensorboard", "until_timesteps", "keep_checkpoints"})
# what every algorithm's metrics.jsonl rows hold (fiberrl.training.TrainingLoop.end)
LOOP_METRICS = frozenset({"iteration", "timesteps", "eval_reward", "time_s", "iteration_s", "wall_time"})


@dataclass(frozen=True)
class LoadedPolicy:
    """A trained policy, ready to run episodes: what an algorithm's ``load_policy`` gives ``fiberrl.evaluate``."""
    policy: Any
    # (env, seed, on_step) -> (return, length): one episode reset with ``seed``, ``on_step()`` after each step
    run_episode: Callable[..., tuple[float, int]]
    # for ``fiberrl.evaluate.load_policy``'s callers: the observation normaliser the policy runs with
    obs_mean: Any = None
    obs_std: Any = None
    obs_clip: float | None = None
    # the step cap its algorithm scores it under, where that is not the run's (ES's adaptive cap grows to
    # the env's limit); None: the run's algo.episode_steps, else the env's limit
    episode_steps: int | None = None


@dataclass(frozen=True)
class Algorithm:
    name: str                                   # algo=<name>
    config: type                                # the dataclass of algo.*: defaults, and the Hydra schema
    check_settings: Callable[[Any], None]       # (cfg) -> None, raising UsageError: the fields' rules, then what
                                                # the fields need together and of the env
    train: Callable[..., dict]                  # (cfg, run directory, on_iteration=None) -> summary
    # (run config dict, arrays, values of a checkpoint or best_policy.npz) -> LoadedPolicy;
    # raises ValueError when the file holds no policy of this algorithm.  None: it saves none.
    load_policy: Callable[[dict, dict, dict], LoadedPolicy] | None
    worker_modules: tuple[str, ...]             # what its workers run: local workers are forked with these loaded
    resume_may_change: frozenset[str]           # algo.* settings a resume may change (they change no result)
    app_resume_may_change: frozenset[str] = RESUME_MAY_CHANGE  # the same of the top-level settings
    # algo.* settings a resume may set anew, which change the run from there on (its hyperparameters): what
    # Population Based Training (hydra/sweeper=pbt) mutates between a member's intervals
    tunable: frozenset[str] = frozenset()
    # PBT's usual mutations of it: setting -> its space, in Hydra's sweep syntax ("tag(log, interval(1e-5, 1e-2))")
    mutations: dict[str, str] = field(default_factory=dict)
    metrics: frozenset[str] = frozenset()       # what it logs in metrics.jsonl beside the loop's LOOP_METRICS
    # (cfg) -> algo.* settings newer than some checkpoints, as those ran without them where that is not
    # the setting's default (ES: noise_seed, the run's own seed before); a resume compares them so
    ran_before: Callable[[Any], dict] | None = None
    takes_atari: bool = False                   # applies the Atari preprocessing env.atari=true asks for
    has_env_servers: bool = False               # steps its envs on env servers, whose engine env.engine picks
    # what a run imports as it starts beyond this module: a sweep's local run jobs are forked with them loaded
    run_modules: tuple[str, ...] = ()


def algorithm(name: str) -> Algorithm:
    """The ``Algorithm`` record of ``algo=<name>``."""
    return importlib.import_module(ALGORITHMS[name]).ALGORITHM
