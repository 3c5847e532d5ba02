"""env.engine=envpool: env servers whose envs are one EnvPool batch, checked
against the gymnasium path's contract (autoreset in the same step, the final
observation of a truncated episode, whole Atari games as episodes with their
unclipped score, a lost life as a terminated step of a game that goes on) and
against its numbers (random-policy episodes on the same env), then PPO on it:
a run, a killed server replaced, a resume, and the settings refused."""
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from fiberrl.app import UsageError, run
from fiberrl.app_config import compose
from fiberrl.rl.env_servers import EnvSpec
from fiberrl.rl.remote_envs import RemoteEnvs

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers.ppo_toy_env, for the env servers too

envpool = pytest.importorskip("envpool", reason="envpool is not installed (pip install 'fiberrl[envpool]')")

FAST = ["algo=ppo", "tensorboard=false", "algo.eval_every=0"]


def _random_steps(spec: EnvSpec, steps: int, servers: int = 2, envs_per_server: int = 4, seed: int = 1):
    """Every Step of ``steps`` random actions on ``spec``'s env servers, and their first observations."""
    envs = RemoteEnvs(spec, servers=servers, envs_per_server=envs_per_server, seed=seed)
    try:
        first = envs.reset()
        rng = np.random.default_rng(seed)
        n = envs.num_envs
        space = envs.single_action_space
        taken = []
        for _ in range(steps):
            actions = (rng.integers(0, space.n, n) if hasattr(space, "n")
                       else rng.uniform(space.low, space.high, (n, *space.shape)).astype(space.dtype))
            taken.append(envs.step(actions))
        return first, taken, (envs.single_observation_space, space)
    finally:
        envs.close()


def _episodes(steps):
    return [e for s in steps for e in s.episodes]


@pytest.mark.slow
def test_cartpole_on_envpool_keeps_the_contract_and_the_numbers_of_the_gymnasium_path():
    pool_first, pool, pool_spaces = _random_steps(EnvSpec("CartPole-v1", engine="envpool"), 1500)
    gym_first, gym, gym_spaces = _random_steps(EnvSpec("CartPole-v1"), 1500)
    assert pool_first.shape == gym_first.shape == (8, 4) and pool_first.dtype == gym_first.dtype
    assert pool_spaces[1] == gym_spaces[1]
    assert np.abs(pool_first).max() <= 0.05  # a reset draws the state from [-0.05, 0.05], as gymnasium's
    lengths = {name: [e.length for e in _episodes(steps)] for name, steps in (("envpool", pool), ("gym", gym))}
    print({name: (len(v), np.mean(v)) for name, v in lengths.items()})
    # ~550 random episodes each (mean ~22 steps, sd ~12): the means agree within a few standard errors
    assert abs(np.mean(lengths["envpool"]) - np.mean(lengths["gym"])) < 2.0
    for step in pool:
        ended = np.flatnonzero(step.terminated | step.truncated)
        assert sorted(e.env for e in step.episodes) == list(ended)  # every end is a whole episode
        assert all(e.reward == e.length for e in step.episodes)     # CartPole pays 1 a step
        # autoreset in the same step: the observation to act on is a new episode's first one
        assert np.abs(step.obs[ended]).max(initial=0) <= 0.05


@pytest.mark.slow
def test_a_truncated_envpool_episode_gives_its_last_observation_and_starts_a_new_one():
    _, steps, _ = _random_steps(EnvSpec("Pendulum-v1", max_episode_steps=20, engine="envpool"), 45,
                                envs_per_server=2)
    for k, step in enumerate(steps):
        if (k + 1) % 20 == 0:
            assert step.truncated.all() and not step.terminated.any()
            assert sorted(step.final_obs) == [0, 1, 2, 3]
            # the final observation is the episode's last, not the next one's first
            assert all(not np.array_equal(step.final_obs[i], step.obs[i]) for i in range(4))
            assert sorted(e.env for e in step.episodes) == [0, 1, 2, 3]
            assert all(e.length == 20 for e in step.episodes)
        else:
            assert not step.truncated.any() and not step.final_obs and not step.episodes


