"""POET after Wang et al. 2019, "Paired Open-Ended Trailblazer (POET):
Endlessly Generating Increasingly Complex and Diverse Learning Environments
and Their Solutions".

A population of pairs, each an environment (a Bipedal Walker terrain,
``fiberrl.rl.walker_terrain``) and an agent (a policy's parameters with its own
ES optimiser).  Every iteration every active pair takes one ES step on its
own terrain; all pairs' perturbations go to one shared Pool in one map, so
no worker waits for a slow pair.  Every ``reproduce_every`` iterations the
pairs whose agent scores at least ``reproduce_threshold`` have mutated
children terrains; a child is kept when its parent's agent scores inside
[``mc_low``, ``mc_high``] on it (the minimal criterion: neither too easy nor
too hard), the kept ones ranked by novelty (mean distance of their encoding
to the ``novelty_k`` nearest in the archive of every terrain ever admitted)
and at most ``max_admitted`` join, the oldest pairs leaving past
``max_active``.  Every ``transfer_every`` iterations each terrain tries every
other pair's agent, as it is and after one ES step on the terrain, and the
best replaces the incumbent if it scores higher.

ANNECS (accumulated number of novel environments created and solved) counts
the admitted terrains that some agent has solved (scored at least
``solved_threshold`` on).  Randomness is drawn by the master from seeded
generators and results come back in task order, so the same seed gives the
same run with any number of workers and after a resume.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np

import fiberrl.runtime as mp
from .es import ES, ESSettings, check_noise_room, check_noise_size
from .es_workers import EvalResult, EvalTask, EvaluatorSpec, PairTask, ParamServer
from .poet_population import ArchivedTerrain, Pair, check_checkpoint, pack, unpack
from .poet_workers import TerrainTask, evaluate, init_worker
from fiberrl.algorithm import Algorithm
from fiberrl.rl.noise import NoiseTable
from fiberrl.rl.policies import make_policy
from fiberrl.rl.walker_terrain import ENV_ID, TerrainEncoding, make_terrain_env
from fiberrl.training import TrainingLoop
from fiberrl.validation import (
    ANY,
    UsageError,
    at_least,
    check_fields,
    finite,
    non_negative,
    one_of,
    optional,
    positive,
    setting,
)

# an encoding field's upper bound is also its unit in novelty distances, so it cannot be 0
ENCODING_BOUND = positive().because("the encoding's bound and its unit of novelty")


@dataclass
class Config:
    """The hyperparameters of POET; also the Hydra schema of ``algo=poet``."""
    name: str = setting("poet", one_of("poet").because("algo=<name> chooses the algorithm"))
    iterations: int = setting(2000, at_least(1))  # POET iterations (one ES step per active pair each)
    # each pair's ES optimiser, as algo=es's (algo.es.sigma=...), with the paper's values: no observation
    # normalisation, a 100 MB noise table; checked field by field against ESSettings' rules (check_settings)
    es: ESSettings = setting(rule=ANY, factory=lambda: ESSettings(
        sigma=0.1, weight_decay=0.01, obstat_prob=0.0, obs_clip=10.0, hidden=[40, 40], noise_size=25_000_000))
    # cap on an episode's steps (None: the terrain env's 2000)
    episode_steps: int | None = setting(None, optional(at_least(1), "the terrain env's own limit"))
    # episodes that score an agent on a terrain
    eval_episodes: int = setting(1, at_least(1).because("an agent's score on a terrain is their mean"))
    # the open-ended loop
    reproduce_every: int = setting(150, at_least(1))  # iterations between reproductions
    # a pair may reproduce once its agent scores this on its terrain
    reproduce_threshold: float = setting(200.0, finite())
    children: int = setting(16, at_least(1))  # mutated terrains proposed per reproduction
    mc_low: float = setting(50.0, finite())  # minimal criterion: the parent's score on a child must be in [low, high]
    mc_high: float = setting(300.0, finite())
    max_admitted: int = setting(2, at_least(1))  # children admitted per reproduction at most
    max_active: int = setting(20, at_least(1))  # active pairs at most; the oldest leave first
    novelty_k: int = setting(5, at_least(1))  # nearest archived terrains a novelty is the mean distance to
    transfer_every: int = setting(25, at_least(1))  # iterations between transfer attempts
    proposal_transfer: bool = setting(True, ANY)  # also try each agent after one ES step on the target terrain
    solved_threshold: float = setting(230.0, finite())  # a terrain is solved once an agent scores this on it
    # mutation steps and upper bounds of the terrain encoding
    roughness_step: float = setting(0.6, non_negative())
    roughness_max: float = setting(10.0, ENCODING_BOUND)
    pit_gap_step: float = setting(0.4, non_negative())
    pit_gap_max: float = setting(10.0, ENCODING_BOUND)
    stump_height_step: float = setting(0.2, non_negative())
    stump_height_max: float = setting(5.0, ENCODING_BOUND)
    stair_height_step: float = setting(0.2, non_negative())
    stair_height_max: float = setting(5.0, ENCODING_BOUND)
    stair_steps_max: int = setting(10, at_least(1).because("the encoding's bound and its unit of novelty"))
    checkpoint_every: int = setting(10, at_least(1))
    # tasks per pool message (None: the pool's default)
    chunksize: int | None = setting(None, optional(at_least(1), "the pool's default"))


# --- terrains: mutation, minimal criterion, novelty (no workers) -----------------

ENCODING_FIELDS = [f.name for f in fields(TerrainEncoding)]


def encoding_scale(cfg) -> np.ndarray:
    """Each encoding field's upper bound: novelty distances are taken in these units."""
    bounds = dict(roughness=cfg.roughness_max, pit_gap_low=cfg.pit_gap_max, pit_gap_high=cfg.pit_gap_max,
                  stump_height_low=cfg.stump_height_max, stump_height_high=cfg.stump_height_max,
                  stair_height=cfg.stair_height_max, stair_width=8, stair_steps=cfg.stair_steps_max)
    return np.array([bounds[name] for name in ENCODING_FIELDS], dtype=np.float64)


