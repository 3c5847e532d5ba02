"""Evolution strategies after Salimans et al. 2017, "Evolution Strategies as a
Scalable Alternative to Reinforcement Learning" (OpenAI's ES).

Each iteration the master draws `population` noise-table indices, every
perturbation is evaluated mirrored (theta + sigma*eps and theta - sigma*eps)
by a pool worker, and the master turns the returns into centered ranks and
takes an Adam step on the rank-weighted sum of the perturbations.

What travels: a worker is sent a ``PairTask`` (iteration, noise index, env
seed) per perturbation and returns a ``PairResult`` (return of +eps, return of
-eps, steps), with the observation sums of the ~10% of perturbations picked to
feed the running observation normalisation.  The noise itself is a table every
host builds once from the seed (`fiberrl.rl.noise`); the parameters are
published once per iteration to a parameter server that each worker reads
once per iteration, never pickled per task.

Determinism: every random choice (indices, env seeds, which episodes feed
the observation statistics) is drawn by the master from one seeded
generator, results come back in task order whatever worker ran them, and
the update sums in a fixed order.  So the same seed gives bit-identical
parameters with any number of workers, when workers die mid-run, and after
a resume from a checkpoint.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

import fiberrl.runtime as mp
from fiberrl.algorithm import Algorithm, LoadedPolicy
from fiberrl.rl.envs import make_env
from fiberrl.rl.noise import FLOAT_BYTES, NoiseTable, table_path
from fiberrl.rl.policies import POLICIES, RunningStat, make_policy, run_episode
from fiberrl.run import DamagedFile, require
from fiberrl.training import TrainingLoop
from fiberrl.validation import (
    ANY,
    Rule,
    UsageError,
    at_least,
    between,
    check_fields,
    finite,
    layer_sizes,
    non_negative,
    one_of,
    optional,
    positive,
    setting,
    shown,
)

from .es_workers import EvalTask, EvaluatorSpec, PairTask, ParamServer, evaluate, init_worker


@dataclass
class ESSettings:
    """One ES optimiser's settings and what its perturbations are evaluated with: ``algo=es``'s, and
    each of POET's pairs' (``algo.es.*`` there)."""
    population: int = setting(256, at_least(1))  # perturbations per iteration; each is evaluated at +eps and -eps
    sigma: float = setting(0.02, positive())  # noise standard deviation
    learning_rate: float = setting(0.01, positive())  # Adam step size
    adam_beta1: float = setting(0.9, between(0, 1, include_high=False).because("Adam divides by 1 - beta**t"))
    adam_beta2: float = setting(0.999, between(0, 1, include_high=False).because("Adam divides by 1 - beta**t"))
    weight_decay: float = setting(0.005, non_negative())  # L2 coefficient added to the gradient
    policy: str = setting("mlp", one_of(*POLICIES))  # "mlp" (numpy) or "torch_mlp" (a torch module)
    hidden: list[int] = setting(rule=layer_sizes(), factory=lambda: [64, 64])
    noise_size: int = setting(250_000_000, at_least(1))  # float32 numbers in the shared noise table (1 GB)
    obstat_prob: float = setting(0.1, between(0, 1))  # share of perturbations whose observations update the normaliser
    obs_clip: float = setting(5.0, positive())  # normalised observations are clipped to +-obs_clip
    # "adam" (OpenAI's ES) or "clipup" (Toklu et al. 2020; evotorch's PGPE)
    optimizer: str = setting("adam", one_of("adam", "clipup"))
    # ClipUp's heavy-ball momentum
    clipup_momentum: float = setting(0.9, between(0, 1, include_high=False).because("a momentum of 1 never forgets"))
    # ClipUp's bound on a step's length (None: 2 * learning_rate, as evotorch)
    max_speed: float | None = setting(None, optional(positive(), "2 * learning_rate"))
    # sigma is multiplied by this after each update (estool's OpenES: 0.999)...
    sigma_decay: float = setting(1.0, Rule(lambda decay: 0 < decay <= 1,
                                           "must be a number in (0, 1] (sigma only shrinks; 1: a fixed sigma)"))
    sigma_min: float = setting(0.0, non_negative())  # ...down to this (estool: 0.02)
    episodes_per_eval: int = setting(1, at_least(1))  # episodes each side of a perturbation is scored over (their mean)
    # a perturbation's score clips each step's reward to +-this (None: as is); eval_reward never does
    # (ARS's BipedalWalker: a fall's -100 costs -1)
    reward_clip: float | None = setting(None, optional(positive(), "rewards as the env gives them"))


@dataclass
class Config(ESSettings):
    """The hyperparameters of ES (``ESSettings`` and the loop's); also the Hydra schema of ``algo=es``."""
    name: str = setting("es", one_of("es").because("algo=<name> chooses the algorithm"))
    iterations: int = setting(200, at_least(1))  # ES updates to run (a resumed run continues up to this)
    # or stop after the update whose training episodes reach these env steps
    total_timesteps: int | None = setting(None, optional(at_least(1), "no budget of env steps"))
    # cap on an episode's steps (None: the env's own limit)...
    episode_steps: int | None = setting(None, optional(at_least(1), "the env's own limit"))
    # ...or, above 1, the training episodes' starting cap (OpenAI's adaptive cutoff): x growth whenever
    # episode_steps_grow_at of them reach it
    episode_steps_growth: float = setting(1.0, Rule(lambda growth: growth >= 1,
                                                    "must be a number >= 1 (1: a fixed cap)"))
    episode_steps_grow_at: float = setting(0.5, Rule(lambda share: 0 < share <= 1, "must be a number in (0, 1]"))
    # episodes of the unperturbed policy per iteration, for eval_reward
    eval_episodes: int = setting(5, at_least(0).because("0: no eval_reward"))
    checkpoint_every: int = setting(10, at_least(1))  # iterations between checkpoints
    stop_reward: float | None = setting(None, optional(finite(), "no early stop"))  # stop once eval_reward reaches this
    # perturbations per pool task (None: the pool's default)
    chunksize: int | None = setting(None, optional(at_least(1), "the pool's default"))
    # once no task waits, idle workers also run the tasks others still run and the first result counts
    # (the pool's backup_tasks): a slow host no longer sets an iteration's pace; every result is the same
    backup_tasks: bool = setting(False, ANY)
    # the noise table's seed, one for every run as OpenAI's ES has it (the run's seed picks its slices): runs
    # on one host at the same time (a sweep's, a population's) share one table, drawn once
    noise_seed: int = setting(0, at_least(0))


def check_settings(cfg) -> None:
    """algo.* as their fields' rules say, then what the settings need together and of the env; raises UsageError."""
    check_fields(cfg.algo, Config, "algo.")
    algo = cfg.algo
    if algo.stop_reward is not None and algo.eval_episodes == 0:
        raise UsageError(f"algo.stop_reward={algo.stop_reward} is compared with the eval reward, which "
                         f"algo.eval_episodes=0 never measures; set algo.eval_episodes >= 1")
    if algo.episode_steps_growth > 1 and algo.episode_steps is None:
        raise UsageError(f"algo.episode_steps_growth={algo.episode_steps_growth} grows the cap algo.episode_steps "
                         f"sets, which is unset; set algo.episode_steps to the starting cap")
    try:
        env = make_env(cfg.env.id, dict(cfg.env.kwargs), cfg.env.max_episode_steps)
    except TypeError as exc:  # gymnasium's message names the env and the argument it does not take
        raise UsageError(f"env.kwargs={shown(cfg.env.kwargs)}: {str(exc).splitlines()[0]}") from None
    try:
        check_noise_size(algo, env)
    finally:
        env.close()
    check_noise_room(algo.noise_size, algo.noise_seed)


def check_noise_size(algo, env, prefix: str = "algo.") -> None:
    """A perturbation is a slice of the noise table as long as the policy's parameters."""
    try:
        parameters = make_policy(algo.policy, env.observation_space, env.action_space, list(algo.hidden)).num_params
    except ValueError as exc:  # an action space the policies do not support
        raise UsageError(f"env.id={env.spec.id}: {exc}") from None
    if algo.noise_size < parameters:
        raise UsageError(f"{prefix}noise_size={algo.noise_size}: must be at least {parameters}, the policy's number "
                         f"of parameters (a perturbation is a slice of the noise table that long)")


def check_noise_room(size: int, seed: int, prefix: str = "algo.") -> None:
    """This host makes the table where fiberrl.rl.noise keeps it, unless an earlier run left it there."""
    path = table_path(seed, size)
    if os.path.exists(path):
        return
    room = os.statvfs(os.path.dirname(path))
    free = room.f_bavail * room.f_frsize
    if size * FLOAT_BYTES > free:
        raise UsageError(f"{prefix}noise_size={size}: its table needs {size * FLOAT_BYTES / 2**30:.1f} GiB and "
                         f"{os.path.dirname(path)} has {free / 2**30:.1f} GiB free")


# --- the ask/tell core: no workers, no environments -------------------------

class Adam:
    def __init__(self, size: int, learning_rate: float, beta1: float, beta2: float, epsilon: float = 1e-8):
        self.learning_rate, self.beta1, self.beta2, self.epsilon = learning_rate, beta1, beta2, epsilon
        self.m = np.zeros(size, dtype=np.float32)
        self.v = np.zeros(size, dtype=np.float32)
        self.t = 0

    def step(self, gradient: np.ndarray) -> np.ndarray:
        """The change to make to the parameters to descend ``gradient``."""
        self.t += 1
        a = self.learning_rate * np.sqrt(1 - self.beta2 ** self.t) / (1 - self.beta1 ** self.t)
        self.m = self.beta1 * self.m + (1 - self.beta1) * gradient
        self.v = self.beta2 * self.v + (1 - self.beta2) * (gradient * gradient)
        return (-a * self.m / (np.sqrt(self.v) + self.epsilon)).astype(np.float32)


class ClipUp:
    """Toklu et al. 2020, "ClipUp: A Simple and Powerful Optimizer for Distribution-based
    Policy Evolution": a step of fixed length along the normalised gradient, heavy-ball
    momentum, and the velocity's length clipped to ``max_speed``."""

    def __init__(self, size: int, step_size: float, momentum: float, max_speed: float):
        self.step_size, self.momentum, self.max_speed = step_size, momentum, max_speed
        self.velocity = np.zeros(size, dtype=np.float32)

    def step(self, gradient: np.ndarray) -> np.ndarray:
        """The change to make to the parameters to descend ``gradient``."""
        norm = float(np.linalg.norm(gradient))
        self.velocity = self.momentum * self.velocity
        if norm > 0:
            self.velocity += self.step_size * (gradient / norm)
        speed = float(np.linalg.norm(self.velocity))
        if speed > self.max_speed:
            self.velocity *= self.max_speed / speed
        return (-self.velocity).astype(np.float32)


OPTIMIZER_STATE = {"adam": (("adam_m", "adam_v"), ("adam_t",)), "clipup": (("clipup_velocity",), ())}


def make_optimizer(config: ESSettings, size: int):
    if config.optimizer == "clipup":
        max_speed = config.max_speed if config.max_speed is not None else 2 * config.learning_rate
        return ClipUp(size, config.learning_rate, config.clipup_momentum, max_speed)
    return Adam(size, config.learning_rate, config.adam_beta1, config.adam_beta2)


def centered_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks scaled to [-0.5, 0.5]; ties broken by position, so the result is deterministic."""
    ranks = np.empty(x.size, dtype=np.float32)
    ranks[np.argsort(x.ravel(), kind="stable")] = np.arange(x.size, dtype=np.float32)
    return (ranks / (x.size - 1) - 0.5).reshape(x.shape)


@dataclass
class Perturbations:
    """What one iteration asks to be evaluated."""
    noise_index: np.ndarray  # start of each perturbation's slice of the noise table
    env_seed: np.ndarray     # the seed both mirrored episodes reset with
    record_obs: np.ndarray   # whether this perturbation's observations feed the normaliser


class ES:
    """ask() the perturbations to evaluate, tell() their returns, repeat."""

    _ROWS_PER_BLOCK = 512  # noise rows gathered at once when summing the update

    def __init__(self, theta: np.ndarray, config: ESSettings, noise: NoiseTable, seed: int, obs_shape=()):
        self.theta = np.array(theta, dtype=np.float32)
        self.config, self.noise = config, noise
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.optimizer = make_optimizer(config, self.theta.size)
        self.sigma = float(config.sigma)  # this iteration's; it decays after each update
        self.obs_stat = RunningStat(obs_shape)

    def ask(self) -> Perturbations:
        n = self.config.population
        return Perturbations(
            noise_index=self.noise.sample_index(self.rng, self.theta.size, n),
            env_seed=self.rng.integers(0, 2**31 - 1, size=n),
            record_obs=self.rng.random(n) < self.config.obstat_prob,
        )

    def perturbation(self, noise_index: int) -> np.ndarray:
        return self.sigma * self.noise.get(int(noise_index), self.theta.size)

    def tell(self, asked: Perturbations, returns_pos, returns_neg) -> float:
        """Update theta from the mirrored returns; returns the gradient's norm."""
        returns = np.stack([np.asarray(returns_pos, np.float64), np.asarray(returns_neg, np.float64)], axis=1)
        if returns.shape != (asked.noise_index.size, 2):
            raise ValueError(f"tell() needs a return pair for each of the {asked.noise_index.size} perturbations "
                             f"asked, got {returns.shape[0]}")
        ranks = centered_ranks(returns)
        weights = ranks[:, 0] - ranks[:, 1]
        gradient = np.zeros(self.theta.size, dtype=np.float32)
        dim, block = self.theta.size, self._ROWS_PER_BLOCK
        for start in range(0, weights.size, block):
            rows = np.stack([self.noise.get(int(i), dim) for i in asked.noise_index[start:start + block]])
            gradient += weights[start:start + block] @ rows
        gradient /= returns.size
        self.theta += self.optimizer.step(-gradient + self.config.weight_decay * self.theta)
        self.sigma = max(self.config.sigma_min, self.sigma * self.config.sigma_decay)
        return float(np.linalg.norm(gradient))

    def state(self) -> tuple[dict, dict]:
        """(arrays, JSON-able values) that restore this optimiser exactly."""
        arrays = dict(theta=self.theta, obs_sum=self.obs_stat.sum, obs_sumsq=self.obs_stat.sumsq)
        values = dict(obs_count=self.obs_stat.count, rng=self.rng.bit_generator.state, sigma=self.sigma,
                      sigma_setting=self.config.sigma)
        if isinstance(self.optimizer, Adam):
            arrays.update(adam_m=self.optimizer.m, adam_v=self.optimizer.v)
            values.update(adam_t=self.optimizer.t)
        else:
            arrays.update(clipup_velocity=self.optimizer.velocity)
        return arrays, values

    def restore(self, arrays: dict, values: dict) -> None:
        if arrays["theta"].shape != self.theta.shape:
            raise ValueError(f"the checkpoint holds {arrays['theta'].size} parameters, this policy has "
                             f"{self.theta.size}")
        self.theta = arrays["theta"].astype(np.float32)
        if isinstance(self.optimizer, Adam):
            self.optimizer.m, self.optimizer.v = arrays["adam_m"], arrays["adam_v"]
            self.optimizer.t = int(values["adam_t"])
        else:
            self.optimizer.velocity = arrays["clipup_velocity"]
        self.sigma = float(values.get("sigma", self.config.sigma))  # checkpoints from before the schedule
        # resumed with another algo.sigma (PBT's explore): the schedule goes on from the same place, rescaled
        self.sigma *= self.config.sigma / float(values.get("sigma_setting", self.config.sigma))
        self.obs_stat.sum, self.obs_stat.sumsq = arrays["obs_sum"], arrays["obs_sumsq"]
        self.obs_stat.count = values["obs_count"]
        self.rng.bit_generator.state = values["rng"]


STATE_ARRAYS = ("theta", "obs_sum", "obs_sumsq")
STATE_VALUES = ("obs_count", "rng")


def check_state(arrays: dict, values: dict, size: int, obs_shape, optimizer: str = "adam") -> None:
    """Raise DamagedFile unless ``(arrays, values)`` hold an ``ES.state()`` of ``size`` parameters."""
    optimizer_arrays, optimizer_values = OPTIMIZER_STATE[optimizer]
    require(arrays, values, STATE_ARRAYS + optimizer_arrays, STATE_VALUES + optimizer_values)
    shapes = dict(theta=(size,), obs_sum=tuple(obs_shape), obs_sumsq=tuple(obs_shape),
                  **{name: (size,) for name in optimizer_arrays})
    wrong = [f"{name} of shape {arrays[name].shape}, not {shape}" for name, shape in shapes.items()
             if arrays[name].shape != shape]
    if wrong:
        raise DamagedFile(f"it holds {', '.join(wrong)}")


def check_checkpoint(arrays: dict, values: dict, size: int, obs_shape, optimizer: str = "adam",
                     adaptive_cap: bool = False) -> None:
    """Raise DamagedFile unless a checkpoint holds all that ``train`` resumes from."""
    check_state(arrays, values, size, obs_shape, optimizer)
    require(arrays, values, value_names=("episode_cap",) if adaptive_cap else ())


# --- the training loop ----------------------------------------------------------

def eval_episode_steps(algo, env_cfg) -> int | None:
    """The cap on an unperturbed policy's episodes: algo.episode_steps when it is fixed; with an
    adaptive cap, the env's own limit (as OpenAI's ES, whose eval episodes ignore the cutoff)."""
    if algo.get("episode_steps_growth", 1.0) > 1:
        return env_cfg.get("max_episode_steps")
    return algo.get("episode_steps") or env_cfg.get("max_episode_steps")


def train(cfg, run, on_iteration=None) -> dict:
    """Run ES as ``cfg`` (the composed app config) says, writing into ``run``
    (a ``fiberrl.run.RunDirectory``).  ``on_iteration(iteration, pool)`` is
    called after every update.  Returns the final parameters and a summary."""
    noise = NoiseTable(cfg.algo.noise_seed, cfg.algo.noise_size, hold=True)
    try:
        return _train(cfg, run, noise, on_iteration)
    finally:
        # on every way out, a failed resume too: this host's copy (made by this run or left by a
        # crashed one) is 1 GB of memory, removed once no other run here holds it
        noise.release()


def _train(cfg, run, noise: NoiseTable, on_iteration) -> dict:
    algo = cfg.algo
    env = make_env(cfg.env.id, dict(cfg.env.kwargs), cfg.env.max_episode_steps)
    policy = make_policy(algo.policy, env.observation_space, env.action_space, list(algo.hidden))
    init_rng = np.random.Generator(np.random.PCG64([cfg.seed, 1]))
    es = ES(policy.initial_params(init_rng), algo, noise, seed=cfg.seed, obs_shape=env.observation_space.shape)
    env_limit = env.spec.max_episode_steps
    env.close()
    adaptive = algo.episode_steps_growth > 1
    episode_cap = algo.episode_steps if adaptive else None

    loop = TrainingLoop(run, algo, algo.iterations, until_timesteps=cfg.until_timesteps)
    checkpoint = loop.resume(lambda arrays, values: check_checkpoint(arrays, values, es.theta.size,
                                                                     es.obs_stat.sum.shape, algo.optimizer, adaptive))
    if checkpoint is not None:
        es.restore(*checkpoint)
        if adaptive:
            episode_cap = int(checkpoint[1]["episode_cap"])

    def budget_spent() -> bool:
        return algo.total_timesteps is not None and loop.timesteps >= algo.total_timesteps
    if budget_spent():  # a resumed run whose budget was spent: no workers to start
        run.console.print(f"{run.path} already ran its algo.total_timesteps={algo.total_timesteps}")
        return loop.summary(theta=es.theta)

    spec = EvaluatorSpec(cfg.env.id, dict(cfg.env.kwargs), eval_episode_steps(algo, cfg.env), algo.policy,
                         list(algo.hidden), noise.seed, noise.size, algo.obs_clip, algo.episodes_per_eval,
                         algo.reward_clip)
    server = ParamServer()
    server.start()
    pool = None
    try:
        store = server.ParamStore()
        pool = mp.Pool(cfg.workers, initializer=init_worker, initargs=(spec, store), backup_tasks=algo.backup_tasks)
        for iteration in loop:
            t0 = time.perf_counter()
            asked = es.ask()
            eval_seeds = es.rng.integers(0, 2**31 - 1, size=algo.eval_episodes)
            store.publish(iteration, (es.theta, es.obs_stat.mean, es.obs_stat.std, es.sigma))
            tasks = [PairTask(iteration, int(i), int(s), bool(r), episode_cap)
                     for i, s, r in zip(asked.noise_index, asked.env_seed, asked.record_obs, strict=True)]
            tasks += [EvalTask(iteration, int(s)) for s in eval_seeds]
            t_master = time.perf_counter() - t0

            results = pool.map(evaluate, tasks, chunksize=algo.chunksize)

            t1 = time.perf_counter()
            pairs, evals = results[:algo.population], results[algo.population:]
            returns_pos = np.array([r.return_pos for r in pairs])
            returns_neg = np.array([r.return_neg for r in pairs])
            for pair in pairs:
                if pair.obs_sums is not None:
                    es.obs_stat.increment(*pair.obs_sums)
            evaluated = dict(theta=es.theta.copy(), obs_mean=es.obs_stat.mean, obs_std=es.obs_stat.std)
            grad_norm = es.tell(asked, returns_pos, returns_neg)
            capped_share = sum(r.at_cap for r in pairs) / (2 * algo.population * algo.episodes_per_eval)
            cap_used = episode_cap
            if adaptive and capped_share >= algo.episode_steps_grow_at:
                grown = max(episode_cap + 1, int(episode_cap * algo.episode_steps_growth))
                episode_cap = grown if env_limit is None else min(grown, env_limit)
            t_master += time.perf_counter() - t1

            loop.timesteps += int(sum(r.steps for r in pairs))
            both = np.concatenate([returns_pos, returns_neg])
            eval_reward = float(np.mean([r.reward for r in evals])) if evals else None
            metrics = dict(reward_mean=float(both.mean()), reward_max=float(both.max()), reward_min=float(both.min()),
                           master_s=t_master, grad_norm=grad_norm, theta_norm=float(np.linalg.norm(es.theta)),
                           episodes=2 * algo.population * algo.episodes_per_eval)
            if adaptive:
                metrics.update(episode_cap=cap_used, at_cap_share=capped_share)
            best = (evaluated, dict(iteration=iteration, eval_reward=eval_reward, policy=algo.policy,
                                    hidden=list(algo.hidden), obs_clip=algo.obs_clip))
            if loop.end(iteration, metrics, eval_reward=eval_reward, best=lambda: best,
                        state=lambda: checkpoint_state(es, episode_cap), stop=budget_spent(),
                        on_iteration=on_iteration and (lambda: on_iteration(iteration, pool))):
                break
    finally:
        if pool is not None:
            pool.terminate()
        server.shutdown()
    return loop.summary(theta=es.theta)


def checkpoint_state(es: ES, episode_cap: int | None) -> tuple[dict, dict]:
    arrays, values = es.state()
    return arrays, dict(values, episode_cap=episode_cap)


# --- for fiberrl.evaluate ------------------------------------------------------------

def load_policy(config: dict, arrays: dict, values: dict) -> LoadedPolicy:
    """The policy in best_policy.npz (parameters, the normaliser they were evaluated with, and the
    policy's kind) or in a checkpoint (parameters, the normaliser's sums; the kind from ``config``)."""
    best = "obs_mean" in arrays
    needed = ("theta", "obs_mean", "obs_std") if best else ("theta", "obs_sum", "obs_sumsq")
    missing = [k for k in needed if k not in arrays] + ([] if best or "obs_count" in values else ["obs_count"])
    if missing:
        raise ValueError(f"it holds no {', '.join(missing)}: not a policy this tool can run")
    if best:
        obs_mean, obs_std = arrays["obs_mean"], arrays["obs_std"]
    else:
        stat = RunningStat.from_sums(arrays["obs_sum"], arrays["obs_sumsq"], values["obs_count"])
        obs_mean, obs_std = stat.mean, stat.std
    algo, env_cfg = config["algo"], config["env"]
    # best_policy.npz records the policy it was saved with; a checkpoint relies on the config
    obs_clip = float(values.get("obs_clip", algo.get("obs_clip", 5.0)))
    env = make_env(env_cfg["id"], dict(env_cfg.get("kwargs") or {}), eval_episode_steps(algo, env_cfg))
    try:
        policy = make_policy(values.get("policy", algo.get("policy", "mlp")), env.observation_space,
                             env.action_space, values.get("hidden", algo.get("hidden", [64, 64])))
        episode_steps = env.spec.max_episode_steps  # the cap its evals ran to
    finally:
        env.close()
    policy.set_params(arrays["theta"])

    def episode(env, seed: int, on_step=None) -> tuple[float, int]:
        total, steps, _ = run_episode(env, policy, obs_mean, obs_std, obs_clip, seed, on_step=on_step)
        return total, steps
    return LoadedPolicy(policy, episode, obs_mean, obs_std, obs_clip, episode_steps)


ALGORITHM = Algorithm(
    name="es", config=Config, check_settings=check_settings, train=train, load_policy=load_policy,
    worker_modules=("fiberrl.algos.es_workers",),
    resume_may_change=frozenset({"iterations", "total_timesteps", "checkpoint_every", "stop_reward", "chunksize"}),
    # Adam's (or ClipUp's) step size is read from the settings, not the checkpoint; a new sigma rescales the
    # schedule's current one (ES.restore)
    tunable=frozenset({"sigma", "learning_rate"}),
    mutations={"sigma": "tag(log, interval(0.002, 0.5))", "learning_rate": "tag(log, interval(1e-4, 0.2))"},
    ran_before=lambda cfg: {"noise_seed": cfg.seed},
    metrics=frozenset({"reward_mean", "reward_max", "reward_min", "master_s", "grad_norm", "theta_norm",
                       "episodes", "episode_cap", "at_cap_share"}))
