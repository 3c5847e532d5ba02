"""PPO with several learners on a Ring (``algo.learners=K``, DD-PPO): one gradient step of K
learners is one of a single learner on all of their data, a run of K learners resumes exactly,
goes on through a learner killed mid-run, cuts a straggler's rollout short when asked, and
refuses what it cannot run in one line.  Every learner is a real Ring member (gloo)."""
import functools
import os
import signal
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import wait_until

import fiberrl.runtime as mp
from fiberrl.algos.on_policy.peers import RingPeers
from fiberrl.algos.ppo import make_agent, ppo_update
from fiberrl.app import UsageError, validate
from fiberrl.app_config import compose
from helpers.ppo_runs import FAST, crash_after_update_4_and_resume, metrics, parameters, untimed
from helpers.ppo_runs import train as _train

# tests/, where helpers/ is, for the learners and their env servers too: they get our sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))



def _parameters(agent):
    return torch.nn.utils.parameters_to_vector(agent.parameters()).detach().cpu().numpy()


# --- one update of K learners is one update of one learner on all their data -----------------

def _settings(target_kl: float | None) -> SimpleNamespace:
    """The algo.* settings ppo_update reads."""
    return SimpleNamespace(update_epochs=3, num_minibatches=4, norm_adv=True, clip_coef=0.2, clip_vloss=True,
                           ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, target_kl=target_kl, std_never_rises=False)


