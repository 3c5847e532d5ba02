"""PPO with remote env servers: GAE and episode ends against known values,
the env servers' autoreset and replay, and whole runs on real env server
processes (learning CartPole, a server killed mid-run, resume, Breakout, the CLI)."""
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from fiberrl.algos.on_policy.rollouts import bootstrap_truncated
from fiberrl.algos.ppo import gae
from fiberrl.app import UsageError, run
from fiberrl.app_config import compose
from fiberrl.evaluate import evaluate
from fiberrl.rl.env_servers import EnvSpec
from fiberrl.rl.remote_envs import RemoteEnvs

# tests/, where helpers/ is, for the env servers too: they get our sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import ppo_toy_env  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
from helpers.ppo_runs import crash_after_update_4_and_resume as _crash_after_update_4_and_resume  # noqa: E402
from helpers.ppo_runs import metrics as _metrics  # noqa: E402
from helpers.ppo_runs import parameters as _parameters  # noqa: E402
from helpers.ppo_runs import train as _train  # noqa: E402


# --- advantages -------------------------------------------------------------------

def test_gae_returns_by_hand_termination_versus_truncation():
    gamma = 0.9
    rewards = torch.tensor([[1.0], [1.0], [1.0]])
    values = torch.zeros(3, 1)
    ends = torch.tensor([[0.0], [0.0], [1.0]])
    # terminated after 3 steps: nothing follows, whatever the value of the next observation
    _, returns = gae(rewards, values, ends, torch.tensor([123.0]), gamma, 1.0)
    np.testing.assert_allclose(returns[:, 0], [2.71, 1.9, 1.0], rtol=1e-6)
    # truncated after 3 steps, the last observation worth 10: the return goes on through it
    bootstrapped = torch.as_tensor(bootstrap_truncated(rewards[:, 0].numpy(), {2: 10.0}, gamma)[:, None])
    _, returns = gae(bootstrapped, values, ends, torch.tensor([123.0]), gamma, 1.0)
    np.testing.assert_allclose(returns[:, 0], [10.0, 10.0, 10.0], rtol=1e-6)
    # no end in the rollout: bootstrap from the value after its last step
    advantages, returns = gae(rewards, values, torch.zeros(3, 1), torch.tensor([10.0]), gamma, 0.5)
    np.testing.assert_allclose(returns[:, 0], advantages[:, 0])
    np.testing.assert_allclose(returns[2, 0], 1 + 0.9 * 10, rtol=1e-6)


@pytest.mark.slow
def test_env_servers_end_episodes_so_that_exact_values_give_zero_advantages():
    """With the true value function every advantage is zero, for any lambda, only if
    terminations cut the return and truncations bootstrap from the final observation."""
    gamma, steps = 0.9, 40
    envs = RemoteEnvs(EnvSpec("helpers.ppo_toy_env:Chain-v0"), servers=2, envs_per_server=2, seed=3)
    try:
        obs = envs.reset()
        states, rewards, ends, finals, episodes = [], [], [], [], []
        for _ in range(steps):
            states.append(obs)
            step = envs.step(np.zeros(envs.num_envs, np.int64))
            # autoreset: an ended episode's env already shows the first observation of the next one
            assert all(step.obs[i][0] == 0 for i in np.flatnonzero(step.terminated | step.truncated))
            assert set(step.final_obs) == set(np.flatnonzero(step.truncated & ~step.terminated))
            for final in step.final_obs.values():
                assert list(final) == [ppo_toy_env.TIME_LIMIT, 7]  # the last observation of the cut episode
            rewards.append(step.reward)
            ends.append(step.terminated | step.truncated)
            finals.append(step.final_obs)
            episodes += step.episodes
            obs = step.obs
    finally:
        envs.close()
    assert {(r, n) for _, r, n in episodes} == {(3.0, 3), (5.0, 5)}  # both kinds of ending happened
    values = ppo_toy_env.true_value(np.array(states, np.float64), gamma)
    last_value = torch.as_tensor(ppo_toy_env.true_value(obs.astype(np.float64), gamma))

    def advantages(bootstrap: bool):
        rows = [bootstrap_truncated(r.astype(np.float64), {i: ppo_toy_env.true_value(o.astype(np.float64), gamma)
                                                           for i, o in f.items()} if bootstrap else {}, gamma)
                for r, f in zip(rewards, finals, strict=True)]
        adv, _ = gae(torch.tensor(np.array(rows)), torch.as_tensor(values), torch.tensor(np.array(ends), dtype=float),
                     last_value, gamma, 0.95)
        return adv.numpy()

    np.testing.assert_allclose(advantages(bootstrap=True), 0.0, atol=1e-9)
    assert np.abs(advantages(bootstrap=False)).max() > 1.0  # a truncation taken for a termination is wrong


