"""Every bad setting is refused before a run starts anything, in one line on
stderr that names its key, with exit status 2: the app's settings, each
algorithm's (ES, PPO, POET) and the runtime's.  The defaults and every shipped
preset still pass."""
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fiberrl import app
from fiberrl.algorithm import ALGORITHMS, algorithm
from fiberrl.app_config import CONFIG_DIR, AppConfig, BackendConfig, EnvConfig, compose
from fiberrl.runtime import config as runtime_config
from fiberrl.validation import Rule, setting

REPO = Path(__file__).resolve().parent.parent

# (command line, the key its error names)
REVIEWED = [  # what an outside review tried: each ended in a traceback, or ran without a word
    ("algo.population=0", "algo.population"),
    ("algo.population=-4", "algo.population"),
    ("algo.noise_size=10", "algo.noise_size"),
    ("algo.noise_size=0", "algo.noise_size"),
    ("algo.checkpoint_every=0", "algo.checkpoint_every"),
    ("algo.eval_episodes=-1", "algo.eval_episodes"),
    ("algo.policy=nope", "algo.policy"),
    ("algo.sigma=-1", "algo.sigma"),
    ("algo.sigma=0", "algo.sigma"),
    ("algo.iterations=-3", "algo.iterations"),
    ("algo.episode_steps=0", "algo.episode_steps"),
    ("algo.learning_rate=nan", "algo.learning_rate"),
    ("algo.hidden=[]", "algo.hidden"),
    ("algo.hidden=[0]", "algo.hidden"),
]
ES = [
    ("algo.name=ppo", "algo.name"),
    ("algo.learning_rate=inf", "algo.learning_rate"),
    ("algo.adam_beta1=1", "algo.adam_beta1"),
    ("algo.adam_beta2=-0.1", "algo.adam_beta2"),
    ("algo.weight_decay=-1", "algo.weight_decay"),
    ("algo.hidden=[64,-1]", "algo.hidden"),
    ("algo.obstat_prob=1.5", "algo.obstat_prob"),
    ("algo.obs_clip=0", "algo.obs_clip"),
    ("algo.stop_reward=nan", "algo.stop_reward"),
    ("algo.chunksize=0", "algo.chunksize"),
    ("algo.reward_clip=-1", "algo.reward_clip"),
    ("algo.total_timesteps=0", "algo.total_timesteps"),
    ("env=pendulum algo.noise_size=4000", "algo.noise_size"),  # fewer numbers than Pendulum's policy has parameters
    ("algo.noise_size=1000000000000000", "algo.noise_size"),   # a 4 PB table: no host has the room
    ("algo.eval_episodes=0 algo.stop_reward=100", "algo.stop_reward"),
]
APP = [  # workers=0 and env.atari with ES: test_app.py and test_ppo.py
    ("seed=-1", "seed"),
    ("seed=18446744073709551616", "seed"),
    ("env.name=''", "env.name"),
    ("env.max_episode_steps=0", "env.max_episode_steps"),
    ("+env.kwargs.gravity=3", "env.kwargs"),
]
PPO = [(f"algo=ppo {args}", key) for args, key in [
    ("algo.name=es", "algo.name"),
    ("algo.total_timesteps=0", "algo.total_timesteps"),
    ("algo.learning_rate=-1", "algo.learning_rate"),
    ("algo.num_steps=0", "algo.num_steps"),
    ("algo.envs_per_worker=0", "algo.envs_per_worker"),
    ("algo.gamma=1.5", "algo.gamma"),
    ("algo.gae_lambda=-0.5", "algo.gae_lambda"),
    ("algo.num_minibatches=0", "algo.num_minibatches"),
    ("algo.update_epochs=0", "algo.update_epochs"),
    ("algo.clip_coef=0", "algo.clip_coef"),
    ("algo.ent_coef=-0.01", "algo.ent_coef"),
    ("algo.vf_coef=0", "algo.vf_coef"),
    ("algo.max_grad_norm=inf", "algo.max_grad_norm"),
    ("algo.target_kl=0", "algo.target_kl"),
    ("algo.obs_clip=-1", "algo.obs_clip"),
    ("algo.reward_clip=0", "algo.reward_clip"),
    ("algo.hidden=[]", "algo.hidden"),
    ("algo.device=tpu", "algo.device"),
    ("algo.checkpoint_every=0", "algo.checkpoint_every"),
    ("algo.eval_every=-1", "algo.eval_every"),
    ("algo.eval_episodes=-1", "algo.eval_episodes"),
    ("algo.stop_reward=nan", "algo.stop_reward"),
    ("algo.env_timeout=0", "algo.env_timeout"),
    ("algo.num_steps=10 algo.num_minibatches=3", "algo.num_minibatches"),  # 80 steps in 3 minibatches
    ("algo.total_timesteps=100", "algo.total_timesteps"),                   # less than one batch
    ("algo.stop_reward=400 algo.eval_every=0", "algo.stop_reward"),         # never evaluated
    ("+env.kwargs.gravity=3", "env.kwargs"),
    ("env=cartpole env.atari=true", "env.atari"),
]]
POET = [(f"algo=poet {args}", key) for args, key in [
    ("algo.name=es", "algo.name"),
    ("algo.iterations=0", "algo.iterations"),
    ("algo.es.population=0", "algo.es.population"),
    ("algo.es.sigma=0", "algo.es.sigma"),
    ("algo.es.learning_rate=nan", "algo.es.learning_rate"),
    ("algo.es.adam_beta1=-1", "algo.es.adam_beta1"),
    ("algo.es.adam_beta2=1", "algo.es.adam_beta2"),
    ("algo.es.weight_decay=-1", "algo.es.weight_decay"),
    ("algo.es.obstat_prob=2", "algo.es.obstat_prob"),
    ("algo.es.obs_clip=0", "algo.es.obs_clip"),
    ("algo.es.policy=cnn", "algo.es.policy"),
    ("algo.es.hidden=[0]", "algo.es.hidden"),
    ("algo.es.noise_size=0", "algo.es.noise_size"),
    ("algo.es.noise_size=100", "algo.es.noise_size"),
    ("algo.episode_steps=0", "algo.episode_steps"),
    ("algo.eval_episodes=0", "algo.eval_episodes"),
    ("algo.reproduce_every=0", "algo.reproduce_every"),
    ("algo.reproduce_threshold=inf", "algo.reproduce_threshold"),
    ("algo.children=0", "algo.children"),
    ("algo.mc_low=nan", "algo.mc_low"),
    ("algo.mc_high=-inf", "algo.mc_high"),
    ("algo.mc_low=10 algo.mc_high=5", "algo.mc_low"),
    ("algo.max_admitted=0", "algo.max_admitted"),
    ("algo.max_active=0", "algo.max_active"),
    ("algo.novelty_k=0", "algo.novelty_k"),
    ("algo.transfer_every=0", "algo.transfer_every"),
    ("algo.solved_threshold=nan", "algo.solved_threshold"),
    ("algo.roughness_step=-1", "algo.roughness_step"),
    ("algo.roughness_max=0", "algo.roughness_max"),
    ("algo.pit_gap_step=-1", "algo.pit_gap_step"),
    ("algo.pit_gap_max=0", "algo.pit_gap_max"),
    ("algo.stump_height_step=nan", "algo.stump_height_step"),
    ("algo.stump_height_max=0", "algo.stump_height_max"),
    ("algo.stair_height_step=-1", "algo.stair_height_step"),
    ("algo.stair_height_max=0", "algo.stair_height_max"),
    ("algo.stair_steps_max=0", "algo.stair_steps_max"),
    ("algo.checkpoint_every=0", "algo.checkpoint_every"),
    ("algo.chunksize=0", "algo.chunksize"),
    ("env=cartpole", "env"),
]]
RUNTIME = [(f"+backend.settings.{key}={value}", key) for key, value in [
    ("backend", "nope"),
    ("heartbeat_interval", "-0.5"),
    ("heartbeat_timeout", "-1"),
    ("start_timeout", "nan"),
    ("schedule_timeout", "-1"),
    ("log_level", "verbose"),
]]
# small enough that a run the checks wrongly let through ends at once
TINY = ["algo.iterations=1", "algo.population=4", "algo.eval_episodes=1", "algo.noise_size=100000", "workers=1",
        "tensorboard=false"]


