"""ES: the ask/tell core without workers, the shared noise table, and whole
runs on real pool workers (learning, determinism, worker loss, resume)."""
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import fiberrl.runtime as mp
from fiberrl.algos.es import ES, Config, RunningStat, centered_ranks
from fiberrl.app import run
from fiberrl.app_config import compose
from fiberrl.rl.noise import NoiseTable, table_path

SMALL = ["algo.noise_size=2000000", "tensorboard=false"]


def test_ask_tell_core_converges_on_a_quadratic():
    target = np.linspace(-1, 1, 20).astype(np.float32)
    noise = NoiseTable(seed=11, size=200_000)
    es = ES(np.zeros(20, np.float32), Config(population=40, sigma=0.1, learning_rate=0.05, weight_decay=0.0),
            noise, seed=0)

    def fitness(x):
        return -float(np.sum(np.square(x - target)))

    start = fitness(es.theta)
    try:
        for _ in range(300):
            asked = es.ask()
            eps = [es.perturbation(i) for i in asked.noise_index]
            es.tell(asked, [fitness(es.theta + e) for e in eps], [fitness(es.theta - e) for e in eps])
    finally:
        noise.unlink()
    assert fitness(es.theta) > 0.01 * start  # within 1% of where it started from the optimum
    assert np.abs(es.theta - target).max() < 0.1


def test_centered_ranks_are_deterministic_and_centred():
    ranks = centered_ranks(np.array([[3.0, 1.0], [1.0, 7.0]]))
    np.testing.assert_allclose(ranks, [[1 / 6, -0.5], [-1 / 6, 0.5]], rtol=1e-6)  # the tie goes to the earlier position


def test_running_stat_matches_numpy():
    data = np.random.default_rng(0).normal(3.0, 2.0, size=(1000, 4))
    stat = RunningStat((4,), eps=0.0)
    for chunk in np.split(data, 10):
        stat.increment(chunk.sum(0), np.square(chunk).sum(0), len(chunk))
    np.testing.assert_allclose(stat.mean, data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stat.std, data.std(0), rtol=1e-4)


def test_noise_blocks_are_the_same_however_many_threads_draw_them(monkeypatch):
    from fiberrl.rl import noise
    monkeypatch.setattr(noise, "_GENERATE_BLOCK", 1000)
    tables = []
    for cores in (1, 4):
        monkeypatch.setattr(noise.os, "cpu_count", lambda cores=cores: cores)
        tables.append(np.empty(10_500, np.float32))
        noise._fill(tables[-1], 5)
    assert np.array_equal(tables[0], tables[1])
    assert not np.array_equal(tables[0][:1000], tables[0][1000:2000])  # each block its own stream
    assert abs(tables[0].mean()) < 0.05 and abs(tables[0].std() - 1) < 0.05


def _open_table(seed, size, out):
    table = NoiseTable(seed, size)
    out.put((table.created, float(table.noise[:1000].sum()), table.path))