@pytest.mark.slow
def test_history_rebuilds_breakout_envs_exactly_through_lost_lives():
    spec = EnvSpec("ALE/Breakout-v5", atari=True)
    rng = np.random.default_rng(0)
    actions = [rng.integers(4, size=2) for _ in range(260)]
    envs = RemoteEnvs(spec, servers=1, envs_per_server=2, seed=1)
    try:
        assert envs.single_observation_space.shape == (4, 84, 84)
        obs = envs.reset()
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        for a in actions[:200]:
            envs.step(a)
        history, expected = envs.history(), envs.step(actions[200]).obs
        rest = [envs.step(a).obs for a in actions[201:]]
    finally:
        envs.close()
    # lives were lost and games ended: the replay must go through both
    assert sum(len(h.life_resets) for h in history) >= 1 and any(h.start is not None for h in history)
    rebuilt = RemoteEnvs(spec, servers=2, envs_per_server=1, seed=1, history=history)  # any split of the slots
    try:
        rebuilt.reset()
        assert np.array_equal(rebuilt.step(actions[200]).obs, expected)
        assert all(np.array_equal(rebuilt.step(a).obs, o) for a, o in zip(actions[201:], rest, strict=True))
    finally:
        rebuilt.close()


@pytest.mark.slow
def test_history_rebuilds_bipedal_walker_envs_exactly_after_earlier_episodes():
    """BipedalWalker's Box2D world keeps state that its reset does not clear: after two episodes in
    one env, a third drifts apart from the same episode in a fresh env from its first step.  Each
    episode in an env made for it is what makes its replay exact."""
    spec = EnvSpec("BipedalWalker-v3")
    standing = np.zeros((1, 4), np.float32)  # falls after ~120 steps: three episodes in 400 steps
    envs = RemoteEnvs(spec, servers=1, envs_per_server=1, seed=5)
    try:
        envs.reset()
        episodes = 0
        while episodes < 2:
            episodes += len(envs.step(standing).episodes)
        for _ in range(30):
            envs.step(standing)
        history = envs.history()
        rest = [envs.step(standing).obs for _ in range(60)]
    finally:
        envs.close()
    assert history[0].episode == 2 and len(history[0].actions) == 30
    rebuilt = RemoteEnvs(spec, servers=1, envs_per_server=1, seed=5, history=history)
    try:
        rebuilt.reset()
        assert all(np.array_equal(rebuilt.step(standing).obs, o) for o in rest)
    finally:
        rebuilt.close()


@pytest.mark.slow
def test_an_env_that_ends_before_its_recorded_episode_starts_a_new_one(caplog):
    """An env that is not a function of its seed and actions (its episodes' length changed since they
    were played) cannot be replayed: where it ends early it starts its next episode, and the record
    follows, instead of stepping on past its end."""
    spec = EnvSpec("helpers.ppo_toy_env:Drifting-v0")
    ppo_toy_env.drift_lengths(None)  # episodes of 10 steps, whatever an earlier run left
    envs = RemoteEnvs(spec, servers=1, envs_per_server=2, seed=0)
    try:
        envs.reset()
        for _ in range(4):
            envs.step(np.zeros(2, np.int64))
        history = envs.history()
    finally:
        envs.close()
    assert [len(h.actions) for h in history] == [4, 4]
    ppo_toy_env.drift_lengths(2)  # episodes now end after 2 steps: the replays cannot reach 4
    rebuilt = RemoteEnvs(spec, servers=1, envs_per_server=2, seed=0, history=history)
    try:
        with caplog.at_level(logging.WARNING, logger="fiberrl"):
            obs = rebuilt.reset()
        assert obs[:, 0].tolist() == [0, 0]  # new episodes, not steps past an end
        assert "envs [0, 1] ended before their recorded episodes did" in caplog.text
        assert [(h.episode, len(h.actions)) for h in rebuilt.history()] == [(1, 0), (1, 0)]
        step = rebuilt.step(np.zeros(2, np.int64))
        assert step.obs[:, 0].tolist() == [1, 1] and not step.terminated.any()
    finally:
        rebuilt.close()
        ppo_toy_env.drift_lengths(None)


