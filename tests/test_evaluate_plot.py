"""fiberrl.evaluate and fiberrl.plot on run directories made by hand (no training)."""
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import yaml
from PIL import Image
from rich.console import Console

from fiberrl.evaluate import evaluate, load_policy
from fiberrl.evaluate import main as evaluate_main
from fiberrl.plot import group_runs, plot_runs
from fiberrl.plot import main as plot_main
from fiberrl.rl.policies import make_policy
from fiberrl.run import RunDirectory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cartpole_config(seed=0, sigma=0.02, workers=2):
    return dict(
        algo=dict(name="es", iterations=200, population=256, sigma=sigma, learning_rate=0.01, policy="mlp",
                  hidden=[8], obs_clip=5.0, episode_steps=None, eval_episodes=5),
        env=dict(name="cartpole", id="CartPole-v1", kwargs={}, max_episode_steps=None),
        backend=dict(name="local"), workers=workers, seed=seed, resume=None, tensorboard=False)


def make_run(path, seed=0, sigma=0.02, workers=2, iterations=5, best=True, checkpoint=True, eval_rewards=True):
    """A run directory as ``python -m fiberrl`` leaves it, with a random policy."""
    config = cartpole_config(seed, sigma, workers)
    run = RunDirectory(path, fingerprint={}, config_yaml=yaml.safe_dump(config), tensorboard=False,
                       console=Console(quiet=True))
    env = gym.make("CartPole-v1")
    policy = make_policy("mlp", env.observation_space, env.action_space, config["algo"]["hidden"])
    env.close()
    theta = policy.initial_params(np.random.default_rng(seed))
    shape = env.observation_space.shape
    for i in range(iterations):
        # seeds differ in how many steps an iteration took, as real runs do
        run.log(dict(iteration=i, timesteps=(i + 1) * (1000 + 37 * seed), reward_mean=10.0 + i + seed,
                     reward_max=20.0 + i, eval_reward=(12.0 + i + seed) if eval_rewards else None,
                     time_s=(i + 1) * (1.0 + 0.1 * seed)))
    if best:
        run.save_best(dict(theta=theta, obs_mean=np.zeros(shape, np.float32), obs_std=np.ones(shape, np.float32)),
                      dict(iteration=iterations - 1, eval_reward=16.0, policy="mlp", hidden=config["algo"]["hidden"],
                           obs_clip=5.0))
    if checkpoint:
        # sums that give mean 0 and std 1 after RunningStat's arithmetic
        run.save_checkpoint(iterations - 1,
                            dict(theta=theta, obs_sum=np.zeros(shape), obs_sumsq=np.full(shape, 100.0)),
                            dict(obs_count=100.0, iteration=iterations - 1))
    run.close()
    return path


def run_cli(module, *args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=60)


def assert_one_line_error(stderr: str, *words):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    for word in words:
        assert word in lines[0], stderr


# --- evaluate ---------------------------------------------------------------------

def test_evaluate_runs_the_asked_episodes_and_repeats_for_a_seed(tmp_path):
    run = make_run(tmp_path / "run")
    first = evaluate(run, episodes=3, seed=5)
    assert len(first) == 3
    assert all(steps >= 1 and ret == steps for ret, steps in first)  # CartPole pays 1 per step
    assert evaluate(run, episodes=3, seed=5) == first
    # the latest checkpoint holds the same parameters and a unit normaliser
    assert evaluate(run, episodes=3, seed=5, which="latest") == first


def test_load_policy_returns_the_saved_policy(tmp_path):
    run = make_run(tmp_path / "run")
    environment, policy, obs_mean, obs_std, obs_clip = load_policy(run, "latest")
    assert environment == dict(id="CartPole-v1", kwargs={}, max_episode_steps=500)  # the limit its evals ran to
    assert policy.num_params == 4 * 8 + 8 + 8 * 2 + 2
    np.testing.assert_allclose(obs_mean, 0.0)
    np.testing.assert_allclose(obs_std, 1.0)
    assert obs_clip == 5.0


