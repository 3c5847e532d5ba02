"""POET: the terrain env, mutation and the minimal criterion, novelty, transfer,
and short runs on real pool workers that grow the population and resume."""
import json
import subprocess

import numpy as np
import pytest
from conftest import PYTHON, ROOT

from fiberrl.algos.poet import (Config, best_transfer, encoding_scale, meets_minimal_criterion, mutate, novelty,
                                rank_by_novelty)
from fiberrl.app import UsageError, run
from fiberrl.app_config import compose
from fiberrl.rl.walker_terrain import TerrainEncoding, make_terrain_env

CFG = Config()
SCALE = encoding_scale(CFG)
# small enough for CI: every child passes the criterion and every pair may reproduce
TINY = ["algo=poet", "workers=2", "tensorboard=false", "algo.es.population=4", "algo.episode_steps=40",
        "algo.es.noise_size=1000000", "algo.reproduce_every=2", "algo.transfer_every=3", "algo.children=3",
        "algo.max_admitted=1", "algo.reproduce_threshold=-1000", "algo.mc_low=-1000", "algo.mc_high=1000",
        "algo.checkpoint_every=3"]


# --- the terrain env -------------------------------------------------------------
def test_default_encoding_is_flat_ground_without_obstacles():
    env = make_terrain_env()
    env.reset(seed=3)
    walker = env.unwrapped
    assert np.ptp(walker.terrain_y) == 0 and walker.obstacle_polygons() == []
    env.close()


@pytest.mark.parametrize("encoding", [
    TerrainEncoding(),
    TerrainEncoding(roughness=4.0),
    TerrainEncoding(pit_gap_low=1.0, pit_gap_high=4.0),
    TerrainEncoding(stump_height_low=0.5, stump_height_high=3.0),
    TerrainEncoding(stair_height=2.0, stair_width=5, stair_steps=6),
    TerrainEncoding(roughness=10, pit_gap_low=10, pit_gap_high=10, stump_height_low=5, stump_height_high=5,
                    stair_height=5, stair_steps=10),
])
def test_every_encoding_builds_runs_and_renders(encoding):
    env = make_terrain_env(encoding.to_dict(), max_episode_steps=30, render_mode="rgb_array")
    obs, _ = env.reset(seed=1)
    assert obs.shape == (24,)
    frame = env.render()
    assert frame.shape == (400, 600, 3) and frame.std() > 0
    for _ in range(30):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            break
    kinds = sum([encoding.has_pits, encoding.has_stumps, encoding.has_stairs])
    assert (len(env.unwrapped.obstacle_polygons()) > 0) == (kinds > 0)
    env.close()


def test_stumps_drawn_at_height_zero_are_flat_ground():
    # stump heights drawn from (0, tiny): Box2D would refuse the polygons (found in a long run)
    env = make_terrain_env(TerrainEncoding(stump_height_low=0.0, stump_height_high=1e-6).to_dict(),
                           max_episode_steps=10)
    for seed in range(5):
        env.reset(seed=seed)
        assert env.unwrapped.obstacle_polygons() == []
    env.close()


def test_same_seed_same_terrain():
    encoding = TerrainEncoding(roughness=3, pit_gap_low=1, pit_gap_high=3)
    outlines = []
    for _ in range(2):
        env = make_terrain_env(encoding)
        env.reset(seed=7)
        outlines.append(list(env.unwrapped.terrain_y))
        env.close()
    assert outlines[0] == outlines[1]


def test_bad_encodings_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="pit_gap_low=3.0 is above pit_gap_high=1.0"):
        TerrainEncoding(pit_gap_low=3.0, pit_gap_high=1.0)
    with pytest.raises(ValueError, match="roughness=-1 must not be negative"):
        TerrainEncoding(roughness=-1)
    with pytest.raises(ValueError, match="unknown field"):
        TerrainEncoding.from_dict({"ruggedness": 1})


def test_a_terrain_has_one_encoding():
    assert TerrainEncoding(stair_steps=3) == TerrainEncoding(stair_height=1.5, stair_width=6) == TerrainEncoding()
    assert TerrainEncoding(stair_steps=3, stair_height=1.5).has_stairs


# --- mutation, minimal criterion, novelty, transfer -----------------------------------
def test_mutation_changes_something_stays_in_bounds_and_is_seeded():
    rng = np.random.default_rng(0)
    parent = TerrainEncoding()
    for _ in range(200):
        child = mutate(parent, rng, CFG)
        assert child != parent
        assert 0 <= child.roughness <= CFG.roughness_max
        assert 0 <= child.pit_gap_low <= child.pit_gap_high <= CFG.pit_gap_max
        assert 0 <= child.stump_height_low <= child.stump_height_high <= CFG.stump_height_max
        assert 0 <= child.stair_steps <= CFG.stair_steps_max
        parent = child
    assert parent.vector().sum() > 1.0, "200 generations of mutation went nowhere"
    a = [mutate(TerrainEncoding(roughness=2), np.random.default_rng(5), CFG) for _ in range(2)]
    assert a[0] == a[1]