SPACES = (gym.spaces.Box(-5.0, 5.0, (4,), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
ROWS = 64  # each learner's


def _agent():
    torch.manual_seed(0)
    return make_agent(*SPACES, [16, 16])


def _batch(rank: int) -> dict:
    """Learner ``rank``'s batch: observations, actions and their log-probabilities under the starting
    policy (slightly off, so that ratios and clipping are exercised), advantages, returns, values."""
    g = torch.Generator().manual_seed(100 + rank)
    obs, actions = torch.randn(ROWS, 4, generator=g), torch.randn(ROWS, 2, generator=g).clamp(-1, 1)
    with torch.no_grad():
        _, logprobs, _, values = _agent().get_action_and_value(obs, actions)
    return dict(obs=obs, actions=actions, logprobs=logprobs + 0.1 * torch.randn(ROWS, generator=g),
                advantages=torch.randn(ROWS, generator=g) * 3 + 1, returns=torch.randn(ROWS, generator=g),
                values=values)


def _minibatch_orders(rank: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([7, rank]))


class TogetherOrder:
    """The one learner's minibatch order that makes each of its minibatches the two learners' together:
    learner 0's minibatch i, then learner 1's (its rows after learner 0's in the batch)."""

    def __init__(self):
        self.orders = [_minibatch_orders(0), _minibatch_orders(1)]

    def permutation(self, size: int) -> np.ndarray:
        mine = [order.permutation(size // 2) for order in self.orders]
        parts = [np.array_split(o, _settings(None).num_minibatches) for o in mine]
        return np.concatenate([np.concatenate([a, b + size // 2]) for a, b in zip(*parts, strict=True)])


def _join(node):
    global _node
    _node = node
    node.init_process_group()


def _learner_updates(target_kl: float | None, through: str, rank: int, size: int) -> np.ndarray:
    """One update as learner ``rank``; its gradients summed through gloo, or shared memory (``HostSum``)."""
    from torch import distributed as dist

    from fiberrl.runtime.primitives.host_sum import HostSum
    agent = _agent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-3, eps=1e-5)
    peers = RingPeers(rank, size, _node.store if through == "host" else None, 1, None)
    ppo_update(agent, optimizer, _batch(rank), _settings(target_kl), _minibatch_orders(rank), peers)
    assert dist.get_world_size() == 2
    assert isinstance(peers._host_sum, HostSum) if through == "host" else peers._host_sum is None
    return _parameters(agent)


@pytest.mark.slow
@pytest.mark.parametrize("target_kl", [None, 0.002])
def test_two_learners_with_minibatch_b_step_as_one_with_minibatch_2b(target_kl):
    agent = _agent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-3, eps=1e-5)
    both = {k: torch.cat([_batch(0)[k], _batch(1)[k]]) for k in _batch(0)}
    losses = ppo_update(agent, optimizer, both, _settings(target_kl), TogetherOrder())
    one = _parameters(agent)
    two = mp.Ring(2, functools.partial(_learner_updates, target_kl, "host"), _join).run()
    np.testing.assert_array_equal(two[0], two[1])  # the learners stay one policy
    assert np.abs(one - _parameters(_agent())).max() > 1e-3  # the update moved it
    np.testing.assert_allclose(two[0], one, rtol=0, atol=1e-5)
    # two members' sum is a + b whoever adds: shared memory gives gloo's bits
    np.testing.assert_array_equal(mp.Ring(2, functools.partial(_learner_updates, target_kl, "gloo"), _join).run()[0],
                                  two[0])
    if target_kl is not None:
        assert losses["losses/approx_kl"] > target_kl  # the epochs were cut short, alike


def _straggler_updates(rows: int, target_kl: float | None, rank: int, size: int):
    """One update as learner ``rank``; learner 1's rollout cut short to ``rows`` rows."""
    agent = _agent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-3, eps=1e-5)
    batch = {k: v[:rows] if rank == 1 else v for k, v in _batch(rank).items()}
    losses = ppo_update(agent, optimizer, batch, _settings(target_kl), _minibatch_orders(rank),
                        RingPeers(rank, size, _node.store, 1, None))
    return _parameters(agent), losses


@pytest.mark.slow
@pytest.mark.parametrize("rows, target_kl", [(2, None), (0, 1e-9)])
def test_a_rollout_cut_shorter_than_its_minibatches_steps_with_the_others_and_reports_its_rows(rows, target_kl):
    # learner 1 holds fewer rows than the minibatches every learner steps through: some of its are empty
    (params, full), (params_1, short) = mp.Ring(2, functools.partial(_straggler_updates, rows, target_kl),
                                               _join).run()
    np.testing.assert_array_equal(params, params_1)  # still one policy
    assert np.isfinite(params).all() and np.abs(params - _parameters(_agent())).max() > 1e-3
    assert all(v is not None and np.isfinite(v) for v in full.values()), full
    losses = {k: v for k, v in short.items() if k != "losses/explained_variance"}
    if rows:
        assert all(v is not None and np.isfinite(v) for v in losses.values()), short
    else:  # no rows, nothing measured; and it joined the others' KL without holding them up
        assert set(losses.values()) == {None}, short


# --- whole runs ---------------------------------------------------------------------------------

# Pendulum: Box actions, observation and reward normalisation, and every episode truncated (200 steps)
RUN = ["env=pendulum", "env.engine=gymnasium", "workers=2", "algo.learners=2", "algo.envs_per_worker=1",
       "algo.num_steps=64", "algo.total_timesteps=768", "algo.checkpoint_every=2", "algo.norm_obs=true",
       "algo.norm_reward=true", "algo.ent_coef=0", "algo.num_minibatches=4", "seed=5"]


def signal_learner_1(at_update: int, signum: int, sent: list):
    """A run's callback that sends learner 1 ``signum`` once, as update ``at_update`` ends; its pid goes to ``sent``."""
    def send(update, ring):
        if update == at_update and not sent:
            sent.append(ring.pids()[1])
            os.kill(sent[0], signum)
    return send


@pytest.mark.slow
def test_two_learners_resume_exactly_and_go_on_through_a_learner_killed_mid_run(tmp_path, capsys):
    whole = _train(tmp_path, "whole", RUN)
    assert whole["iterations"] == 6 and whole["timesteps"] == 768
    rows = untimed(metrics(tmp_path / "whole"))
    assert [r["timesteps"] for r in rows] == [128 * (i + 1) for i in range(6)]
    # each env ends one 200-step episode in its 384 steps: both learners' count
    assert [r["charts/episodes"] for r in rows] == [0, 0, 0, 2, 0, 0]

    crash_after_update_4_and_resume(tmp_path, RUN, whole)

    # learner 1 killed after update 4: the Ring starts again from the checkpoint after update 3
    killed = []
    capsys.readouterr()
    survived = _train(tmp_path, "killed", RUN, on_iteration=signal_learner_1(4, signal.SIGKILL, killed))
    out = capsys.readouterr().out
    assert killed
    assert "Ring member rank 1 exited with code -9 (killed by SIGKILL)" in out
    assert "starting the Ring again from the run's last checkpoint (restart 1 of algo.ring_restarts=3)" in out
    np.testing.assert_array_equal(parameters(whole), parameters(survived))
    assert untimed(metrics(tmp_path / "killed")) == rows


@pytest.mark.slow
def test_a_learner_told_to_stop_costs_nothing_and_no_restart(tmp_path, capsys):
    """Learner 1 told to stop (SIGTERM) as update 3 begins: the run checkpoints after update 3 and
    starts the Ring again from there, with algo.ring_restarts=0, and ends as the run never told."""
    whole = _train(tmp_path, "whole", RUN)
    told = []
    capsys.readouterr()
    moved = _train(tmp_path, "told", [*RUN, "algo.ring_restarts=0"],
                   on_iteration=signal_learner_1(2, signal.SIGTERM, told))
    out = capsys.readouterr().out
    assert told
    assert "1 learner(s) were told to stop (SIGTERM) during update 4: checkpointed after it; starting the Ring " \
           "again from that checkpoint (not counted as a restart)" in out
    assert "resumed" in out and "after iteration 3" in out
    np.testing.assert_array_equal(parameters(whole), parameters(moved))
    assert untimed(metrics(tmp_path / "told")) == untimed(metrics(tmp_path / "whole"))


@pytest.mark.slow
def test_a_learners_env_server_killed_is_replaced_and_one_told_to_stop_hands_over_exactly(tmp_path):
    """Inside a Ring as with one learner: learner 1's env server SIGKILLed is replaced (counted in the
    run's env_server_restarts) and the run finishes; one told to stop (SIGTERM) moves its envs to a
    new server where they were, and the run ends as the one never disturbed."""
    from helpers.pid_env import servers_of

    def settings(name):
        (tmp_path / f"{name}-pids").mkdir()
        return ["env.id=helpers.pid_env:Recorded-v0", "env.engine=gymnasium",
                f"+env.kwargs.folder={tmp_path}/{name}-pids", "workers=2", "algo.learners=2",
                "algo.envs_per_worker=2", "algo.num_steps=64", "algo.total_timesteps=1280", "algo.num_minibatches=2",
                "seed=2"]

    def signal_learner_1s_server(name, sig, done):
        def act(update, ring):
            if update == 1 and not done:
                done.append(servers_of(f"{tmp_path}/{name}-pids", 1, ring.pids())[0])
                threading.Timer(0.05, os.kill, (done[0], sig)).start()
        return act

    quiet = _train(tmp_path, "quiet", settings("quiet"))
    killed, told = [], []
    lost = _train(tmp_path, "killed", settings("killed"),
                  on_iteration=signal_learner_1s_server("killed", signal.SIGKILL, killed))
    moved = _train(tmp_path, "told", settings("told"),
                   on_iteration=signal_learner_1s_server("told", signal.SIGTERM, told))
    assert killed and lost["iterations"] == 5 and lost["env_server_restarts"] == 1
    assert metrics(tmp_path / "killed")[-1]["charts/env_server_restarts"] == 1
    assert told and moved["env_server_restarts"] == 0
    np.testing.assert_array_equal(parameters(quiet), parameters(moved))
    assert untimed(metrics(tmp_path / "told")) == untimed(metrics(tmp_path / "quiet"))


@pytest.mark.slow
def test_a_learner_that_keeps_dying_ends_the_run_after_the_restarts_allowed(tmp_path, capsys):
    def kill_learner_0(update, ring):
        os.kill(ring.pids()[0], signal.SIGKILL)
    with pytest.raises(mp.RingError, match="rank 0 exited with code -9"):
        _train(tmp_path, "doomed", [*RUN, "algo.ring_restarts=1"], on_iteration=kill_learner_0)
    assert "(restart 1 of algo.ring_restarts=1)" in capsys.readouterr().out


def test_a_learner_that_raises_ends_the_run_with_its_error_and_no_restart(tmp_path, capsys):
    """An error that would happen again (learner 1's env raises at its 20th step) is not a lost learner: the run
    ends with it, naming the learner, and the Ring is not started again."""
    with pytest.raises(mp.RingError) as caught:
        _train(tmp_path, "raised", ["env.id=helpers.failing_env:Failing-v0", "env.engine=gymnasium", "workers=2",
                                    "algo.learners=2", "algo.envs_per_worker=1", "algo.num_steps=32",
                                    "algo.total_timesteps=640", "algo.num_minibatches=2"])
    assert "Ring member rank 1 failed" in str(caught.value), caught.value
    assert "the env failed on purpose" in str(caught.value.__cause__), caught.value.__cause__
    assert "starting the Ring again" not in capsys.readouterr().out


def test_what_the_ring_starts_again_after_is_a_lost_learner():
    """A death or silence (no cause), or a member's collective failing because another went, is a lost learner;
    an error of the member's own is not."""
    from fiberrl.algos.on_policy.ring_learners import _a_learner_lost
    from fiberrl.runtime.primitives.host_sum import HostSumError

    def failed(cause):
        error = mp.RingError("Ring member rank 0 failed", 0)
        error.__cause__ = cause
        return error
    assert _a_learner_lost(mp.RingError("Ring member rank 1 exited with code -9 (killed by SIGKILL)", 1))
    assert _a_learner_lost(failed(HostSumError("member 1 died before the sum", 1)))
    assert _a_learner_lost(failed(torch.distributed.DistBackendError("NCCL error: remote process exited")))
    assert _a_learner_lost(failed(RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                                               "Connection closed by peer [127.0.0.1]:40129")))
    assert not _a_learner_lost(failed(ValueError("the env failed on purpose")))
    assert not _a_learner_lost(failed(torch.OutOfMemoryError("CUDA out of memory")))


@pytest.mark.slow
def test_a_stragglers_rollout_is_cut_short_once_the_others_have_theirs(tmp_path):
    # learner 1's env servers take 20 ms a step; learner 0's, a fraction of one
    slowed = ["env.id=helpers.slow_member_env:Slowed-v0", "env.engine=gymnasium", "+env.kwargs.delay=0.02",
              "workers=2", "algo.learners=2", "algo.envs_per_worker=1", "algo.num_steps=64",
              "algo.num_minibatches=2", "algo.total_timesteps=512"]
    whole = _train(tmp_path, "whole", slowed)
    cut = _train(tmp_path, "cut", [*slowed, "algo.preempt_share=0.5"])
    assert whole["iterations"] == cut["iterations"] == 4
    assert [r["timesteps"] for r in untimed(metrics(tmp_path / "whole"))] == [128, 256, 384, 512]
    # learner 0 steps its 64, learner 1 a quarter of its own (DD-PPO's least) before it is told to stop
    steps = np.diff([0] + [r["timesteps"] for r in untimed(metrics(tmp_path / "cut"))])
    assert all(64 + 16 <= s < 128 for s in steps), steps


@pytest.mark.parametrize("args, message", [
    (["workers=3", "algo.learners=2"], "algo.learners=2 does not divide workers=3: each learner steps an equal "
                                       "share of the env servers; use a multiple of 2 as workers"),
    (["workers=2", "algo.learners=2", "algo.num_steps=10", "algo.envs_per_worker=1", "algo.num_minibatches=4"],
     "each learner's batch of 10 steps (workers/learners=1 x algo.envs_per_worker=1 x algo.num_steps=10) does "
     "not split into algo.num_minibatches=4 equal minibatches"),
    (["workers=2", "algo.learners=2", "algo.async_rollouts=true"], "algo.async_rollouts=true and algo.learners=2 "
                                                                   "do not go together"),
    (["algo.preempt_share=0.6"], "with algo.learners=1 there are none"),
    (["algo.preempt_share=1.5", "algo.learners=2"], "algo.preempt_share=1.5: must be a number in (0, 1]"),
    (["algo.preempt_share=0", "algo.learners=2"], "algo.preempt_share=0.0: must be a number in (0, 1] (a share of "
                                                  "the learners; at 0 every rollout would be cut short)"),
    ([f"workers={2 * (os.cpu_count() or 1) + 2}", f"algo.learners={(os.cpu_count() or 1) + 1}"],
     f"the local backend gives each learner a core and this machine has {os.cpu_count()}"),
])
def test_what_several_learners_cannot_run_is_refused_in_one_line(args, message):
    with pytest.raises(UsageError) as caught:
        validate(compose([*FAST, "env=cartpole", *args]))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_nccl_learners_need_a_gpu_each():
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        with pytest.raises(UsageError, match=f"needs a GPU per learner .nccl. and this machine has {count}"):
            validate(compose([*FAST, "env=cartpole", "algo.device=cuda", f"workers={2 * count + 2}",
                              f"algo.learners={count + 1}"]))
    else:
        with pytest.raises(UsageError, match="algo.device=cuda: no CUDA device is available here"):
            validate(compose([*FAST, "env=cartpole", "algo.device=cuda", "workers=2", "algo.learners=2"]))


@pytest.mark.slow
def test_resuming_with_another_number_of_learners_is_refused_in_one_line(tmp_path):
    settings = ["env=cartpole", "workers=2", "algo.envs_per_worker=1", "algo.num_steps=32", "algo.num_minibatches=2",
                "algo.total_timesteps=64"]
    _train(tmp_path, "two", [*settings, "algo.learners=2"])
    with pytest.raises(Exception) as caught:
        _train(tmp_path, "two", [*settings, "algo.learners=1", f"resume={tmp_path / 'two'}"])
    assert "algo.learners" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.slow
@pytest.mark.docker
def test_learners_and_their_env_servers_run_as_containers_standing_in_for_hosts(tmp_path):
    from helpers import docker_backend
    reason = docker_backend.available()
    if reason is not None:
        pytest.skip(f"docker backend cannot run here: {reason}")
    settings = docker_backend.settings()
    # a learner starts its env servers itself: its container needs the Docker API
    volumes = f"{settings['volumes']},/var/run/docker.sock:/var/run/docker.sock"
    try:
        summary = _train(tmp_path, "docker", ["env=cartpole", "workers=2", "algo.learners=2", "algo.envs_per_worker=2",
                                              "algo.num_steps=32", "algo.num_minibatches=2",
                                              "algo.total_timesteps=384", "backend=docker",
                                              f"+backend.settings.image={settings['image']}",
                                              f"+backend.settings.volumes='{volumes}'"])
    finally:
        mp.config.reset()  # the run configured the runtime for docker: the tests after it run locally
    assert summary["iterations"] == 3 and summary["timesteps"] == 384
    assert [r["charts/env_server_restarts"] for r in untimed(metrics(tmp_path / "docker"))] == [0, 0, 0]
    # every learner's and env server's container is gone (auto-removal takes a moment)
    assert wait_until(lambda: not docker_backend.leftovers(), 30, 0.2), docker_backend.leftovers()