def mutate(parent: TerrainEncoding, rng: np.random.Generator, cfg, tries: int = 100) -> TerrainEncoding:
    """A child terrain that differs from ``parent``: each obstacle kind changes with probability 1/2."""
    def step_range(low, high, step, top):
        low, high = (round(float(np.clip(v + step * rng.choice([-1, 1]), 0, top)), 6) for v in (low, high))
        return min(low, high), max(low, high)

    for _ in range(tries):  # a step can clip back to where it was, at a bound
        changed = rng.random(4) < 0.5
        child = parent.to_dict()
        if changed[0]:
            child["roughness"] = round(float(np.clip(
                parent.roughness + rng.uniform(-cfg.roughness_step, cfg.roughness_step), 0, cfg.roughness_max)), 6)
        if changed[1]:
            child["pit_gap_low"], child["pit_gap_high"] = step_range(parent.pit_gap_low, parent.pit_gap_high,
                                                                     cfg.pit_gap_step, cfg.pit_gap_max)
        if changed[2]:
            child["stump_height_low"], child["stump_height_high"] = step_range(
                parent.stump_height_low, parent.stump_height_high, cfg.stump_height_step, cfg.stump_height_max)
        if changed[3]:
            child["stair_height"] = round(float(np.clip(
                parent.stair_height + cfg.stair_height_step * rng.choice([-1, 1]), 0, cfg.stair_height_max)), 6)
            child["stair_steps"] = int(np.clip(parent.stair_steps + rng.choice([-1, 0, 1]), 0, cfg.stair_steps_max))
        mutated = TerrainEncoding.from_dict(child)
        if mutated != parent:
            return mutated
    return mutated


def meets_minimal_criterion(score: float, cfg) -> bool:
    return cfg.mc_low <= score <= cfg.mc_high


def novelty(encoding: TerrainEncoding, archive: list[TerrainEncoding], k: int, scale: np.ndarray) -> float:
    """Mean distance to the ``k`` nearest archived encodings (infinite for an empty archive)."""
    if not archive:
        return float("inf")
    here = encoding.vector() / scale
    distances = np.sort([np.linalg.norm(here - other.vector() / scale) for other in archive])
    return float(distances[:k].mean())


def rank_by_novelty(candidates: list[TerrainEncoding], archive: list[TerrainEncoding], k: int,
                    scale: np.ndarray) -> list[int]:
    """Indices of ``candidates``, most novel first (ties: the earlier first)."""
    scores = [novelty(c, archive, k, scale) for c in candidates]
    return sorted(range(len(candidates)), key=lambda i: -scores[i])


def best_transfer(incumbent_score: float, candidate_scores: dict) -> object | None:
    """The candidate that beats the incumbent by scoring highest, or None."""
    if not candidate_scores:
        return None
    best = max(candidate_scores, key=candidate_scores.get)  # the first of equals: max keeps the earliest
    return best if candidate_scores[best] > incumbent_score else None


def difficulty(encoding: TerrainEncoding, scale: np.ndarray) -> float:
    """How hard a terrain looks, for reports: its encoding's share of the bounds, summed."""
    return float(np.sum(encoding.vector() / scale))


