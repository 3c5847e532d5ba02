"""``python -m fiberrl``: config composition, sweeps, bad input reported in
one line, and the README's main command."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigAttributeError, ValidationError

from fiberrl.algorithm import ALGORITHMS
from fiberrl.app_config import CONFIG_DIR, algorithms_used, compose
from fiberrl.rl.envs import check_env_id

REPO = Path(__file__).resolve().parent.parent
TINY = ["algo.iterations=1", "algo.population=4", "algo.eval_episodes=1", "algo.noise_size=100000",
        "workers=1", "tensorboard=false"]


def fiberrl_cli(args, cwd, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "fiberrl", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("name", sorted(p.stem for p in (Path(CONFIG_DIR) / "env").glob("*.yaml") if p.stem != "gym"))
def test_every_env_config_names_a_registered_id(name):
    cfg = compose([f"env={name}"])
    assert cfg.env.name == name
    check_env_id(cfg.env.id)  # a "module:Id" registers on import, as gymnasium.make does


def test_overrides_are_typed_and_checked():
    cfg = compose(["algo=es", "env=bipedal_walker_hardcore", "workers=64", "seed=7", "algo.sigma=0.05",
                   "algo.hidden=[32,32]"])
    assert (cfg.algo.sigma, cfg.workers, cfg.seed, list(cfg.algo.hidden)) == (0.05, 64, 7, [32, 32])
    assert cfg.env.id == "BipedalWalkerHardcore-v3"
    assert compose(["env=gym", "env.id=Acrobot-v1"]).env.name == "Acrobot-v1"
    preset = compose(["+experiment=es_bipedal_walker", "algo.population=8"])
    assert (preset.env.id, preset.algo.population, preset.algo.episode_steps_growth, preset.algo.reward_clip) == (
        "BipedalWalker-v3", 8, 1.5, 1.0)
    with pytest.raises(ConfigCompositionException) as misspelt:
        compose(["algo.sigmaa=0.1"])
    assert isinstance(misspelt.value.__cause__, ConfigAttributeError)
    with pytest.raises(ConfigCompositionException) as badly_typed:
        compose(["algo.sigma=wide"])
    assert isinstance(badly_typed.value.__cause__, ValidationError)
    with pytest.raises(ConfigCompositionException, match="Could not find 'algo/nope'"):
        compose(["algo=nope"])


@pytest.mark.parametrize("args, message", [
    (["env=gym", "env.id=Nope-v0"], r"error: unknown environment id 'Nope-v0' \(env.id\)"),
    (["env.id=CartPol-v1"], r"error: unknown environment id 'CartPol-v1' \(env.id\); did you mean CartPole-v1"),
    (["workers=0"], r"error: workers=0: a run needs at least one worker"),
    (["workers=10000000"], r"error: workers=10000000 would need about \d+ GiB on the local backend"),
    (["backend=slurm", "+backend.settings.slurm_partion=debug"],
     r"error: backend.settings: configure\(\): unknown runtime setting 'slurm_partion'; known settings: .*"),
    (["backend.name=nope"], r"error: unknown backend 'nope'; available: local, docker, kubernetes, slurm \(or auto\)"),
])
@pytest.mark.slow
def test_bad_settings_fail_in_one_line(tmp_path, args, message):
    result = fiberrl_cli([*TINY, *args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert re.fullmatch(message + r".*\n", result.stderr), result.stderr


@pytest.mark.slow
def test_a_run_keeps_its_newest_checkpoints_or_with_keep_checkpoints_null_every_one(tmp_path):
    every = ["algo.iterations=5", "algo.checkpoint_every=1"]
    kept = fiberrl_cli([*TINY, *every, f"hydra.run.dir={tmp_path / 'kept'}"], tmp_path)
    assert kept.returncode == 0, kept.stderr
    assert sorted(p.name for p in (tmp_path / "kept" / "checkpoints").iterdir()) == [
        "000002.npz", "000003.npz", "000004.npz"]
    run_dir = tmp_path / "all"
    done = fiberrl_cli([*TINY, *every, "keep_checkpoints=null", f"hydra.run.dir={run_dir}"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(list((run_dir / "checkpoints").iterdir())) == 5
    # where a run keeps its files, not what it computes: a resume may set it anew
    resumed = fiberrl_cli([*TINY, "algo.iterations=7", "algo.checkpoint_every=1", "keep_checkpoints=1",
                           f"resume={run_dir}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["000006.npz"]
    bad = fiberrl_cli([*TINY, "keep_checkpoints=0", f"hydra.run.dir={tmp_path / 'bad'}"], tmp_path)
    assert bad.returncode == 2
    assert bad.stderr == "error: keep_checkpoints=0: must be an integer >= 1, or null for keep every checkpoint\n"


@pytest.mark.slow
def test_unknown_algo_and_misspelt_key_get_hydras_message(tmp_path):
    result = fiberrl_cli(["algo=nope"], tmp_path)
    assert result.returncode == 1 and "Could not find 'algo/nope'" in result.stderr
    assert "Available options in 'algo':\n\tes\n" in result.stderr
    result = fiberrl_cli(["algo.sigmaa=0.1"], tmp_path)
    assert result.returncode == 1 and "Key 'sigmaa' not in" in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_from_another_config(tmp_path):
    run_dir = tmp_path / "run"
    first = fiberrl_cli([*TINY, f"hydra.run.dir={run_dir}"], tmp_path)
    assert first.returncode == 0, first.stderr
    before = (run_dir / "metrics.jsonl").read_text()
    # (not algo.sigma: a setting the algorithm declares tunable may change, fiberrl.algorithm)
    other = fiberrl_cli([*TINY, "algo.iterations=2", "algo.weight_decay=0.5", f"resume={run_dir}"], tmp_path)
    assert other.returncode == 2
    assert re.fullmatch(r"error: the checkpoint \S+000000.npz was made with other settings "
                        r"\(algo.weight_decay=0.005 there, 0.5 here\); resume with the settings in "
                        r"\S+config.yaml or start a new run\n", other.stderr), other.stderr
    assert (run_dir / "metrics.jsonl").read_text() == before  # the run is untouched
    again = fiberrl_cli([*TINY, "algo.iterations=2", f"resume={run_dir}"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert fiberrl_cli([*TINY, "resume=/nonexistent/run"], tmp_path).stderr.startswith(
        "error: resume=/nonexistent/run: not a run directory")


@pytest.mark.parametrize("command_line, used", [
    ([], ["es"]),
    (["algo=ppo", "env=breakout", "algo.learning_rate=1e-4"], ["ppo"]),
    (["-m", "seed=0,1", "algo.sigma=0.02,0.05"], ["es"]),
    (["-m", "algo=es,ppo"], list(ALGORITHMS)),
    (["+experiment=ppo_cartpole"], list(ALGORITHMS)),
    (["algo=nope"], list(ALGORITHMS)),
    (["--cfg", "job", "algo=es"], list(ALGORITHMS)),
    (["~algo"], list(ALGORITHMS)),
    (["hydra.run.dir=/data/experiments/algo"], ["es"]),
])
def test_a_command_line_registers_only_the_algorithm_it_runs(command_line, used):
    assert algorithms_used(command_line) == used


@pytest.mark.slow
def test_an_es_run_does_not_import_torch(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "fiberrl", *TINY,
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "fiberrl.app" in imported and "torch" not in imported


@pytest.mark.slow
def test_sweep_runs_every_combination(tmp_path):
    result = fiberrl_cli(["-m", "seed=0,1", "algo.sigma=0.02,0.05", *TINY, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                         tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    runs = sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/metrics.jsonl"))
    assert len(runs) == 4, runs
    assert any("algo.sigma=0.05,seed=1" in name for name in runs), runs


def readme_main_command() -> list[str]:
    """The python part of the README's first set-up command."""
    readme = (REPO / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if ln.startswith("python3 -m venv .venv"))
    python_part = line.split("&&")[-1].strip()
    assert python_part.startswith(".venv/bin/python "), python_part
    return shlex.split(python_part)[1:]


