"""The app's structured configs: the schemas Hydra checks every override
against, so a misspelt key or a badly typed value fails at start."""
from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields, make_dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from .algorithm import ALGORITHMS, algorithm
from .validation import ANY, Rule, at_least, non_empty, one_of, optional, setting

# the repository's configs/ in a checkout or an editable install; a wheel ships it as fiberrl/configs
_CHECKOUT_CONFIGS = Path(__file__).resolve().parent.parent / "configs"
CONFIG_DIR = str(_CHECKOUT_CONFIGS if (_CHECKOUT_CONFIGS / "config.yaml").is_file()
                 else Path(__file__).resolve().parent / "configs")


# each field's rule (fiberrl.validation) says what it may hold beyond its type, checked before a run starts
@dataclass
class EnvConfig:
    name: str = setting(MISSING, non_empty())  # the short name runs are filed under
    # a gymnasium id ("module:Id" imports the module first): fiberrl.rl.envs.check_env_id names close matches
    id: str = setting(MISSING, ANY)
    # passed to gymnasium.make; what the env takes: the algorithm makes it once to see
    kwargs: dict[str, Any] = setting(rule=ANY, factory=dict)
    # None: the id's registered limit (Atari: emulator frames)
    max_episode_steps: int | None = setting(None, optional(at_least(1), "the id's registered limit"))
    # the standard Atari preprocessing (fiberrl/rl/atari.py); PPO only (fiberrl.app.validate)
    atari: bool = setting(False, ANY)
    # what steps PPO's env servers' envs: gymnasium, envpool, or auto (envpool when installed and it has the env)
    engine: str = setting("auto", one_of("auto", "gymnasium", "envpool"))
    envpool_threads: int = setting(1, at_least(1))  # EnvPool's threads per env server
    # PPO's env servers play each episode in an env made for it, so that a resume replays it exactly (an
    # env can keep state its reset does not clear); false for an env too slow to make once an episode
    new_env_per_episode: bool = setting(True, ANY)


def runtime_settings_schema() -> type:
    """``backend.settings``'s schema: every runtime setting (``fiberrl.runtime.config.RuntimeConfig``) but
    ``backend`` (``backend.name`` here), each typed and unset (``???``) unless given, so that Hydra checks a
    value's type and ``configure()`` gets only what was set (``+backend.settings.<key>=`` still works)."""
    from fiberrl.runtime.config import RuntimeConfig
    hints = typing.get_type_hints(RuntimeConfig)
    return make_dataclass("RuntimeSettings", [(f.name, Optional[hints[f.name]], field(default=MISSING))
                                              for f in fields(RuntimeConfig) if f.name != "backend"])


RuntimeSettings = runtime_settings_schema()


@dataclass
class BackendConfig:
    # where workers run: local, docker, kubernetes, slurm (fiberrl.app.configure_backend lists them); auto: the
    # runtime's own choice (FIBERRL_BACKEND, fiberrl.toml, kubernetes in a pod)
    name: str = setting("auto", ANY)
    # runtime settings: image, slurm_partition...; the runtime's configure() checks each one
    settings: RuntimeSettings = setting(rule=ANY, factory=RuntimeSettings)


@dataclass
class AppConfig:
    algo: Any = setting(MISSING, ANY)  # checked against its own schema's rules
    env: EnvConfig = setting(MISSING, ANY)  # likewise
    backend: BackendConfig = setting(rule=ANY, factory=BackendConfig)  # likewise
    # pool workers (env servers for PPO)
    workers: int = setting(2, Rule(lambda workers: workers >= 1, "a run needs at least one worker"))
    # numpy's and torch's seeds are unsigned 64-bit integers
    seed: int = setting(0, Rule(lambda seed: 0 <= seed < 2**64, "must be an integer in [0, 2**64)"))
    # a run directory to continue: fiberrl.app.run looks for its checkpoints/
    resume: str | None = setting(None, ANY)
    # pause: checkpoint and end once the run has this many env steps (resume= goes on); None: run to the end
    until_timesteps: int | None = setting(None, optional(at_least(1), "run to the end"))
    tensorboard: bool = setting(True, ANY)  # also write TensorBoard events
    # the newest checkpoints a run keeps in checkpoints/ (older ones are removed as new ones are written);
    # null: every one, to evaluate the policy along the way (python -m fiberrl.evaluate --checkpoint N)
    keep_checkpoints: int | None = setting(3, optional(at_least(1), "keep every checkpoint"))


def default_run_dir(resume, algo: str, env: str) -> str:
    if resume:
        return str(resume)
    return str(Path("runs") / f"{algo}-{env}" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")[:-3])


def register_resolvers() -> None:
    """``${fiberrl_run_dir:...}``, which configs/config.yaml names hydra.run.dir with."""
    OmegaConf.register_new_resolver("fiberrl_run_dir", default_run_dir, replace=True, use_cache=True)


def register_configs(command_line: list[str] | None = None) -> None:
    """Put the schemas in Hydra's ConfigStore: every algorithm's, or, given
    the command line, only those it can use (see :func:`algorithms_used`)."""
    store = ConfigStore.instance()
    store.store(name="app_schema", node=AppConfig)
    # under schema/, so they are not offered as choices of the groups they type
    store.store(group="schema/env", name="env", node=EnvConfig)
    store.store(group="schema/backend", name="backend", node=BackendConfig)
    for name in (ALGORITHMS if command_line is None else algorithms_used(command_line)):
        store.store(group="schema/algo", name=name, node=algorithm(name).config)


def algorithms_used(command_line: list[str]) -> list[str]:
    """The algorithm a command line runs: the one ``algo=`` names, the default
    one when it names none; all of them when a file may choose (an experiment,
    another config) or it sweeps.  An algorithm's schema costs the import of
    its module, torch and all for PPO (about 1.5 s), which ES need not pay."""
    named = [arg.split("=", 1)[1] for arg in command_line if arg.startswith("algo=")]
    keys = [arg.lstrip("+~").split("=", 1)[0] for arg in command_line
            if arg not in ("-m", "--multirun") and not arg.startswith("algo=")]
    unsure = [key for key in keys if key.startswith(("-", "experiment", "algo")) and not key.startswith("algo.")]
    if unsure or len(named) > 1:
        return list(ALGORITHMS)
    if not named:
        defaults = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "config.yaml").defaults)
        named = [entry["algo"] for entry in defaults if isinstance(entry, dict) and "algo" in entry]
    return named if len(named) == 1 and named[0] in ALGORITHMS else list(ALGORITHMS)


def compose(overrides=()):
    """The app's config with ``overrides`` (as on the command line), for
    running an algorithm from Python: ``fiberrl.app.run(compose([...]), run_dir)``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_resolvers()
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return hydra_compose("config", overrides=list(overrides))