def test_minimal_criterion_bounds_are_inclusive():
    assert meets_minimal_criterion(50.0, CFG) and meets_minimal_criterion(300.0, CFG)
    assert not meets_minimal_criterion(49.9, CFG) and not meets_minimal_criterion(300.1, CFG)


def test_novelty_ranks_the_farthest_terrain_first():
    archive = [TerrainEncoding(), TerrainEncoding(roughness=2.0)]
    candidates = [TerrainEncoding(roughness=2.1),                          # next to an archived one
                  TerrainEncoding(pit_gap_low=5.0, pit_gap_high=6.0),      # far from both
                  TerrainEncoding(roughness=1.0)]                          # between the two
    assert rank_by_novelty(candidates, archive, k=1, scale=SCALE) == [1, 2, 0]
    assert novelty(archive[0], archive, k=1, scale=SCALE) == 0.0
    assert novelty(candidates[0], [], k=5, scale=SCALE) == float("inf")
    # k: the mean over the nearest k
    assert novelty(TerrainEncoding(roughness=1.0), archive, k=2, scale=SCALE) == pytest.approx(1.0 / 10)


def test_transfer_picks_the_best_candidate_only_if_it_beats_the_incumbent():
    assert best_transfer(100.0, {"a": 90.0, "b": 130.0, "c": 120.0}) == "b"
    assert best_transfer(100.0, {"a": 90.0, "b": 100.0}) is None
    assert best_transfer(100.0, {}) is None
    assert best_transfer(0.0, {"a": 5.0, "b": 5.0}) == "a"  # a tie goes to the first tried


# --- whole runs -------------------------------------------------------------------------
def _metrics(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _strip(metrics):
    timing = {"time_s", "wall_time", "iteration_s", "utilisation", "pool_utilisation"}
    return [{k: v for k, v in m.items() if k not in timing} for m in metrics]


@pytest.mark.slow
def test_a_short_run_grows_the_population_and_resumes_to_the_same_result(tmp_path):
    whole = run(compose(TINY + ["algo.iterations=8"]), tmp_path / "whole")
    assert whole["active_pairs"] > 1 and whole["envs_created"] >= 2
    metrics = _metrics(tmp_path / "whole")
    assert [m["iteration"] for m in metrics] == list(range(8))
    assert any(m["transfers"] > 0 for m in metrics) or all(m["active_pairs"] > 1 for m in metrics[3:])
    assert 0 < metrics[-1]["utilisation"] <= 1.0 + 1e-6
    assert (tmp_path / "whole" / "terrains.png").stat().st_size > 0
    assert (tmp_path / "whole" / "poet.png").stat().st_size > 0

    # stopped after iteration 5 (a checkpoint), resumed on one worker: the same run
    run(compose(TINY + ["algo.iterations=6"]), tmp_path / "split")
    resumed = run(compose(TINY + ["algo.iterations=8", "workers=1", f"resume={tmp_path / 'split'}"]),
                  tmp_path / "split")
    assert _strip(_metrics(tmp_path / "split")) == _strip(metrics)
    assert resumed["archive"] == whole["archive"]
    assert [(i, e) for i, e, _ in resumed["pairs"]] == [(i, e) for i, e, _ in whole["pairs"]]


@pytest.mark.slow
def test_the_small_preset_gets_its_walker_off_the_ground_early(tmp_path):
    # a learning check: seed 1 creates its first terrain at iteration 12 (with algo.es.sigma=0.1, the
    # preset's earlier value, it created none within 40 iterations)
    summary = run(compose(["+experiment=poet_small", "workers=2", "seed=1", "algo.iterations=13",
                           "tensorboard=false"]), tmp_path / "run")
    assert summary["envs_created"] >= 1, summary


def test_poets_es_settings_are_in_its_fingerprint():
    from fiberrl.app import fingerprint
    assert fingerprint(compose(TINY + ["algo.es.reward_clip=1"]))["algo"]["es"]["reward_clip"] == 1


@pytest.mark.slow
def test_poet_refuses_another_env_in_one_line(tmp_path):
    with pytest.raises(UsageError, match="use env=terrain_walker, not env=cartpole"):
        run(compose(TINY + ["env=cartpole"]), tmp_path / "run")
    done = subprocess.run([PYTHON, "-m", "fiberrl", *TINY, "algo.mc_low=10", "algo.mc_high=5",
                           f"hydra.run.dir={tmp_path / 'cli'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == "error: algo.mc_low=10.0 is above algo.mc_high=5.0"
