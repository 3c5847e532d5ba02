"""Runtime configuration: defaults < file < FIBERRL_* environment < code."""
import pytest

from fiberrl.runtime import config


@pytest.fixture(autouse=True)
def fresh_config(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for name in ("FIBERRL_CONFIG_FILE", "FIBERRL_HEARTBEAT_TIMEOUT", "FIBERRL_LOG_LEVEL", "FIBERRL_START_TIMEOUT",
                 "FIBERRL_RESOLVED_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    config.reset()
    yield
    config.reset()


def test_precedence_defaults_file_env_code(monkeypatch, tmp_path):
    assert config.get_config().heartbeat_timeout == 30.0
    (tmp_path / "fiberrl.toml").write_text("heartbeat_timeout = 7\nlog_level = 'INFO'\nstart_timeout = 9\n")
    config.reset()
    cfg = config.get_config()
    assert (cfg.heartbeat_timeout, cfg.log_level, cfg.start_timeout) == (7.0, "INFO", 9.0)
    monkeypatch.setenv("FIBERRL_HEARTBEAT_TIMEOUT", "11.5")
    config.reset()
    cfg = config.get_config()
    assert (cfg.heartbeat_timeout, cfg.log_level) == (11.5, "INFO")
    cfg = config.configure(heartbeat_timeout=2)
    assert (cfg.heartbeat_timeout, cfg.start_timeout) == (2.0, 9.0)
    assert isinstance(cfg.heartbeat_timeout, float)


def test_config_file_named_by_env_and_runtime_table(monkeypatch, tmp_path):
    path = tmp_path / "elsewhere.toml"
    path.write_text("[runtime]\nstart_timeout = 12\n")
    monkeypatch.setenv("FIBERRL_CONFIG_FILE", str(path))
    assert config.get_config().start_timeout == 12.0


def test_unknown_keys_are_rejected_everywhere(monkeypatch, tmp_path):
    with pytest.raises(config.ConfigError, match="unknown runtime setting 'heartbeat_timout'.*known settings"):
        config.configure(heartbeat_timout=1)
    monkeypatch.setenv("FIBERRL_BAKEND", "local")
    with pytest.raises(config.ConfigError, match="FIBERRL_BAKEND.*unknown runtime setting 'bakend'"):
        config.get_config()
    monkeypatch.delenv("FIBERRL_BAKEND")
    (tmp_path / "fiberrl.toml").write_text("colour = 'blue'\n")
    config.reset()
    with pytest.raises(config.ConfigError, match="fiberrl.toml: unknown runtime setting 'colour'"):
        config.get_config()


def test_bad_values_say_what_was_wrong(monkeypatch, tmp_path):
    monkeypatch.setenv("FIBERRL_HEARTBEAT_TIMEOUT", "soon")
    with pytest.raises(config.ConfigError,
                       match="FIBERRL_HEARTBEAT_TIMEOUT: heartbeat_timeout='soon' is not a valid float"):
        config.get_config()
    monkeypatch.delenv("FIBERRL_HEARTBEAT_TIMEOUT")
    with pytest.raises(config.ConfigError, match="log_level=3 is not a valid str"):
        config.configure(log_level=3)
    (tmp_path / "fiberrl.toml").write_text("start_timeout = = 3\n")
    config.reset()
    with pytest.raises(config.ConfigError, match="not valid TOML"):
        config.get_config()
    monkeypatch.setenv("FIBERRL_CONFIG_FILE", str(tmp_path / "missing.toml"))
    with pytest.raises(config.ConfigError, match="does not exist"):
        config.get_config()


@pytest.mark.slow
def test_import_does_no_work():
    import subprocess
    import sys
    code = ("import threading, fiberrl.runtime as mp, fiberrl.runtime.config as c, fiberrl.runtime.processes.hub as h;"
            "assert c._config is None and h._hub is None;"
            "assert [t.name for t in threading.enumerate()] == ['MainThread']; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"FIBERRL_BAKEND": "typo-not-read-at-import", "PATH": "/usr/bin"},
                         cwd=__import__("conftest").ROOT)
    assert out.stdout.strip() == "ok", out.stderr


def child_reports_config(q):
    from fiberrl.runtime import get_config
    q.put(get_config().heartbeat_timeout)


@pytest.mark.slow
def test_children_inherit_the_resolved_config():
    import fiberrl.runtime as mp
    config.configure(heartbeat_timeout=4.5)
    q = mp.Queue()
    p = mp.Process(target=child_reports_config, args=(q,))
    p.start()
    assert q.get(timeout=30) == 4.5
    p.join(30)


def test_a_sweep_folder_is_not_named_by_where_its_run_runs():
    # a backend setting (a volume's path, an image) says where a run runs, not what it computes
    import dataclasses

    from omegaconf import OmegaConf

    from fiberrl.app_config import CONFIG_DIR
    from fiberrl.runtime.config import RuntimeConfig
    excluded = set(OmegaConf.load(f"{CONFIG_DIR}/config.yaml").hydra.job.config.override_dirname.exclude_keys)
    settings = {f"backend.settings.{f.name}" for f in dataclasses.fields(RuntimeConfig) if f.name != "backend"}
    assert settings - excluded == set()