# --- whole runs -------------------------------------------------------------------

@pytest.mark.slow
def test_cartpole_is_solved_with_two_env_servers(tmp_path):
    # seeds 0-3 reached an eval reward of 450 after 16k-43k steps: the budget leaves room
    summary = _train(tmp_path, "solve", ["env=cartpole", "workers=2", "algo.envs_per_worker=2", "algo.clip_coef=0.2",
                                         "algo.learning_rate=1e-3", "algo.total_timesteps=100000",
                                         "algo.eval_every=4", "algo.eval_episodes=5", "algo.stop_reward=450",
                                         "seed=0"])
    metrics = _metrics(tmp_path / "solve")
    print(f"eval reward {summary['eval_reward']} after {summary['timesteps']} steps")
    assert metrics[0]["charts/episodic_return"] < 50  # it learnt: the first policy falls at once
    assert summary["eval_reward"] >= 450 and summary["timesteps"] < 100000
    assert all(m["charts/SPS"] > 0 for m in metrics)
    assert (tmp_path / "solve" / "best_policy.npz").exists()
    returns = [r for r, _ in evaluate(tmp_path / "solve", episodes=5, seed=0)]
    assert np.mean(returns) >= 195


@pytest.mark.slow
def test_a_killed_env_server_is_replaced_and_training_finishes(tmp_path, caplog):
    killed = []

    def kill_a_server_mid_rollout(update, envs):
        if update == 1:
            pid = envs.pids()[1]
            threading.Timer(0.05, lambda: (os.kill(pid, signal.SIGKILL), killed.append(pid))).start()

    with caplog.at_level(logging.WARNING, logger="fiberrl"):
        summary = _train(tmp_path, "kill", ["env=cartpole", "workers=2", "algo.envs_per_worker=2",
                                            "algo.num_steps=256", "algo.total_timesteps=5120"],
                         on_iteration=kill_a_server_mid_rollout)
    assert killed and summary["iterations"] == 5
    assert summary["env_server_restarts"] == 1
    restarts = [m["charts/env_server_restarts"] for m in _metrics(tmp_path / "kill")]
    assert restarts[:2] == [0, 0] and restarts[-1] == 1 and restarts == sorted(restarts)
    lost = [r.getMessage() for r in caplog.records if "env server 1" in r.getMessage()]
    assert lost and "replacement" in lost[0]
    assert "is gone" in lost[0] and "restart()" not in lost[0]  # the cause, not advice the loop has taken


@pytest.mark.slow
def test_same_result_for_any_split_of_the_envs_over_servers(tmp_path):
    settings = ["env=cartpole", "algo.num_steps=32", "algo.total_timesteps=256", "seed=4"]
    one = _train(tmp_path, "one", ["workers=1", "algo.envs_per_worker=4", *settings])
    two = _train(tmp_path, "two", ["workers=2", "algo.envs_per_worker=2", *settings])
    assert np.array_equal(_parameters(one), _parameters(two))


@pytest.mark.slow
def test_resume_gives_the_result_of_an_uninterrupted_run(tmp_path):
    # Pendulum: Box actions, observation and reward normalisation, and every episode truncated (200 steps)
    # the gymnasium engine: EnvPool's envs cannot be rebuilt where they were (test_envpool_engine.py)
    settings = ["env=pendulum", "env.engine=gymnasium", "workers=2", "algo.envs_per_worker=1", "algo.num_steps=64",
                "algo.total_timesteps=768", "algo.checkpoint_every=2", "algo.norm_obs=true", "algo.norm_reward=true",
                "algo.ent_coef=0", "algo.num_minibatches=4", "seed=5"]
    whole = _train(tmp_path, "whole", settings)
    strip = _crash_after_update_4_and_resume(tmp_path, settings, whole)
    assert [m["iteration"] for m in strip] == list(range(6))