@pytest.mark.slow
def test_noise_table_is_made_once_per_host_and_shared():
    seed, size = 987, 3_000_000
    expected = np.empty(size, np.float32)
    for i, child in enumerate(np.random.SeedSequence(seed).spawn(-(-size // (1 << 24)))):  # blocks of 2**24
        block = expected[i << 24:(i + 1) << 24]
        np.random.Generator(np.random.PCG64(child)).standard_normal(out=block, dtype=np.float32)
    out = mp.Queue()
    procs = [mp.Process(target=_open_table, args=(seed, size, out)) for _ in range(3)]
    try:
        for p in procs:
            p.start()
        reports = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        assert sum(created for created, _, _ in reports) == 1  # the others waited and mapped it
        assert {s for _, s, _ in reports} == {float(expected[:1000].sum())}
        table = NoiseTable(seed, size)
        assert not table.created and table.path == reports[0][2]
        np.testing.assert_array_equal(table.noise, expected)
        assert table.path.startswith("/dev/shm/") or not os.path.isdir("/dev/shm")
    finally:
        NoiseTable(seed, size).unlink()


def test_runs_holding_one_table_share_it_and_the_last_to_let_go_removes_it():
    """Runs at once on a host (a sweep's) draw a table once and hold 1 GB of it, not 1 GB each; a run
    killed lets go with its process."""
    seed, size = 988, 100_003
    try:
        first = NoiseTable(seed, size, hold=True)
        second = NoiseTable(seed, size, hold=True)  # another run's (a lock of its own, as a process has)
        assert first.created and not second.created
        first.release()
        assert os.path.exists(second.path)  # the second still uses it
        NoiseTable(seed, size)  # a worker maps it from its recipe: not one of its users
        second.release()
        assert not glob.glob(table_path(seed, size) + "*")

        holder = subprocess.Popen([sys.executable, "-c", f"from fiberrl.rl.noise import NoiseTable; "
                                   f"NoiseTable({seed}, {size}, hold=True); print(flush=True); input()"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert holder.stdout.readline() == b"\n"
        mine = NoiseTable(seed, size, hold=True)
        assert not mine.created
        holder.kill()
        holder.wait(30)
        mine.release()
        assert not glob.glob(table_path(seed, size) + "*")
    finally:
        NoiseTable(seed, size).unlink()


def test_a_run_and_its_workers_use_the_one_shared_table_and_leave_none(tmp_path):
    """The workers' slices are the master's: they map the table the run holds (algo.noise_seed), not one of
    the run's seed, which nobody would remove."""
    size = 300_007
    _train(tmp_path, "shared", ["seed=3", "workers=1", "algo.iterations=1", f"algo.noise_size={size}"])
    assert not glob.glob(table_path(3, size) + "*") and not glob.glob(table_path(0, size) + "*")


def _train(tmp_path, name, overrides, on_iteration=None):
    cfg = compose(["env=cartpole", "algo.population=24", "algo.eval_episodes=2", *SMALL, *overrides])
    return run(cfg, tmp_path / name, on_iteration=on_iteration)


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_cartpole_reaches_500(tmp_path):
    summary = _train(tmp_path, "solve", ["workers=2", "algo.population=64", "algo.iterations=40",
                                         "algo.stop_reward=500", "algo.eval_episodes=3"])
    print(f"solved after {summary['iterations']} iterations, {summary['timesteps']} steps")
    assert _metrics(tmp_path / "solve")[0]["eval_reward"] < 50  # it learnt: the first policy falls at once
    assert summary["eval_reward"] == 500.0
    assert (tmp_path / "solve" / "best_policy.npz").exists()
    assert not glob.glob(table_path(0, 2_000_000) + "*")  # the run removed its noise table
    assert len(_metrics(tmp_path / "solve")) == summary["iterations"]


def _pool_workers():
    return [p for p in mp.active_children() if p.name.startswith("PoolWorker") and p.is_alive()]


@pytest.mark.slow
def test_same_seed_same_parameters_with_any_worker_count_and_killed_workers(tmp_path):
    settings = ["algo.iterations=6", "seed=3"]
    one = _train(tmp_path, "one", ["workers=1", *settings])
    three = _train(tmp_path, "three", ["workers=3", "algo.chunksize=1", *settings])
    assert np.array_equal(one["theta"], three["theta"])
    backed_up = []
    backups = _train(tmp_path, "backups", ["workers=3", "algo.chunksize=1", "algo.backup_tasks=true", *settings],
                     on_iteration=lambda _iteration, pool: backed_up.append(pool.statistics().tasks_backed_up))
    assert backed_up[-1] > 0  # tasks ran twice, their first results kept
    assert np.array_equal(one["theta"], backups["theta"])

    kills, resubmitted = [], []

    def kill_the_workers_mid_map(iteration, pool):
        resubmitted.append(pool.statistics().tasks_resubmitted)

        # the next map starts once this returns: as soon as its tasks are out, every worker
        # dies (an iteration takes ~20 ms, too short to land a kill among its tasks by a timer)
        def kill():
            deadline = time.monotonic() + 5
            while pool.statistics().tasks_in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.0005)
            for worker in _pool_workers():
                try:
                    os.kill(worker.pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                kills.append(iteration)
        if iteration % 2 == 0:
            threading.Thread(target=kill).start()

    killed = _train(tmp_path, "killed", ["workers=2", "algo.chunksize=2", *settings],
                    on_iteration=kill_the_workers_mid_map)
    print(f"{len(kills)} workers killed during the run, {resubmitted[-1]} tasks resubmitted")
    assert len(set(kills)) >= 2 and resubmitted[-1] > 0  # tasks were lost with their workers and run again
    assert np.array_equal(one["theta"], killed["theta"])
    rewards = [[m["reward_mean"], m["eval_reward"]] for m in _metrics(tmp_path / "one")]
    assert rewards == [[m["reward_mean"], m["eval_reward"]] for m in _metrics(tmp_path / "killed")]


@pytest.mark.slow
def test_box2d_episodes_do_not_depend_on_what_a_worker_ran_before(tmp_path):
    # a Box2D world keeps state across resets: each task gets a fresh env, or results follow the task order
    settings = ["env=bipedal_walker", "algo.iterations=2", "algo.population=6", "algo.episode_steps=60",
                "algo.eval_episodes=1", "seed=1"]
    one = _train(tmp_path, "one", ["workers=1", *settings])
    three = _train(tmp_path, "three", ["workers=3", "algo.chunksize=1", *settings])
    assert np.array_equal(one["theta"], three["theta"])
    backed_up = []
    backups = _train(tmp_path, "backups", ["workers=3", "algo.chunksize=1", "algo.backup_tasks=true", *settings],
                     on_iteration=lambda _iteration, pool: backed_up.append(pool.statistics().tasks_backed_up))
    assert backed_up[-1] > 0  # tasks ran twice, their first results kept
    assert np.array_equal(one["theta"], backups["theta"])


@pytest.mark.slow
def test_resume_gives_the_parameters_of_an_uninterrupted_run(tmp_path):
    settings = ["workers=2", "algo.checkpoint_every=2", "seed=5"]
    whole = _train(tmp_path, "whole", ["algo.iterations=6", *settings])
    _train(tmp_path, "parts", ["algo.iterations=3", *settings])
    # a crash after the checkpoint of iteration 2 would have logged iteration 3 too
    with open(tmp_path / "parts" / "metrics.jsonl", "a") as f:
        f.write(json.dumps(dict(iteration=3, timesteps=0)) + "\n")
    resumed = _train(tmp_path, "parts", ["algo.iterations=6", f"resume={tmp_path / 'parts'}", *settings])
    assert np.array_equal(whole["theta"], resumed["theta"])
    assert [m["iteration"] for m in _metrics(tmp_path / "parts")] == list(range(6))
    strip = ("time_s", "wall_time", "iteration_s", "master_s")
    assert ([{k: v for k, v in m.items() if k not in strip} for m in _metrics(tmp_path / "whole")]
            == [{k: v for k, v in m.items() if k not in strip} for m in _metrics(tmp_path / "parts")])


@pytest.mark.slow
def test_a_budget_of_env_steps_ends_the_run_at_the_update_that_reaches_it_with_a_checkpoint_of_it(tmp_path):
    settings = ["workers=2", "algo.checkpoint_every=100", "algo.iterations=100", "seed=3"]
    whole = _train(tmp_path, "whole", ["algo.total_timesteps=6000", *settings])
    steps = [m["timesteps"] for m in _metrics(tmp_path / "whole")]
    assert steps[-1] >= 6000 > steps[-2] and len(steps) < 100
    assert whole["iterations"] == len(steps)
    assert [p.name for p in (tmp_path / "whole" / "checkpoints").iterdir()] == [f"{len(steps) - 1:06d}.npz"]

    _train(tmp_path, "parts", ["algo.total_timesteps=3000", *settings])
    first = _metrics(tmp_path / "parts")
    assert first[-1]["timesteps"] >= 3000 > first[-2]["timesteps"]
    again = _train(tmp_path, "parts", ["algo.total_timesteps=3000", f"resume={tmp_path / 'parts'}", *settings])
    assert _metrics(tmp_path / "parts") == first and again["iterations"] == len(first)  # its budget was spent
    resumed = _train(tmp_path, "parts", ["algo.total_timesteps=6000", f"resume={tmp_path / 'parts'}", *settings])
    assert np.array_equal(whole["theta"], resumed["theta"])
    assert [m["timesteps"] for m in _metrics(tmp_path / "parts")] == steps


def test_clipup_steps_along_the_normalised_gradient_with_momentum_up_to_its_speed_limit():
    from fiberrl.algos.es import ClipUp
    clipup = ClipUp(3, step_size=0.1, momentum=0.5, max_speed=0.12)
    gradient = np.array([30.0, 0.0, -40.0], np.float32)  # length 50: only its direction counts
    np.testing.assert_allclose(clipup.step(gradient), [-0.06, 0.0, 0.08], rtol=1e-6)  # 0.1 down the gradient
    second = clipup.step(gradient)  # 0.5 * 0.1 + 0.1 = 0.15, over the limit
    np.testing.assert_allclose(second, [-0.072, 0.0, 0.096], rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(clipup.step(gradient)), 0.12, rtol=1e-6)
    coasting = clipup.step(np.zeros(3, np.float32))  # no gradient: momentum alone
    np.testing.assert_allclose(np.linalg.norm(coasting), 0.06, rtol=1e-6)


def test_sigma_decays_after_each_update_down_to_its_floor():
    noise = NoiseTable(seed=11, size=100_000)
    try:
        es = ES(np.zeros(5, np.float32), Config(population=4, sigma=0.1, sigma_decay=0.5, sigma_min=0.03), noise,
                seed=0)
        sigmas = []
        for _ in range(4):
            asked = es.ask()
            np.testing.assert_allclose(es.perturbation(asked.noise_index[0]),
                                       es.sigma * noise.get(int(asked.noise_index[0]), 5))
            sigmas.append(es.sigma)
            es.tell(asked, np.arange(4.0), np.zeros(4))
        assert sigmas == [0.1, 0.05, 0.03, 0.03]
        arrays, values = es.state()
        del values["sigma"]  # a checkpoint made before sigma could change starts from algo.sigma
        again = ES(np.zeros(5, np.float32), es.config, noise, seed=0)
        again.restore(arrays, values)
        assert again.sigma == 0.1
    finally:
        noise.unlink()


@pytest.mark.slow
def test_clipup_sigma_schedule_and_averaged_episodes_run_on_workers_and_resume_exactly(tmp_path):
    settings = ["workers=2", "algo.checkpoint_every=2", "seed=3", "algo.optimizer=clipup", "algo.learning_rate=0.05",
                "algo.sigma=0.1", "algo.sigma_decay=0.9", "algo.sigma_min=0.05", "algo.episodes_per_eval=2"]
    whole = _train(tmp_path, "whole", ["algo.iterations=4", *settings])
    _train(tmp_path, "parts", ["algo.iterations=2", *settings])
    resumed = _train(tmp_path, "parts", ["algo.iterations=4", f"resume={tmp_path / 'parts'}", *settings])
    assert np.array_equal(whole["theta"], resumed["theta"])
    metrics = _metrics(tmp_path / "whole")
    # two episodes a side: CartPole pays 1 a step, so a pair's steps are 4 x its mean return at least
    assert all(m["timesteps"] > 0 for m in metrics) and len(metrics) == 4
    one_episode = _train(tmp_path, "single", ["algo.iterations=1", *settings[:-1]])
    two_episodes = _train(tmp_path, "double", ["algo.iterations=1", *settings])
    assert two_episodes["timesteps"] > 1.5 * one_episode["timesteps"]


@pytest.mark.slow
def test_adaptive_episode_cap_grows_when_enough_episodes_reach_it_and_resumes_exactly(tmp_path):
    settings = ["workers=2", "algo.checkpoint_every=2", "seed=4", "algo.episode_steps=8",
                "algo.episode_steps_growth=2", "algo.episode_steps_grow_at=0.5"]
    whole = _train(tmp_path, "whole", ["algo.iterations=5", *settings])
    metrics = _metrics(tmp_path / "whole")
    caps = [m["episode_cap"] for m in metrics]
    assert caps[0] == 8 and caps[-1] > 8  # CartPole's first policies last ~10-40 steps: the cap of 8 must grow
    for before, after in zip(metrics, metrics[1:], strict=False):
        grown = min(2 * before["episode_cap"], 500) if before["at_cap_share"] >= 0.5 else before["episode_cap"]
        assert after["episode_cap"] == grown
    steps = np.diff([0] + [m["timesteps"] for m in metrics])
    assert all(n <= 2 * 24 * m["episode_cap"] for n, m in zip(steps, metrics, strict=True))  # no episode ran past

    _train(tmp_path, "parts", ["algo.iterations=3", *settings])
    resumed = _train(tmp_path, "parts", ["algo.iterations=5", f"resume={tmp_path / 'parts'}", *settings])
    assert np.array_equal(whole["theta"], resumed["theta"])
    assert [m["episode_cap"] for m in _metrics(tmp_path / "parts")] == caps


def test_an_adaptive_cap_needs_a_starting_cap_and_leaves_the_eval_episodes_to_the_env_limit(tmp_path):
    from fiberrl.algos.es import eval_episode_steps
    from fiberrl.validation import UsageError
    with pytest.raises(UsageError, match="algo.episode_steps_growth=2.0 grows the cap algo.episode_steps sets"):
        _train(tmp_path, "no_cap", ["algo.episode_steps_growth=2"])
    cfg = compose(["env=bipedal_walker", "algo.episode_steps=100", "algo.episode_steps_growth=1.5"])
    assert eval_episode_steps(cfg.algo, cfg.env) == cfg.env.max_episode_steps
    fixed = compose(["env=bipedal_walker", "algo.episode_steps=100"])
    assert eval_episode_steps(fixed.algo, fixed.env) == 100


@pytest.mark.slow
def test_a_run_with_an_adaptive_cap_is_evaluated_to_the_env_limit_and_one_with_a_fixed_cap_to_its_cap(tmp_path):
    """fiberrl.evaluate scores a policy under the cap its run scored it under: a starting cap of 10
    steps is not what a walker that learnt under a cap grown to 1,600 is judged by."""
    from fiberrl.evaluate import evaluate, load_policy
    _train(tmp_path, "adaptive", ["workers=1", "algo.iterations=1", "algo.episode_steps=10",
                                  "algo.episode_steps_growth=2"])
    _train(tmp_path, "fixed", ["workers=1", "algo.iterations=1", "algo.episode_steps=10"])
    assert load_policy(tmp_path / "adaptive")[0]["max_episode_steps"] == 500  # CartPole's own limit
    assert load_policy(tmp_path / "fixed")[0]["max_episode_steps"] == 10
    assert max(length for _, length in evaluate(tmp_path / "fixed", episodes=3, seed=0)) <= 10


@pytest.mark.slow
def test_torch_policy_runs(tmp_path):
    summary = _train(tmp_path, "torch", ["workers=1", "algo.policy=torch_mlp", "algo.iterations=2"])
    assert summary["iterations"] == 2 and summary["theta"].dtype == np.float32


@pytest.mark.slow
def test_continuous_actions_on_pendulum(tmp_path):
    cfg = compose(["env=pendulum", "workers=2", "algo.population=8", "algo.iterations=2", "algo.eval_episodes=1",
                   *SMALL])
    summary = run(cfg, tmp_path / "pendulum")
    assert summary["timesteps"] == 2 * 2 * 8 * 200  # two iterations of 8 mirrored pairs of 200 steps



@pytest.mark.slow
def test_reward_clip_bounds_each_step_of_the_perturbations_scores_and_leaves_eval_reward_as_the_env_gives_it(
        tmp_path):
    # Pendulum pays between -16.3 and 0 a step for 200 steps; a random policy's episode costs ~-1,200
    settings = ["env=pendulum", "workers=2", "algo.population=8", "algo.iterations=2", "algo.eval_episodes=2", *SMALL]
    clipped = run(compose([*settings, "algo.reward_clip=0.5"]), tmp_path / "clipped")
    free = run(compose(settings), tmp_path / "free")
    for m in _metrics(tmp_path / "clipped"):
        assert -100 <= m["reward_min"] <= m["reward_max"] <= 0  # 200 steps of at least -0.5
        assert m["eval_reward"] < -200
    assert min(m["reward_min"] for m in _metrics(tmp_path / "free")) < -200
    # the same first iteration's unperturbed policy, so the same eval episodes
    assert _metrics(tmp_path / "clipped")[0]["eval_reward"] == _metrics(tmp_path / "free")[0]["eval_reward"]
    assert not np.array_equal(clipped["theta"], free["theta"])

@pytest.mark.slow
def test_a_run_directory_is_not_silently_reused(tmp_path):
    _train(tmp_path, "once", ["workers=1", "algo.iterations=1"])
    with pytest.raises(ValueError, match="already holds a run; pass resume="):
        _train(tmp_path, "once", ["workers=1", "algo.iterations=1"])