@pytest.fixture(autouse=True)
def fresh_runtime_config():
    runtime_config.reset()
    yield
    runtime_config.reset()


@pytest.fixture
def nothing_may_start(monkeypatch):
    """A run that gets as far as its run directory fails the test: every check comes before."""
    def started(*args, **kwargs):
        raise AssertionError("the run started (its run directory was made) with a bad setting")
    monkeypatch.setattr(app, "RunDirectory", started)


def assert_refused_in_one_line(code, stderr: str, key: str) -> None:
    assert code == 2, stderr
    assert stderr.startswith("error: ") and stderr.count("\n") == 1 and stderr.endswith("\n"), stderr
    assert key in stderr and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("command_line, key", REVIEWED + ES + APP + PPO + POET + RUNTIME)
def test_a_bad_setting_is_refused_in_one_line_before_anything_starts(command_line, key, tmp_path, capsys,
                                                                    nothing_may_start):
    cfg = compose(command_line.split())
    with pytest.raises(SystemExit) as refused:
        app.run_or_exit(cfg, tmp_path / "run")
    assert_refused_in_one_line(refused.value.code, capsys.readouterr().err, f"{key}=")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command_line, key", [
    ("algo.population=-4", "algo.population"),
    ("algo.sigma=0", "algo.sigma"),
    ("algo.hidden=[]", "algo.hidden"),
    ("algo.checkpoint_every=0", "algo.checkpoint_every"),
    ("+backend.settings.heartbeat_timeout=-1", "heartbeat_timeout"),
])
@pytest.mark.slow
def test_the_command_line_refuses_a_bad_setting_in_one_line(command_line, key, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-m", "fiberrl", *TINY, *command_line.split(),
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    assert_refused_in_one_line(result.returncode, result.stderr, f"{key}=")
    assert not (tmp_path / "run" / "config.yaml").exists() and not (tmp_path / "run" / "checkpoints").exists()


def test_runtime_settings_are_checked_wherever_they_come_from(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    runtime_config.configure(**dataclasses.asdict(runtime_config.RuntimeConfig()))  # the defaults pass
    runtime_config.reset()
    with pytest.raises(runtime_config.ConfigError, match=r"^configure\(\): heartbeat_timeout=-1.0: must be .*> 0$"):
        runtime_config.configure(heartbeat_timeout=-1)
    monkeypatch.setenv("FIBERRL_LOG_LEVEL", "verbose")
    with pytest.raises(runtime_config.ConfigError, match=r"^environment variable FIBERRL_LOG_LEVEL: "
                                                         r"log_level='verbose': must be a logging level"):
        runtime_config.get_config()
    monkeypatch.delenv("FIBERRL_LOG_LEVEL")
    (tmp_path / "fiberrl.toml").write_text("backend = 'slurmm'\n")
    runtime_config.reset()
    with pytest.raises(runtime_config.ConfigError, match=r"^fiberrl.toml: backend='slurmm': must be one of auto, "):
        runtime_config.get_config()


def test_every_field_of_every_config_has_a_rule():
    from fiberrl.algos.es import ESSettings
    schemas = [AppConfig, EnvConfig, BackendConfig, ESSettings]
    for name in ALGORITHMS:
        record = algorithm(name)
        assert record.name == name
        schemas.append(record.config)
    without = [f"{schema.__name__}.{f.name}" for schema in schemas for f in dataclasses.fields(schema)
               if not isinstance(f.metadata.get("rule"), Rule)]
    assert not without


def test_a_setting_states_its_rule():
    with pytest.raises(TypeError, match="a setting states its rule"):
        setting(1)


def shipped(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml"))


def preset_command_lines() -> list[list[str]]:
    lines = [[]] + [[f"algo={name}"] for name in shipped("algo")]
    for name in shipped("env"):
        atari = "atari: true" in (Path(CONFIG_DIR) / "env" / f"{name}.yaml").read_text()
        # env=gym names no id of its own; Atari's preprocessing is PPO's
        lines.append([f"env={name}", *(["env.id=Acrobot-v1"] if name == "gym" else []),
                      *(["algo=ppo"] if atari else [])])
    return lines + [[f"+experiment={name}"] for name in shipped("experiment")]


@pytest.mark.parametrize("command_line", preset_command_lines(), ids=lambda line: " ".join(line) or "defaults")
def test_the_defaults_and_every_shipped_preset_pass(command_line):
    app.validate(compose(command_line))



def test_backend_settings_are_typed_as_the_runtime_types_them_and_only_those_given_are_set(monkeypatch):
    from hydra.errors import ConfigCompositionException
    with pytest.raises(ConfigCompositionException):
        compose(["backend.settings.heartbeat_timeout=soon"])
    given = []
    monkeypatch.setattr("fiberrl.runtime.configure", lambda **settings: given.append(settings))
    app.configure_backend(compose(["backend=slurm", "+backend.settings.slurm_partition=debug",
                                   "backend.settings.heartbeat_timeout=5"]).backend)
    assert given == [{"slurm_partition": "debug", "heartbeat_timeout": 5.0, "backend": "slurm"}]