@pytest.mark.slow
def test_a_resumed_run_evaluates_as_the_uninterrupted_one(tmp_path):
    # BipedalWalker keeps its Box2D world across resets: an env that played episodes before plays a seed
    # otherwise than a fresh one, so each evaluation gets a fresh env (the resumed run's first is fresh)
    settings = ["env=bipedal_walker", "env.engine=gymnasium", "workers=1", "algo.envs_per_worker=2",
                "algo.num_steps=32", "algo.total_timesteps=384", "algo.checkpoint_every=2", "algo.eval_every=1",
                "algo.eval_episodes=2", "algo.num_minibatches=2", "seed=3"]
    whole = _train(tmp_path, "whole", settings)
    strip = _crash_after_update_4_and_resume(tmp_path, settings, whole)
    assert all(isinstance(m["eval_reward"], float) for m in strip)


@pytest.mark.slow
def test_async_rollouts_learn_from_the_previous_policys_rollout_and_resume_exactly(tmp_path):
    settings = ["env=cartpole", "env.engine=gymnasium", "workers=2", "algo.envs_per_worker=2", "algo.num_steps=32",
                "algo.total_timesteps=768", "algo.checkpoint_every=2", "seed=6"]
    overlapped = [*settings, "algo.async_rollouts=true"]
    whole = _train(tmp_path, "whole", overlapped)
    in_turn = _train(tmp_path, "in_turn", settings)
    losses = [[m[k] for k in sorted(m) if k.startswith("losses/")] for m in _metrics(tmp_path / "whole")]
    losses_in_turn = [[m[k] for k in sorted(m) if k.startswith("losses/")] for m in _metrics(tmp_path / "in_turn")]
    # the first update learns from the same rollout either way; the second, from one its previous policy took
    assert losses[0] == losses_in_turn[0] and losses[1] != losses_in_turn[1]
    assert not np.array_equal(_parameters(whole), _parameters(in_turn))

    # with async rollouts, the checkpoint after update 3 holds the rollout collected during it
    _crash_after_update_4_and_resume(tmp_path, overlapped, whole)


@pytest.mark.slow
def test_breakout_runs_a_few_updates_and_evaluates(tmp_path):
    seen = []
    summary = _train(tmp_path, "breakout", ["env=breakout", "workers=1", "algo.envs_per_worker=2",
                                            "algo.num_steps=16", "algo.num_minibatches=2", "algo.update_epochs=1",
                                            "algo.total_timesteps=64", "env.max_episode_steps=2000"],
                     on_iteration=lambda update, envs: seen.append((envs._obs.shape, envs._obs.dtype)))
    assert summary["iterations"] == 2 and summary["timesteps"] == 64
    assert seen == [((2, 4, 84, 84), np.uint8)] * 2
    metrics = _metrics(tmp_path / "breakout")
    assert np.isfinite(metrics[-1]["losses/value_loss"]) and metrics[-1]["charts/SPS"] > 0
    (length_cap,) = {n for _, n in evaluate(tmp_path / "breakout", episodes=1, which="latest")}
    assert 0 < length_cap <= 2000  # a whole game, in frames, within the frame limit