def test_a_checkpoint_is_chosen_by_its_iteration(tmp_path):
    run = make_run(tmp_path / "run", iterations=3)  # its checkpoint of iteration 2 normalises with mean 0
    directory = RunDirectory(run, fingerprint={}, keep_checkpoints=None, tensorboard=False,
                             console=Console(quiet=True))
    for i in (0, 1):  # older checkpoints, each with its own observation mean: 5 and 6
        directory.save_checkpoint(i, dict(theta=np.zeros(58), obs_sum=np.full(4, 100.0 * (5 + i)),
                                          obs_sumsq=np.full(4, 100.0 * ((5 + i) ** 2 + 1))),
                                  dict(obs_count=100.0, iteration=i))
    directory.close()
    assert len(list((run / "checkpoints").iterdir())) == 3
    np.testing.assert_allclose(load_policy(run, "1")[2], 6.0)
    np.testing.assert_allclose(load_policy(run, 0)[2], 5.0)
    np.testing.assert_allclose(load_policy(run, "2")[2], 0.0)
    first = evaluate(run, episodes=2, seed=3, which="2")
    assert first == evaluate(run, episodes=2, seed=3, which="latest")


@pytest.mark.slow
def test_cli_prints_episodes_and_summary_and_writes_a_gif(tmp_path):
    run = make_run(tmp_path / "run")
    video = tmp_path / "first.gif"
    done = run_cli("fiberrl.evaluate", run, "--episodes", 2, "--seed", 1, "--video", video, "--max-frames", 4)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("episode ") for line in lines) == 2
    assert any(line.startswith("mean return ") and "±" in line and "mean length" in line for line in lines)
    assert video.stat().st_size > 0
    with Image.open(video) as gif:
        assert gif.format == "GIF"
        assert 2 <= gif.n_frames <= 4


@pytest.mark.parametrize("case, words", [
    ("not a run", ["no config.yaml"]),
    ("no best policy", ["best_policy.npz"]),
    ("no checkpoints", ["no checkpoints"]),
    ("not a gif", [".gif"]),
    ("missing", ["no such directory"]),
    ("no such iteration", ["no checkpoint of iteration 7", "iterations: 4", "keep_checkpoints=null"]),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case, words):
    args = {
        "not a run": lambda: [str(tmp_path)],
        "no best policy": lambda: [str(make_run(tmp_path / "run", best=False))],
        "no checkpoints": lambda: [str(make_run(tmp_path / "run", checkpoint=False)), "--checkpoint", "latest"],
        "not a gif": lambda: [str(make_run(tmp_path / "run")), "--video", str(tmp_path / "first.mp4")],
        "missing": lambda: [str(tmp_path / "nowhere")],
        "no such iteration": lambda: [str(make_run(tmp_path / "run")), "--checkpoint", "7"],
    }[case]()
    with pytest.raises(SystemExit) as exited:
        evaluate_main(args)
    assert exited.value.code == 2
    assert_one_line_error(capsys.readouterr().err, *words)


@pytest.mark.slow
def test_cli_bad_input_exits_2_without_traceback(tmp_path):
    done = run_cli("fiberrl.evaluate", tmp_path)
    assert done.returncode == 2
    assert_one_line_error(done.stderr, "config.yaml")


# --- plot ---------------------------------------------------------------------------

def test_plot_groups_seeds_and_writes_a_png(tmp_path):
    runs = [make_run(tmp_path / f"seed{s}", seed=s, workers=1 + s, best=False, checkpoint=False) for s in range(2)]
    other = make_run(tmp_path / "wide", sigma=0.1, best=False, checkpoint=False, eval_rewards=False)
    groups = group_runs([*runs, other])
    assert {label: sorted(r.path for r in members) for label, members in groups.items()} == {
        "es / cartpole, algo.sigma=0.02 (2 seeds)": runs,
        "es / cartpole, algo.sigma=0.1": [other],
    }
    out = plot_runs([*runs, other], tmp_path / "curves.png", "eval_reward")
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > 500


def test_plot_expands_a_multirun_folder(tmp_path, capsys):
    multirun = tmp_path / "multirun" / "2024-01-01_00-00-00"
    for s in range(3):
        make_run(multirun / f"{s}_seed={s}", seed=s, best=False, checkpoint=False)
    (multirun / "multirun.yaml").write_text("{}\n")
    assert list(group_runs([multirun])) == ["es / cartpole (3 seeds)"]
    out = tmp_path / "curves.png"
    plot_main([str(multirun), "-o", str(out), "--metric", "reward_max"])
    assert capsys.readouterr().out.strip() == str(out)
    with Image.open(out) as image:
        image.verify()


@pytest.mark.parametrize("make, words", [
    (lambda tmp: [str(tmp / "nowhere")], ["no such file"]),
    (lambda tmp: [str(tmp)], ["no metrics.jsonl"]),
])
def test_plot_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, words):
    with pytest.raises(SystemExit) as exited:
        plot_main([*make(tmp_path), "-o", str(tmp_path / "curves.png")])
    assert exited.value.code == 2
    assert_one_line_error(capsys.readouterr().err, *words)
