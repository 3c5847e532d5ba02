"""What ``python -m fiberrl`` does with a composed config: check it, set up
the runtime and the run directory, and hand over to the algorithm."""
from __future__ import annotations

import os
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from omegaconf import OmegaConf

from .algorithm import ALGORITHMS, algorithm
from .app_config import AppConfig, BackendConfig, EnvConfig
from .rl.envs import UnknownEnvironment, check_env_id
from .run import CheckpointMismatch, NoUsableCheckpoint, RunDirectory
from .sweepable import sweepable
from .validation import UsageError, check_fields

# what a local worker process costs, to refuse worker counts the machine cannot hold: forked
# from the fork server with its modules imported, 1024 ES BipedalWalker workers (population
# 2048) peaked at 15.7 GiB in all, 1 GiB of it the noise table
LOCAL_WORKER_BYTES = 16 << 20

def fingerprint(cfg) -> dict:
    """The settings that decide what a run computes: a resume must have the same."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    record = algorithm(plain["algo"]["name"])
    kept = {k: v for k, v in plain.items() if k not in record.app_resume_may_change}
    kept["algo"] = {k: v for k, v in plain["algo"].items() if k not in record.resume_may_change}
    return kept


def setting_defaults(cfg) -> dict:
    """Every env.* and algo.* setting's default: what a checkpoint made before a setting existed ran with."""
    record = algorithm(cfg.algo.name)
    ran_before = record.ran_before(cfg) if record.ran_before else {}
    return dict(env=asdict(EnvConfig()), algo={**asdict(record.config()), **ran_before})


def configure_backend(backend) -> None:
    import fiberrl.runtime as mp
    from fiberrl.runtime.backends import BACKENDS
    from fiberrl.runtime.config import ConfigError
    if backend.name != "auto" and backend.name not in BACKENDS:
        raise UsageError(f"unknown backend {backend.name!r}; available: {', '.join(BACKENDS)} (or auto)")
    given = backend.settings
    settings = {key: given[key] for key in given if not OmegaConf.is_missing(given, key)}
    if backend.name != "auto":
        settings["backend"] = backend.name
    try:
        mp.configure(**settings)
    except ConfigError as exc:
        raise UsageError(f"backend.settings: {exc}") from None


def configure_backend_of(cfg) -> None:
    """The runtime set up for the backend ``cfg`` names: a sweep's runs are started as its jobs."""
    configure_backend(cfg.backend)


def resolved_backend() -> str:
    from fiberrl.runtime.backends import resolve_name
    from fiberrl.runtime.config import get_config
    return resolve_name(get_config().backend)


def check_workers(cfg) -> None:
    if resolved_backend() == "local":
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        needed = cfg.workers * LOCAL_WORKER_BYTES
        if needed > available:
            raise UsageError(f"workers={cfg.workers} would need about {needed / 2**30:.0f} GiB on the local backend "
                             f"and this machine has {available / 2**30:.0f} GiB free; use fewer workers or a "
                             f"cluster backend (backend=...)")


def validate(cfg) -> None:
    """Every setting against the rule its config's field gives it (``fiberrl.validation``),
    then what the algorithm needs of them together: the first bad one is raised as a
    UsageError before anything is started or written."""
    check_fields(cfg, AppConfig)
    check_fields(cfg.env, EnvConfig, "env.")
    check_fields(cfg.backend, BackendConfig, "backend.")
    check_env_id(cfg.env.id)
    # the record of the module whose Config typed cfg.algo: algo.name is a setting too, and may be anything
    record = sys.modules[OmegaConf.get_type(cfg.algo).__module__].ALGORITHM
    if cfg.env.atari and not record.takes_atari:
        raise UsageError(f"env.atari=true: algo={cfg.algo.name} does not apply the Atari preprocessing "
                         f"(algo=ppo does)")
    if cfg.env.engine != "auto" and not record.has_env_servers:
        raise UsageError(f"env.engine={cfg.env.engine}: algo={cfg.algo.name} steps its envs in its own workers "
                         f"with gymnasium; env.engine picks what steps env servers' envs (algo=ppo's)")
    record.check_settings(cfg)