def fiberrl_cli(module, args, cwd, timeout=240):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_cli_runs_ppo_then_evaluates_and_plots_it(tmp_path):
    run_dir = tmp_path / "run"
    result = fiberrl_cli("fiberrl", ["algo=ppo", "env=cartpole", "workers=1", "algo.num_steps=32",
                                     "algo.total_timesteps=512", "algo.eval_every=2", "algo.eval_episodes=2",
                                     f"hydra.run.dir={run_dir}"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "iter     4/4  steps 512" in result.stdout
    # the run ends saying where it went and how to look at it
    assert f"run directory: {run_dir} (metrics.jsonl, checkpoints/, best_policy.npz)" in result.stdout
    assert f"evaluate it:   python -m fiberrl.evaluate {run_dir} --episodes 20" in result.stdout
    metrics = _metrics(run_dir)
    assert len(metrics) == 4 and metrics[-1]["timesteps"] == 512
    for key in ("charts/SPS", "charts/learning_rate", "losses/value_loss", "losses/policy_loss", "losses/entropy",
                "losses/approx_kl", "losses/clipfrac", "losses/explained_variance", "charts/env_server_restarts"):
        assert key in metrics[-1], key
    assert list((run_dir / "tensorboard").iterdir()) and list((run_dir / "checkpoints").glob("*.npz"))
    evaluated = fiberrl_cli("fiberrl.evaluate", [run_dir, "--episodes", "2"], tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "best policy (iteration" in evaluated.stdout and "mean return" in evaluated.stdout
    plotted = fiberrl_cli("fiberrl.plot", [run_dir, "-o", tmp_path / "curves.png"], tmp_path)
    assert plotted.returncode == 0, plotted.stderr
    assert (tmp_path / "curves.png").stat().st_size > 0


@pytest.mark.parametrize("args, message", [
    (["algo.envs_per_worker=0"], "algo.envs_per_worker=0: each env server needs at least one env"),
    (["env.atari=true"], "env.atari=true applies Atari preprocessing, and CartPole-v1 is not an Atari game"),
    (["algo.num_steps=10", "algo.num_minibatches=3"], "a batch of 80 steps (workers=2 x algo.envs_per_worker=4 x "
                                                      "algo.num_steps=10) does not split into algo.num_minibatches=3"),
    (["algo.total_timesteps=100"], "algo.total_timesteps=100 is less than one batch (1024 steps)"),
])
def test_bad_settings_are_refused_in_one_line(tmp_path, args, message):
    with pytest.raises(UsageError) as refused:
        _train(tmp_path, "bad", ["env=cartpole", *args])
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_atari_setting_is_refused_by_es(tmp_path):
    from fiberrl.app import fingerprint
    with pytest.raises(UsageError, match="env.atari=true: algo=es does not apply the Atari preprocessing"):
        run(compose(["algo=es", "env=breakout"]), tmp_path / "es")
    assert fingerprint(compose(["algo=ppo", "env=breakout"]))["env"]["atari"] is True
    assert "workers" in fingerprint(compose(["algo=ppo"])) and "workers" not in fingerprint(compose(["algo=es"]))


def test_presets_hold_cleanrls_and_the_zoos_settings():
    atari = compose(["algo=ppo", "env=breakout"])
    assert (atari.env.id, atari.env.atari, atari.workers * atari.algo.envs_per_worker, atari.algo.num_steps,
            atari.algo.learning_rate, atari.algo.clip_coef, atari.algo.ent_coef) == \
        ("ALE/Breakout-v5", True, 8, 128, 2.5e-4, 0.1, 0.01)
    walker = compose(["+experiment=ppo_bipedal_walker"])
    envs = walker.workers * walker.algo.envs_per_worker
    assert (walker.algo.name, walker.env.id, envs, walker.algo.num_steps, envs * walker.algo.num_steps //
            walker.algo.num_minibatches, walker.algo.update_epochs, walker.algo.gamma, walker.algo.clip_coef,
            walker.algo.ent_coef, walker.algo.norm_obs, walker.algo.norm_reward, walker.algo.learning_rate) == \
        ("ppo", "BipedalWalker-v3", 32, 2048, 64, 10, 0.999, 0.18, 0.0, True, True, 3e-4)
    assert (walker.algo.anneal_lr, walker.algo.log_std_init, walker.algo.std_never_rises,
            walker.algo.eval_deterministic) == (True, -0.5, True, True)
    assert compose(["+experiment=ppo_cartpole"]).algo.clip_coef == 0.2


def test_a_deterministic_evaluation_takes_the_policys_most_likely_action():
    import gymnasium as gym

    from fiberrl.algos.on_policy.checkpoint import policy_arrays
    from fiberrl.algos.on_policy.evaluation import Policy
    from fiberrl.algos.ppo import MLPAgent, load_policy
    torch.manual_seed(0)
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    agent = MLPAgent(3, box, [8])
    with torch.no_grad():
        agent.actor[-1].bias.copy_(torch.tensor([0.3, -2.0]))  # the second is clipped to the space
    obs = np.zeros(3, np.float32)
    sampled = Policy(agent, box, None, 10.0, False, torch.device("cpu"))
    assert not np.array_equal(sampled.act(obs, torch.Generator().manual_seed(1)),
                              sampled.act(obs, torch.Generator().manual_seed(2)))
    mean = Policy(agent, box, None, 10.0, False, torch.device("cpu"), deterministic=True)
    assert np.allclose(mean.act(obs, torch.Generator().manual_seed(1)), [0.3, -1.0], atol=1e-6)

    discrete = MLPAgent(3, gym.spaces.Discrete(4), [8])
    with torch.no_grad():
        discrete.actor[-1].bias.copy_(torch.tensor([0.0, 0.0, 1.0, 0.0]))
    best = Policy(discrete, gym.spaces.Discrete(4), None, 10.0, False, torch.device("cpu"), deterministic=True)
    assert {int(best.act(obs, torch.Generator().manual_seed(s))) for s in range(20)} == {2}

    config = {"env": {"id": "Pendulum-v1"}, "algo": {"hidden": [8], "eval_deterministic": True}}
    pendulum = MLPAgent(3, gym.spaces.Box(-2.0, 2.0, (1,), np.float32), [8])
    assert load_policy(config, policy_arrays(pendulum, None), {}).policy.deterministic
    assert not load_policy({**config, "algo": {"hidden": [8]}}, policy_arrays(pendulum, None), {}).policy.deterministic


@pytest.mark.slow
def test_log_std_init_sets_the_gaussians_starting_std(tmp_path):
    from fiberrl.app import fingerprint
    summary = _train(tmp_path, "pendulum", ["env=pendulum", "workers=1", "algo.envs_per_worker=2", "algo.num_steps=8",
                                            "algo.num_minibatches=1", "algo.update_epochs=1",
                                            "algo.total_timesteps=16", "algo.learning_rate=1e-6",
                                            "algo.log_std_init=-1.5"])
    assert np.allclose(summary["agent"].actor_logstd.detach().cpu().numpy(), -1.5, atol=1e-4)
    assert fingerprint(compose(["algo=ppo", "algo.log_std_init=-1"]))["algo"]["log_std_init"] == -1


def test_std_never_rises_caps_each_updates_std_at_the_one_it_started_from():
    import gymnasium as gym

    from fiberrl.algos.ppo import Config, MLPAgent, ppo_update

    def log_std_after_update(never_rises: bool, advantage: str) -> np.ndarray:
        torch.manual_seed(0)
        agent = MLPAgent(3, gym.spaces.Box(-1.0, 1.0, (2,), np.float32), [16], log_std_init=-0.5)
        obs = torch.randn(256, 3)
        with torch.no_grad():
            actions, logprobs, _, values = agent.get_action_and_value(obs)
            distance = (actions - agent.actor(obs)).abs().sum(1)  # from the mean action
        advantages = {"wide": distance, "narrow": -distance, "noise": torch.randn(256)}[advantage]
        batch = {"obs": obs, "actions": actions, "logprobs": logprobs, "advantages": advantages,
                 "returns": values.flatten(), "values": values.flatten()}
        algo = Config(std_never_rises=never_rises, num_minibatches=16, update_epochs=4)
        ppo_update(agent, torch.optim.Adam(agent.parameters(), lr=1e-2), batch, algo, np.random.default_rng(0))
        return agent.actor_logstd.detach().numpy()

    assert (log_std_after_update(False, "wide") > -0.45).all() and (log_std_after_update(False, "narrow") < -0.55).all()
    for advantage in ("wide", "narrow", "noise"):
        # the update runs as without the option and only its end is capped: a cap on each minibatch's step
        # would keep the noise's falls and drop its rises, and walk the std down
        free = log_std_after_update(False, advantage)
        assert np.array_equal(log_std_after_update(True, advantage), np.minimum(free, np.float32(-0.5))), advantage


@pytest.mark.slow
def test_a_cpu_learner_steps_its_envs_on_one_torch_thread_and_updates_on_all(tmp_path):
    from rich.console import Console

    from fiberrl.algos.on_policy.envs import remote_envs
    from fiberrl.algos.on_policy.rollouts import ROLLOUT_THREADS
    from fiberrl.algos.ppo import train
    from fiberrl.run import RunDirectory
    seen = []

    def recording_envs(cfg, spec, history=None, generations=None):
        envs = remote_envs(cfg, spec, history, generations)
        step = envs.step
        envs.step = lambda actions: (seen.append(torch.get_num_threads()), step(actions))[1]
        return envs

    cfg = compose(["algo=ppo", "env=cartpole", "workers=1", "algo.envs_per_worker=2", "algo.num_steps=4",
                   "algo.num_minibatches=2", "algo.total_timesteps=16", "algo.eval_every=0", "algo.device=cpu"])
    threads = torch.get_num_threads()
    summary = train(cfg, RunDirectory(tmp_path, {}, tensorboard=False, console=Console(quiet=True)),
                    on_iteration=lambda update, envs: seen.append(("update", torch.get_num_threads())),
                    make_envs=recording_envs)
    assert summary["iterations"] == 2
    assert seen == ([ROLLOUT_THREADS] * 4 + [("update", threads)]) * 2
    assert torch.get_num_threads() == threads