@pytest.mark.slow
def test_readme_main_command_runs(tmp_path):
    args = readme_main_command()
    assert args[:2] == ["-m", "fiberrl"], args
    result = fiberrl_cli(args[2:], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    runs = list((tmp_path / "runs").glob("*/*/metrics.jsonl"))
    assert len(runs) == 1
    run_dir = runs[0].parent
    assert (run_dir / "config.yaml").exists() and list((run_dir / "checkpoints").glob("*.npz"))
    assert list((run_dir / "tensorboard").iterdir()) and (run_dir / "best_policy.npz").exists()
    assert "eval reward 500.0 reached" in result.stdout


def test_env_ids_from_a_module_are_imported_first(tmp_path, monkeypatch):
    from fiberrl.rl.envs import UnknownEnvironment, check_env_id

    (tmp_path / "my_envs.py").write_text("import gymnasium\n" "gymnasium.register('MyCartPole-v0', "
                                         "entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_env_id("my_envs:MyCartPole-v0")
    with pytest.raises(UnknownEnvironment, match="unknown environment id 'Other-v0'"):
        check_env_id("my_envs:Other-v0")
    with pytest.raises(UnknownEnvironment, match="module 'no_such_module' could not be imported"):
        check_env_id("no_such_module:X-v0")


def test_a_run_ends_with_its_folder_and_commands_that_work_on_what_it_holds(tmp_path):
    from fiberrl.app import where_it_went
    (tmp_path / "checkpoints").mkdir()
    lines = where_it_went(tmp_path, evaluates=True)
    assert lines[0] == f"run directory: {tmp_path} (metrics.jsonl, checkpoints/)"
    assert lines[1].endswith("--episodes 20 --checkpoint latest")  # no evaluation ran: no best policy
    (tmp_path / "best_policy.npz").write_bytes(b"")
    lines = where_it_went(tmp_path, evaluates=True)
    assert "best_policy.npz" in lines[0] and lines[1].endswith("--episodes 20")
    assert [line.split(":")[0] for line in where_it_went(tmp_path, evaluates=False)] == ["run directory", "plot it"]