def run(cfg, run_dir: str | os.PathLike, on_iteration=None) -> dict:
    """Start or resume the run ``cfg`` describes in ``run_dir``; returns the algorithm's summary."""
    validate(cfg)
    configure_backend(cfg.backend)
    check_workers(cfg)
    path = Path(run_dir)
    if cfg.resume is None and any((path / "checkpoints").glob("*.npz")):
        raise UsageError(f"{path} already holds a run; pass resume={path} to continue it, or choose another "
                         f"hydra.run.dir")
    if cfg.resume is not None and not (Path(cfg.resume) / "checkpoints").is_dir():
        raise UsageError(f"resume={cfg.resume}: not a run directory (it has no checkpoints/)")
    record = algorithm(cfg.algo.name)
    directory = RunDirectory(path, fingerprint(cfg), OmegaConf.to_yaml(cfg, resolve=True),
                             keep_checkpoints=cfg.keep_checkpoints, tensorboard=cfg.tensorboard,
                             defaults=setting_defaults(cfg),
                             tunable={f"algo.{name}" for name in record.tunable})
    from fiberrl.runtime import set_forkserver_preload
    # local workers are forked with what they run already imported
    set_forkserver_preload(list(record.worker_modules))
    try:
        summary = record.train(cfg, directory, on_iteration=on_iteration)
    finally:
        directory.close()
    for line in where_it_went(path, evaluates=record.load_policy is not None):
        directory.note(line)
    return summary


def where_it_went(run_dir: Path, evaluates: bool) -> list[str]:
    """The lines that end a run: where its files are, and the commands that look at them."""
    best = (run_dir / "best_policy.npz").exists()
    files = ["metrics.jsonl", "checkpoints/"] + (["best_policy.npz"] if best else [])
    lines = [f"run directory: {run_dir} ({', '.join(files)})"]
    if evaluates:  # without an evaluation during the run, there is no best policy: the last checkpoint's
        lines.append(f"evaluate it:   python -m fiberrl.evaluate {shlex.quote(str(run_dir))} --episodes 20"
                     + ("" if best else " --checkpoint latest"))
    lines.append(f"plot it:       python -m fiberrl.plot {shlex.quote(str(run_dir))} -o curves.png")
    return lines


def sweep_next_steps(sweep_dir: Path) -> list[str]:
    """What a sweep's last lines say beside its folder: the command that plots its runs."""
    return [f"plot it: python -m fiberrl.plot {shlex.quote(str(sweep_dir))} -o curves.png"]


def run_or_exit(cfg, run_dir) -> dict:
    """``run``, with a bad setting reported as one line on stderr and exit status 2."""
    try:
        return run(cfg, run_dir)
    except (UsageError, UnknownEnvironment, CheckpointMismatch, NoUsableCheckpoint) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def run_modules(cfg) -> list[str]:
    """What a run of ``cfg`` imports as it starts: its algorithm's module, and what that names."""
    return [ALGORITHMS[cfg.algo.name], *algorithm(cfg.algo.name).run_modules]


# a sweep (hydra/launcher=fiberrl) checks every run's settings before any starts, starts each run as
# a job of the backend its config names (a local one forked with its algorithm imported), and a run
# whose job died goes on from its checkpoint
@sweepable(check=validate, configure=configure_backend_of, resume_key="resume", resume_needs="checkpoints/*.npz",
           next_steps=sweep_next_steps, preload=run_modules)
def task(cfg):
    """``python -m fiberrl``'s task: one run in Hydra's output folder. Returns the run's best eval
    reward, the objective a sweeper (Optuna, Nevergrad, PBT) reads."""
    from hydra.core.hydra_config import HydraConfig
    summary = run_or_exit(cfg, HydraConfig.get().runtime.output_dir)
    return summary.get("best_eval_reward")