# --- the master's side ------------------------------------------------------------

class AgentOnTerrain(NamedTuple):
    """What the master evaluates or steps: an agent (its key among the published ones, its optimiser) on a terrain."""
    key: object
    es: ES
    terrain: TerrainEncoding


class Master:
    """Publishes agents, runs batches of tasks through the pool, keeps the books."""

    def __init__(self, pool, store, cfg, rng: np.random.Generator):
        self.pool, self.store, self.cfg, self.rng = pool, store, cfg, rng
        self.version = 0
        self.timesteps, self.busy_s, self.pool_s = 0, 0.0, 0.0

    def publish(self, agents: dict) -> int:
        """Make ``agents`` (key -> ES) readable by the workers; returns their version."""
        self.version += 1
        self.store.publish(self.version, {key: (es.theta.copy(), es.obs_stat.mean, es.obs_stat.std, es.sigma)
                                          for key, es in agents.items()})
        return self.version

    def run(self, tasks: list[TerrainTask]) -> list:
        """The results of ``tasks``, in their order."""
        began = time.perf_counter()
        done = self.pool.map(evaluate, tasks, chunksize=self.cfg.chunksize) if tasks else []
        self.pool_s += time.perf_counter() - began
        self.busy_s += sum(d.seconds for d in done)
        return [d.result for d in done]

    def es_steps(self, agents: list[AgentOnTerrain]) -> tuple[list[np.ndarray], list[float]]:
        """One ES step of each agent on its terrain, all in one map together with the evaluation
        of each agent before its step: (the perturbations' returns, the scores)."""
        version = self.publish({a.key: a.es for a in agents})
        asked = [a.es.ask() for a in agents]
        tasks = [TerrainTask(a.key, a.terrain.to_dict(), PairTask(version, int(i), int(s), bool(r)))
                 for a, perturbations in zip(agents, asked, strict=True)
                 for i, s, r in zip(perturbations.noise_index, perturbations.env_seed, perturbations.record_obs,
                                    strict=True)]
        evaluations = self._evaluation_tasks(version, agents)
        results = self.run(tasks + evaluations)
        results, scores = results[:len(tasks)], self._scores(results[len(tasks):], len(agents))
        returns = []
        for a, perturbations in zip(agents, asked, strict=True):
            mine, results = results[:perturbations.noise_index.size], results[perturbations.noise_index.size:]
            self.timesteps += sum(r.steps for r in mine)
            pos, neg = np.array([r.return_pos for r in mine]), np.array([r.return_neg for r in mine])
            for r in mine:
                if r.obs_sums is not None:
                    a.es.obs_stat.increment(*r.obs_sums)
            a.es.tell(perturbations, pos, neg)
            returns.append(np.concatenate([pos, neg]))
        return returns, scores

    def scores(self, agents: list[AgentOnTerrain]) -> list[float]:
        """Each agent's mean return on its terrain over ``eval_episodes``, all in one map."""
        version = self.publish({a.key: a.es for a in agents})
        return self._scores(self.run(self._evaluation_tasks(version, agents)), len(agents))

    def _evaluation_tasks(self, version: int, agents: list[AgentOnTerrain]) -> list[TerrainTask]:
        seeds = self.rng.integers(0, 2**31 - 1, size=(len(agents), self.cfg.eval_episodes))
        return [TerrainTask(a.key, a.terrain.to_dict(), EvalTask(version, int(s)))
                for a, row in zip(agents, seeds, strict=True) for s in row]

    def _scores(self, results: list[EvalResult], agents: int) -> list[float]:
        self.timesteps += sum(r.steps for r in results)
        per_agent = np.array([r.reward for r in results]).reshape(agents, self.cfg.eval_episodes)
        return [float(row.mean()) for row in per_agent]


def new_es(theta: np.ndarray, cfg, noise: NoiseTable, rng: np.random.Generator, obs_shape) -> ES:
    return ES(theta, cfg.es, noise, seed=int(rng.integers(0, 2**63 - 1)), obs_shape=obs_shape)


def fresh_optimiser(source: ES, cfg, noise: NoiseTable, rng: np.random.Generator) -> ES:
    """A new optimiser for ``source``'s agent: its parameters and the observation
    statistics they were trained with, a new Adam state."""
    es = new_es(source.theta, cfg, noise, rng, source.obs_stat.sum.shape)
    es.obs_stat.sum, es.obs_stat.sumsq = source.obs_stat.sum.copy(), source.obs_stat.sumsq.copy()
    es.obs_stat.count = source.obs_stat.count
    return es