@pytest.mark.slow
def test_breakout_on_envpool_ends_a_life_as_a_step_and_a_game_as_an_episode():
    spec = EnvSpec("BreakoutNoFrameskip-v4", atari=True, engine="envpool")
    first, steps, (obs_space, action_space) = _random_steps(spec, 1200, envs_per_server=3)
    gym_first, gym_steps, gym_spaces = _random_steps(EnvSpec("BreakoutNoFrameskip-v4", atari=True), 1200,
                                                     envs_per_server=3)
    assert first.shape == gym_first.shape == (6, 4, 84, 84) and first.dtype == np.uint8
    assert obs_space == gym_spaces[0] and action_space == gym_spaces[1]
    for name, run_steps in (("envpool", steps), ("gymnasium", gym_steps)):
        rewards = np.concatenate([s.reward for s in run_steps])
        assert set(np.unique(rewards)) <= {0.0, 1.0}  # clipped (Breakout's bricks pay 1, 4 or 7)
        lives_lost = sum(int(s.terminated.sum()) for s in run_steps)
        games = _episodes(run_steps)
        print(name, len(games), "games", lives_lost, "terminated steps", np.mean([g.reward for g in games]),
              "mean score", np.mean([g.length for g in games]), "mean frames")
        # 5 lives a game: a lost life is a terminated step and no episode; the game goes on after it
        assert len(games) >= 5 and 4.5 <= lives_lost / len(games) <= 5.5
        assert all(g.length % 4 == 0 or name == "gymnasium" for g in games)
        # a game's return is its unclipped score: at least its clipped rewards (a brick pays 1, 4 or 7)
        clipped, checked = np.zeros(6), 0
        for step in run_steps:
            clipped += step.reward
            for game in step.episodes:
                assert game.reward >= clipped[game.env] and (game.reward > 0) == (clipped[game.env] > 0)
                clipped[game.env], checked = 0.0, checked + 1
        assert checked == len(games)
    pool_scores = [g.reward for g in _episodes(steps)]
    gym_scores = [g.reward for g in _episodes(gym_steps)]
    # a random policy scores ~1.3 a game on either engine
    assert 0.3 < np.mean(pool_scores) < 3.0 and 0.3 < np.mean(gym_scores) < 3.0


@pytest.mark.slow
def test_an_atari_time_limit_counts_emulator_frames_on_envpool_as_on_gymnasium():
    spec = EnvSpec("BreakoutNoFrameskip-v4", atari=True, max_episode_steps=400, engine="envpool")
    _, steps, _ = _random_steps(spec, 101, servers=1, envs_per_server=2)
    truncated_at = [k for k, s in enumerate(steps) if s.truncated.any()]
    assert truncated_at and truncated_at[0] <= 99  # 400 frames: 100 steps of 4 (a lost life may come first)
    step = steps[truncated_at[0]]
    for i in np.flatnonzero(step.truncated & ~step.terminated):
        assert i in step.final_obs and any(e.env == i for e in step.episodes)


class Interrupted(Exception):
    pass


@pytest.mark.slow
def test_ppo_trains_on_envpool_servers_replaces_a_killed_one_and_resumes(tmp_path, caplog):
    settings = [*FAST, "env=breakout_noframeskip", "env.engine=envpool", "workers=2", "algo.envs_per_worker=2",
                "algo.num_steps=32", "algo.total_timesteps=768", "algo.checkpoint_every=2", "seed=3"]
    killed = []

    def kill_a_server_then_crash(update, envs):
        if update == 1:
            pid = envs.pids()[0]
            threading.Timer(0.05, lambda: (os.kill(pid, signal.SIGKILL), killed.append(pid))).start()
        if update == 4:
            raise Interrupted

    with caplog.at_level(logging.WARNING, logger="fiberrl"), pytest.raises(Interrupted):
        run(compose(settings), tmp_path / "pool", on_iteration=kill_a_server_then_crash)
    assert killed and any("env server 0" in r.getMessage() for r in caplog.records)
    # it goes on from the checkpoint of update 3; its envs start afresh (EnvPool replays no history)
    resumed = run(compose([*settings, f"resume={tmp_path / 'pool'}"]), tmp_path / "pool")
    assert resumed["iterations"] == 6 and resumed["env_server_restarts"] == 1


def test_engine_settings_are_resolved_or_refused_in_one_line(tmp_path):
    from fiberrl.algos.on_policy.envs import env_spec
    assert env_spec(compose([*FAST, "env=cartpole"])).engine == "envpool"            # auto: EnvPool has it
    assert env_spec(compose([*FAST, "env=cartpole", "env.engine=gymnasium"])).engine == "gymnasium"
    toy = ["env=gym", "env.id=helpers.ppo_toy_env:Chain-v0"]
    assert env_spec(compose([*FAST, *toy])).engine == "gymnasium"                    # auto: EnvPool lacks it
    with pytest.raises(UsageError,
                       match=r"env.engine=envpool: EnvPool has no helpers\.ppo_toy_env:Chain-v0; env.engine=gym"):
        run(compose([*FAST, *toy, "env.engine=envpool"]), tmp_path / "toy")
    with pytest.raises(UsageError, match="env.engine=envpool: env.kwargs=.*does not take gymnasium's kwargs"):
        run(compose([*FAST, "env=cartpole", "env.engine=envpool", "+env.kwargs.sutton_barto_reward=true"]),
            tmp_path / "kwargs")
    with pytest.raises(UsageError, match="env.engine=envpool: algo=es steps its envs in its own workers"):
        run(compose(["algo=es", "env=cartpole", "env.engine=envpool", "tensorboard=false"]), tmp_path / "es")
    with pytest.raises(UsageError, match="env.engine=gym: must be one of auto, gymnasium, envpool"):
        run(compose([*FAST, "env=cartpole", "env.engine=gym"]), tmp_path / "typo")