def reproduce(pairs, archive, iteration, master, cfg, noise, next_id) -> tuple[list, int, int]:
    """Mutated children of the eligible pairs that pass the minimal criterion, most novel first.
    Returns (admitted pairs, children that passed the criterion, the next free id)."""
    eligible = [p for p in pairs if p.score >= cfg.reproduce_threshold]
    if not eligible:
        return [], 0, next_id
    parents = [eligible[int(master.rng.integers(len(eligible)))] for _ in range(cfg.children)]
    children = [mutate(p.encoding, master.rng, cfg) for p in parents]
    scores = master.scores([AgentOnTerrain(("pair", p.id), p.es, c) for p, c in zip(parents, children, strict=True)])
    passed = [(p, c) for p, c, s in zip(parents, children, scores, strict=True) if meets_minimal_criterion(s, cfg)]
    known = [t.encoding for t in archive]
    passed = [(p, c) for p, c in passed if c not in known]
    order = rank_by_novelty([c for _, c in passed], known, cfg.novelty_k, encoding_scale(cfg))
    admitted = []
    for index in order[:cfg.max_admitted]:
        parent, child = passed[index]
        es = fresh_optimiser(parent.es, cfg, noise, master.rng)
        admitted.append(Pair(next_id, child, es, created=iteration, parent=parent.id))
        archive.append(ArchivedTerrain(next_id, child, created=iteration))
        next_id += 1
    return admitted, len(passed), next_id


def transfer(pairs, master, cfg, noise) -> int:
    """Each terrain tries every other agent (as is, and after one ES step there); the best
    replaces the incumbent if it scores higher.  Returns how many incumbents were replaced."""
    others = [(target, source) for target in pairs for source in pairs if source is not target]
    if not others:
        return 0
    direct = master.scores([AgentOnTerrain(("pair", s.id), s.es, t.encoding) for t, s in others])
    candidates = {(t.id, "direct", s.id): (score, s.es) for (t, s), score in zip(others, direct, strict=True)}
    if cfg.proposal_transfer:
        trials = [fresh_optimiser(s.es, cfg, noise, master.rng) for _, s in others]
        proposals = [AgentOnTerrain(("trial", i), es, t.encoding)
                     for i, ((t, _), es) in enumerate(zip(others, trials, strict=True))]
        master.es_steps(proposals)
        proposed = master.scores(proposals)
        for (t, s), es, score in zip(others, trials, proposed, strict=True):
            candidates[(t.id, "proposal", s.id)] = (score, es)
    replaced = 0
    for target in pairs:
        mine = {key: value[0] for key, value in candidates.items() if key[0] == target.id}
        winner = best_transfer(target.score, mine)
        if winner is not None:
            target.es = fresh_optimiser(candidates[winner][1], cfg, noise, master.rng)
            target.score = mine[winner]
            replaced += 1
    return replaced


# --- the training loop -----------------------------------------------------------------

def check_settings(cfg) -> None:
    """algo.* as their fields' rules say, then what the settings need together and of the env; raises UsageError."""
    check_fields(cfg.algo, Config, "algo.")
    check_fields(cfg.algo.es, ESSettings, "algo.es.")
    algo = cfg.algo
    if cfg.env.id.split(":")[-1] != ENV_ID:
        raise UsageError(f"algo=poet evolves Bipedal Walker terrains: use env=terrain_walker, not env={cfg.env.name}")
    if algo.mc_low > algo.mc_high:
        raise UsageError(f"algo.mc_low={algo.mc_low} is above algo.mc_high={algo.mc_high}")
    env = make_terrain_env(None)
    try:
        check_noise_size(algo.es, env, "algo.es.")
    finally:
        env.close()
    check_noise_room(algo.es.noise_size, cfg.seed, "algo.es.")


def train(cfg, run, on_iteration=None) -> dict:
    """Run POET as ``cfg`` says, writing into ``run`` (a ``fiberrl.run.RunDirectory``).
    ``on_iteration(iteration, pool)`` is called after every iteration."""
    check_settings(cfg)
    noise = NoiseTable(cfg.seed, cfg.algo.es.noise_size, hold=True)
    try:
        return _train(cfg, run, noise, on_iteration)
    finally:
        noise.release()  # on every way out, a failed resume too: the table is this host's memory


def _train(cfg, run, noise: NoiseTable, on_iteration) -> dict:
    from fiberrl.rl.terrain_plot import plot_population, plot_progress
    algo = cfg.algo
    env = make_terrain_env(None)
    policy = make_policy(algo.es.policy, env.observation_space, env.action_space, list(algo.es.hidden))
    obs_shape = env.observation_space.shape
    env.close()
    scale = encoding_scale(algo)
    rng = np.random.Generator(np.random.PCG64([cfg.seed, 2]))
    first = Pair(0, TerrainEncoding(), new_es(policy.initial_params(rng), algo, noise, rng, obs_shape),
                 created=0, parent=None)
    pairs, archive, next_id, annecs = [first], [ArchivedTerrain(0, first.encoding, 0)], 1, None

    spec = EvaluatorSpec(ENV_ID, {}, algo.episode_steps or cfg.env.max_episode_steps, algo.es.policy,
                         list(algo.es.hidden), noise.seed, noise.size, algo.es.obs_clip,
                         algo.es.episodes_per_eval, algo.es.reward_clip)
    server = ParamServer()
    server.start()
    pool = None
    try:
        store = server.ParamStore()
        pool = mp.Pool(cfg.workers, initializer=init_worker, initargs=(spec, store))
        master = Master(pool, store, algo, rng)
        loop = TrainingLoop(run, algo, algo.iterations, until_timesteps=cfg.until_timesteps)
        checkpoint = loop.resume(lambda arrays, values: check_checkpoint(arrays, values, first.es.theta.size,
                                                                         obs_shape, algo.es.optimizer))
        if checkpoint is not None:
            pairs, archive = unpack(*checkpoint, master, algo, noise, obs_shape)
            next_id = checkpoint[1]["next_id"]
        for iteration in loop:
            t0 = time.perf_counter()
            busy0, pool0 = master.busy_s, master.pool_s
            admitted = passed = replaced = 0
            if iteration > 0 and iteration % algo.reproduce_every == 0:
                children, passed, next_id = reproduce(pairs, archive, iteration, master, algo, noise, next_id)
                pairs += children
                admitted = len(children)
                pairs = pairs[-algo.max_active:]  # admitted last, so the oldest leave

            # each agent is scored on its terrain as it was before this step, in the step's own map
            returns, scores = master.es_steps([AgentOnTerrain(("pair", p.id), p.es, p.encoding) for p in pairs])
            for p, score in zip(pairs, scores, strict=True):
                p.score = score

            if iteration > 0 and iteration % algo.transfer_every == 0:
                replaced = transfer(pairs, master, algo, noise)

            by_id = {t.id: t for t in archive}
            for p in pairs:
                if p.score >= algo.solved_threshold and by_id[p.id].solved_at is None:
                    by_id[p.id].solved_at = iteration
            solved = [t for t in archive if t.solved_at is not None]
            both = np.concatenate(returns)
            wall = time.perf_counter() - t0
            loop.timesteps = master.timesteps
            metrics = dict(
                reward_mean=float(both.mean()), reward_max=float(both.max()), reward_min=float(both.min()),
                annecs=sum(1 for t in solved if t.id != 0),
                active_pairs=len(pairs), envs_created=len(archive) - 1, children_passed_mc=passed,
                children_admitted=admitted, transfers=replaced,
                hardest_solved=max((difficulty(t.encoding, scale) for t in solved), default=None),
                utilisation=(master.busy_s - busy0) / (cfg.workers * wall),
                pool_utilisation=(master.busy_s - busy0) / max(cfg.workers * (master.pool_s - pool0), 1e-9),
                pairs=[dict(id=p.id, score=p.score, age=iteration - p.created, terrain=p.encoding.describe())
                       for p in pairs])

            def state():
                plot_population([(p.id, p.encoding, p.score) for p in pairs], run.path / "terrains.png",
                                seed=cfg.seed)
                return pack(pairs, archive, master, dict(next_id=next_id))
            annecs = metrics["annecs"]
            loop.end(iteration, metrics, eval_reward=max(p.score for p in pairs), state=state,
                     on_iteration=on_iteration and (lambda: on_iteration(iteration, pool)))
            if loop.checkpointed:
                plot_progress(run.read_metrics(), run.path / "poet.png")
    finally:
        if pool is not None:
            pool.terminate()
        server.shutdown()
    return loop.summary(annecs=annecs, active_pairs=len(pairs), envs_created=len(archive) - 1,
                        utilisation_mean=master.busy_s / max(cfg.workers * loop.time_s, 1e-9),
                        pairs=[(p.id, p.encoding, p.score) for p in pairs],
                        archive=[(t.id, t.encoding, t.created, t.solved_at) for t in archive])


ALGORITHM = Algorithm(
    name="poet", config=Config, check_settings=check_settings, train=train,
    load_policy=None,  # its checkpoints hold a population of agents, each for its own terrain
    worker_modules=("fiberrl.algos.poet_workers",),
    resume_may_change=frozenset({"iterations", "checkpoint_every", "stop_reward", "chunksize"}))
