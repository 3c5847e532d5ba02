"""ES scaling after the Fiber paper: how an ES iteration's time falls as the
workers grow, with population 2048 (4096 episodes per iteration).

(a) real environment: BipedalWalker-v3 with short episodes (algo.episode_steps,
    100 by default, so an iteration is affordable) on 16 to 1024 workers.  Reports
    the iteration time (mean and median), the master's time per iteration (the
    time it spends outside pool.map: drawing the perturbations, publishing the
    parameters, ranking the returns and the Adam update; the Amdahl bottleneck)
    env steps per second, the master's CPU time per task (all its threads, pool
    phase included) and the peak memory of the run.  This machine has 2 cores, so past 2 workers the
    real part shows the cost of many workers contending for the same cores, not
    a speed-up.

(b) simulated evaluations: the same ES (same policy size as BipedalWalker's:
    24 observations, 4 actions) on "FixedCost-v0", an env registered by this
    module whose one-step episodes sleep ``cost`` seconds (env.kwargs.cost) and
    return a reward that depends on the action, on 16 to 1024 workers.  As the
    episodes sleep, the iteration time can be held against an ideal:

        ideal = ceil(population / workers) * 2 * cost

    that is, each worker runs its share of whole mirrored pairs (one pair = two
    episodes of ``cost`` s), perfectly balanced, with no master time, no
    messaging and no CPU time in the workers.  The runs take no eval episodes
    (algo.eval_episodes=0), so a pool map holds exactly ``population`` pairs.
    Reported: iteration / ideal, the pool phase (iteration - master time) /
    ideal, and the master time.  The workers' own CPU work (perturbing the
    policy, env reset and step, the forward pass: under a millisecond a pair)
    is not in the ideal; with hundreds of workers on 2 cores it adds up.
    Peer lines: a multiprocessing.Pool (spawn) of the same size maps, with the
    same default chunksize, (1) the same ES tasks (fiberrl.algos.es_workers.evaluate on
    FixedCost-v0, with the parameters held by each worker instead of fetched
    from the parameter server) and (2) as many tasks that only sleep 2 * cost.
    The peer has no master work: compare it with the pool phase.

(c) the floor under (a): the same number of BipedalWalker pairs shared by as
    many bare forked processes as (a) has workers (a fixed linear policy, no
    framework, niced as the pool's workers are).  Its time against 16
    processes is what many processes cost the kernel and the caches on these
    cores, whatever runs them; (a)'s ratio above it is the framework's.

A local pool whose workers outnumber the cores runs a CPU-bound function, as
ES's episodes are, on at most two workers a core (the runtime setting
local_cpu_bound_per_core): from its second iteration part (a) measures that.
FIBERRL_LOCAL_CPU_BOUND_PER_CORE=0 measures every worker running at once.

In parts (a) and (b) the first iteration also waits for the workers to start, so it is
left out; after it each run maps short sleeps until every worker has served
one (so that no worker is still starting, on these 2 cores, in the iterations
measured).  "start-up s" is the first iteration plus that wait.

Every worker is a Python process.  Before the runs the benchmark measures one
ES worker's memory (RSS, PSS and private, from /proc) and drops the worker
counts that would not fit in the memory available now, printing what it
skipped and why; the app's own check (fiberrl.app.check_workers, 16 MiB per
local worker against free memory) may refuse more, and those are skipped too.

    python experiments/micro/bench_es_scaling.py                # the full run
    python experiments/micro/bench_es_scaling.py --quick        # a smoke test (about a minute)

Flags:
    --iterations N       ES iterations per worker count (default 50)
    --real-iterations N  iterations of part (a) (default: --iterations)
    --population N       perturbations per iteration (default 2048)
    --workers LIST       worker counts of part (a) (default 16,64,256,1024)
    --sim-workers LIST   worker counts of part (b) (default 16,64,256,1024)
    --parts LIST         real,sim,bare (default all three)
    --episode-steps N    step cap of the real episodes (default 100)
    --cost S             seconds one simulated episode takes (default 0.05)
    --peer-iterations N  multiprocessing.Pool iterations per worker count (default 5; 0: no peer)
    --noise-size N       floats in the noise table (default 50,000,000: 200 MB)
    --worker-mib MIB     memory to plan per worker instead of the measured private; also
                         replaces the app's 16 MiB figure (fiberrl.app.LOCAL_WORKER_BYTES)
    --reserve-gib G      memory to leave free (default 2)
    --out DIR            where the runs go (default experiments/results/es_scaling/<timestamp>)
    --quick              population 64, 3 iterations, workers 4,8, cost 0.02 s, 2 peer iterations
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # so that workers (which get this sys.path) import this module by name
    sys.path.insert(0, str(REPO))

from fiberrl.app_config import compose  # noqa: E402 -- needs the path above

# The plain id, registered when this module is imported.  The parent runs this file; each worker imports it
# again as its __main__ (spawn's preparation) before it builds its env, so the id is registered there too.
# (The "module:Id" form would import it by name, but fiberrl.rl.envs.check_env_id rejects such ids: it asks
# gymnasium.spec(), which, unlike gymnasium.make(), does not import the module.)
ENV_NAME = "FixedCost-v0"
OBS_SIZE, ACTION_SIZE = 24, 4  # BipedalWalker-v3's, so the policy and the master's update are the same size
TARGET = np.linspace(-0.5, 0.5, ACTION_SIZE, dtype=np.float32)


class FixedCostEnv(gym.Env):
    """Episodes of one step that sleep ``cost`` seconds; the reward is minus the
    squared distance of the action from a fixed target, so ES has returns to rank."""

    def __init__(self, cost: float = 0.05):
        self.cost = float(cost)
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (OBS_SIZE,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_SIZE,), np.float32)
        self._obs = np.zeros(OBS_SIZE, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._obs = np.clip(self.np_random.standard_normal(OBS_SIZE), -10, 10).astype(np.float32)
        return self._obs.copy(), {}

    def step(self, action):
        time.sleep(self.cost)
        reward = -float(np.sum(np.square(np.asarray(action, np.float32) - TARGET)))
        return self._obs.copy(), reward, True, False, {}


if ENV_NAME not in gym.registry:
    gym.register(id=ENV_NAME, entry_point="experiments.micro.bench_es_scaling:FixedCostEnv")


# --- run helpers ---------------------------------------------------------------

def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def worker_memory(_):
    """This process's memory in bytes: (RSS, PSS, private), from /proc."""
    fields = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[0].endswith(":"):
                fields[parts[0][:-1]] = int(parts[1]) * 1024
    private = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return fields.get("Rss", 0), fields.get("Pss", 0), private


def measure_worker(base: list[str], out: Path) -> tuple[int, int, int]:
    """Memory of one ES worker on BipedalWalker (the heavier of the two parts), after one iteration."""
    from fiberrl.app import run

    found = []

    def probe(iteration, pool):
        found.extend(pool.map(worker_memory, [0]))

    cfg = compose(base + ["env=bipedal_walker", "workers=1", "algo.population=4", "algo.iterations=1",
                          "algo.episode_steps=20", "algo.eval_episodes=1"])
    run(cfg, out / "memory_probe", on_iteration=probe)
    return found[0]


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def fit_workers(counts: list[int], per_worker: int, budget: int) -> tuple[list[int], list[str]]:
    """The counts whose workers fit in ``budget`` bytes, and a line for each one left out."""
    from fiberrl.app import LOCAL_WORKER_BYTES
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    kept, skipped = [], []
    for n in counts:
        if n * per_worker > budget:
            skipped.append(f"{n} workers skipped: they need about {n * per_worker / 2**30:.1f} GiB "
                           f"({per_worker / 2**20:.0f} MiB each) and {budget / 2**30:.1f} GiB can be used")
        elif n * LOCAL_WORKER_BYTES > free:
            skipped.append(f"{n} workers skipped: the app refuses them (fiberrl.app.check_workers counts "
                           f"{LOCAL_WORKER_BYTES / 2**20:.0f} MiB per local worker: "
                           f"{n * LOCAL_WORKER_BYTES / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free); "
                           f"--worker-mib sets that figure")
        else:
            kept.append(n)
    return kept, skipped


def sleep_pid(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def wait_all_serving(pool, workers: int, timeout: float = 600.0) -> tuple[int, float]:
    """Map short sleeps until every one of ``workers`` has run one (so each has started and run its
    initializer); returns (workers seen, seconds waited)."""
    start, seen = time.perf_counter(), set()
    while len(seen) < workers and time.perf_counter() - start < timeout:
        seen.update(pool.map(sleep_pid, [0.5] * workers, chunksize=1))
    return len(seen), time.perf_counter() - start


class MemoryPeak:
    """The machine's memory in use (MemTotal - MemAvailable) above what it was at the start,
    sampled every half second from a thread: the run's peak, workers and servers included."""

    def __init__(self):
        import threading
        self.base = self.peak = self._in_use()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def _in_use() -> int:
        fields = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) * 1024
        return fields["MemTotal"] - fields["MemAvailable"]

    def _sample(self):
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, self._in_use())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - self.base


def es_run(overrides: list[str], run_dir: Path, workers: int) -> tuple[list[dict], dict]:
    """Run ES; returns its metrics and what was measured around it: the seconds waited after the
    first iteration for every worker to serve, the master's CPU seconds in each iteration and the
    run's peak memory.

    A pool's workers start while its first iterations run; on 2 cores, 256 of them starting take
    tens of seconds of CPU, which would land in the iterations measured.  So after the first
    iteration (which is not counted) the run waits until every worker has served a task."""
    from fiberrl.app import run
    measured = dict(waited=0.0, master_cpu=[])
    last = [time.process_time()]

    def settle(iteration, pool):
        now = time.process_time()
        measured["master_cpu"].append(now - last[0])
        if iteration == 0:
            seen, measured["waited"] = wait_all_serving(pool, workers)
            if seen < workers:
                print(f"only {seen} of {workers} workers served a task within {measured['waited']:.0f} s", flush=True)
        last[0] = time.process_time()

    cfg = compose(overrides)
    memory = MemoryPeak()
    try:
        run(cfg, run_dir, on_iteration=settle)
    finally:
        measured["peak_bytes"] = memory.stop()
    return read_metrics(run_dir), measured


def after_first(metrics: list[dict], key: str) -> list[float]:
    values = [m[key] for m in metrics[1:]] or [m[key] for m in metrics]
    return values


# --- the multiprocessing peer ----------------------------------------------------

def sleep_pair(index, cost):
    time.sleep(cost)  # the +eps episode
    time.sleep(cost)  # the -eps episode
    return index, 0.0, 0.0, 2


class FixedParams:
    """Stands in for the parameter server in the peer's workers: one set of parameters, any iteration."""

    def __init__(self, params: tuple):
        self.params = params

    def connect(self) -> None:
        """Nothing to connect to (a worker calls it as it starts)."""

    def fetch(self, version: int) -> tuple:
        return self.params


def mp_peer(workers: int, population: int, cost: float, iterations: int, noise_size: int) -> dict:
    """Median iteration times of two maps of ``population`` tasks on a multiprocessing.Pool (spawn):
    "sleep", tasks that only sleep 2 * cost; "es", the ES workers' own task (fiberrl.algos.es_workers.evaluate: the
    policy perturbed from the noise table, two FixedCost-v0 episodes), with the parameters held by each
    worker instead of fetched from a parameter server.  Also the pool's start-up time."""
    import functools

    from fiberrl.algos.es import Config
    from fiberrl.algos.es_workers import EvaluatorSpec, PairTask, evaluate, init_worker
    from fiberrl.rl.noise import NoiseTable
    from fiberrl.rl.policies import make_policy

    algo = Config()
    env = FixedCostEnv(cost)
    policy = make_policy(algo.policy, env.observation_space, env.action_space, algo.hidden)
    rng = np.random.Generator(np.random.PCG64(0))
    params = (policy.initial_params(rng), np.zeros(OBS_SIZE, np.float32), np.ones(OBS_SIZE, np.float32), algo.sigma)
    spec = EvaluatorSpec(ENV_NAME, {"cost": cost}, None, algo.policy, list(algo.hidden), 0, noise_size,
                         algo.obs_clip)
    noise = NoiseTable(0, noise_size)  # made once here, not by the first worker to need it
    sleep_task = functools.partial(sleep_pair, cost=cost)
    start = time.perf_counter()
    pool = multiprocessing.get_context("spawn").Pool(workers, initializer=init_worker,
                                                     initargs=(spec, FixedParams(params)))
    times = dict(sleep=[], es=[])
    try:
        wait_all_serving(pool, workers)
        startup = time.perf_counter() - start
        for iteration in range(iterations):
            t0 = time.perf_counter()
            results = pool.map(sleep_task, range(population))
            times["sleep"].append(time.perf_counter() - t0)
            assert len(results) == population
            tasks = [PairTask(iteration, int(i), int(seed), False)
                     for i, seed in zip(noise.sample_index(rng, policy.num_params, population),
                                        rng.integers(0, 2**31 - 1, size=population), strict=True)]
            t0 = time.perf_counter()
            results = pool.map(evaluate, tasks)
            times["es"].append(time.perf_counter() - t0)
            assert len(results) == population
    finally:
        pool.terminate()
        pool.join()
        if noise.created:
            noise.unlink()
    return dict(peer_sleep=statistics.median(times["sleep"]), peer_es=statistics.median(times["es"]),
                peer_startup=startup)


# --- the two parts -----------------------------------------------------------------

def part_real(args, base: list[str], out: Path) -> list[dict]:
    rows = []
    print(f"\n(a) BipedalWalker-v3, population {args.population} ({2 * args.population} episodes of at most "
          f"{args.episode_steps} steps), {args.real_iterations} iterations per worker count", flush=True)
    for workers in args.workers:
        run_dir = out / "real" / f"w{workers}"
        metrics, measured = es_run(base + ["env=bipedal_walker", f"workers={workers}",
                                         f"algo.iterations={args.real_iterations}",
                                         f"algo.episode_steps={args.episode_steps}"], run_dir, workers)
        iteration = after_first(metrics, "iteration_s")
        master = after_first(metrics, "master_s")
        steps = [b["timesteps"] - a["timesteps"] for a, b in zip(metrics, metrics[1:], strict=False)]
        rows.append(dict(workers=workers, iteration_mean=statistics.mean(iteration),
                         iteration_median=statistics.median(iteration), master_mean=statistics.mean(master),
                         master_median=statistics.median(master), first_iteration=metrics[0]["iteration_s"],
                         steps_per_s=sum(steps) / sum(iteration) if steps else metrics[0]["timesteps"] / iteration[0],
                         master_cpu_per_task=statistics.mean(measured["master_cpu"][1:]) / args.population,
                         peak_gib=measured["peak_bytes"] / 2**30,
                         startup=metrics[0]["iteration_s"] + measured["waited"], run_dir=str(run_dir)))
        print(f"{workers} workers: iteration {rows[-1]['iteration_median']:.1f} s (median), "
              f"peak memory {rows[-1]['peak_gib']:.1f} GiB", flush=True)
    print(f"\n(a) BipedalWalker-v3 (episodes capped at {args.episode_steps} steps), population {args.population}: "
          f"iterations after the first")
    print(f"{'workers':>8} {'iter mean s':>12} {'iter median s':>14} {'master s':>9} {'master %':>9} "
          f"{'steps/s':>9} {'master CPU/task':>16} {'peak GiB':>9} {'start-up s':>11}")
    for r in rows:
        print(f"{r['workers']:>8} {r['iteration_mean']:>12.2f} {r['iteration_median']:>14.2f} "
              f"{r['master_mean']:>9.3f} {100 * r['master_mean'] / r['iteration_mean']:>8.1f}% "
              f"{r['steps_per_s']:>9.0f} {1000 * r['master_cpu_per_task']:>13.2f} ms {r['peak_gib']:>9.1f} "
              f"{r['startup']:>11.1f}")
    if rows:
        first = rows[0]
        print("iteration time vs " + f"{first['workers']} workers (the same work; target at most 1.15): " + ", ".join(
            f"{r['workers']}: {r['iteration_median'] / first['iteration_median']:.2f}" for r in rows))
        print(f"(this machine has {os.cpu_count()} cores: more workers than cores cannot make a CPU-bound "
              f"iteration faster; part (b) shows the scaling the framework allows)")
    return rows


def part_sim(args, base: list[str], out: Path) -> list[dict]:
    rows = []
    print(f"\n(b) {ENV_NAME}: population {args.population}, episodes of {args.cost * 1000:.0f} ms, "
          f"{args.iterations} iterations per worker count", flush=True)
    for workers in args.sim_workers:
        run_dir = out / "sim" / f"w{workers}"
        metrics, measured = es_run(base + ["env=gym", f"env.id={ENV_NAME}", f"+env.kwargs.cost={args.cost}",
                                         f"workers={workers}", f"algo.iterations={args.iterations}",
                                         "algo.eval_episodes=0"], run_dir, workers)
        ideal = math.ceil(args.population / workers) * 2 * args.cost
        iteration = after_first(metrics, "iteration_s")
        master = after_first(metrics, "master_s")
        pool_phase = [i - m for i, m in zip(iteration, master, strict=True)]
        row = dict(workers=workers, ideal=ideal, iteration_mean=statistics.mean(iteration),
                   iteration_median=statistics.median(iteration), master_mean=statistics.mean(master),
                   pool_median=statistics.median(pool_phase), first_iteration=metrics[0]["iteration_s"],
                   startup=metrics[0]["iteration_s"] + measured["waited"],
                   master_cpu_per_task=statistics.mean(measured["master_cpu"][1:]) / args.population,
                   peak_gib=measured["peak_bytes"] / 2**30,
                   reward_first=metrics[0]["reward_mean"], reward_last=metrics[-1]["reward_mean"],
                   run_dir=str(run_dir))
        if args.peer_iterations > 0:
            row.update(mp_peer(workers, args.population, args.cost, args.peer_iterations, args.noise_size))
        rows.append(row)
        print(f"{workers} workers: iteration {row['iteration_median']:.3f} s, pool phase {row['pool_median']:.3f} s "
              f"(ideal {ideal:.3f} s)"
              + (f"; multiprocessing: ES tasks {row['peer_es']:.3f} s, sleep tasks {row['peer_sleep']:.3f} s "
                 f"(its start-up {row['peer_startup']:.1f} s)" if "peer_es" in row else ""), flush=True)
    print(f"\n(b) {ENV_NAME}, population {args.population}, {args.cost * 1000:.0f} ms per episode; "
          f"ideal = ceil({args.population} / workers) * 2 * {args.cost} s; iterations after the first (median)")
    print(f"{'workers':>8} {'ideal s':>8} {'iter s':>8} {'iter/ideal':>10} {'master s':>9} {'pool/ideal':>10} "
          f"{'mp ES/ideal':>11} {'mp sleep/ideal':>14} {'start-up s':>11}")
    for r in rows:
        peer = (f"{r['peer_es'] / r['ideal']:>11.2f} {r['peer_sleep'] / r['ideal']:>14.2f}" if "peer_es" in r
                else f"{'-':>11} {'-':>14}")
        print(f"{r['workers']:>8} {r['ideal']:>8.2f} {r['iteration_median']:>8.3f} "
              f"{r['iteration_median'] / r['ideal']:>10.2f} {r['master_mean']:>9.3f} "
              f"{r['pool_median'] / r['ideal']:>10.2f} {peer} {r['startup']:>11.1f}")
    if rows:
        print("iteration / ideal: " + ", ".join(f"{r['workers']}: {r['iteration_median'] / r['ideal']:.2f}"
                                                for r in rows))
        if all("peer_es" in r for r in rows):
            print("fiberrl pool phase / multiprocessing.Pool (spawn) map of the same ES tasks: " + ", ".join(
                f"{r['workers']}: {r['pool_median'] / r['peer_es']:.2f}" for r in rows))
        print(f"{ENV_NAME} mean reward, first -> last iteration (it rises over tens of iterations): " + ", ".join(
            f"{r['workers']}: {r['reward_first']:.2f} -> {r['reward_last']:.2f}" for r in rows))
    return rows


# --- the floor: the same episodes on bare processes ------------------------------------

def bare_worker(counter, pairs: int, episode_steps: int, barrier, started, nice: int) -> None:
    """Take pair numbers from ``counter`` until ``pairs`` are done; run each as two BipedalWalker
    episodes of a fixed linear policy, as an ES worker's task runs two."""
    env = gym.make("BipedalWalker-v3", max_episode_steps=episode_steps)
    weights = np.random.default_rng(0).standard_normal((24, 4)).astype(np.float32) * 0.1
    if nice:
        os.nice(nice)
    barrier.wait()
    with started.get_lock():
        started.value = started.value or time.time()
    while True:
        with counter.get_lock():
            pair = counter.value
            counter.value += 1
        if pair >= pairs:
            return
        for sign in (1, -1):
            obs, _ = env.reset(seed=pair)
            for _ in range(episode_steps):
                obs, _, terminated, truncated, _ = env.step(np.tanh(obs @ (sign * weights)))
                if terminated or truncated:
                    break


def bare_run(processes: int, pairs: int, episode_steps: int) -> float:
    """Seconds ``processes`` forked processes take to share ``pairs`` pairs of episodes, timed from
    the first of them passing the start barrier (all have made their env by then)."""
    from gymnasium.envs.box2d import bipedal_walker  # noqa: F401 -- imported once, before the forks

    from fiberrl.runtime.pool.scheduler import OVERSUBSCRIBED_NICE
    ctx = multiprocessing.get_context("fork")
    counter, barrier, started = ctx.Value("q", 0), ctx.Barrier(processes + 1), ctx.Value("d", 0.0)
    nice = OVERSUBSCRIBED_NICE if processes > os.cpu_count() else 0  # as the pool's workers run
    procs = [ctx.Process(target=bare_worker, args=(counter, pairs, episode_steps, barrier, started, nice))
             for _ in range(processes)]
    for proc in procs:
        proc.start()
    barrier.wait()
    for proc in procs:
        proc.join()
    return time.time() - started.value


def part_bare(args) -> list[dict]:
    """What many processes cost the kernel and the caches whatever runs them: the floor under (a)."""
    print(f"\n(c) bare processes: {args.population} pairs of BipedalWalker episodes (at most {args.episode_steps} "
          f"steps) shared by forked processes, no framework; 2 rounds", flush=True)
    rows = []
    for processes in args.workers:
        times = [bare_run(processes, args.population, args.episode_steps) for _ in range(2)]
        rows.append(dict(processes=processes, seconds=statistics.mean(times)))
        print(f"{processes} processes: {', '.join(f'{t:.1f}' for t in times)} s", flush=True)
    if rows:
        first = rows[0]
        print(f"bare processes, time vs {first['processes']}: " + ", ".join(
            f"{r['processes']}: {r['seconds'] / first['seconds']:.2f}" for r in rows))
    return rows


def parse_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--real-iterations", type=int, default=None)
    parser.add_argument("--population", type=int, default=2048)
    parser.add_argument("--workers", type=parse_list, default=[16, 64, 256, 1024])
    parser.add_argument("--sim-workers", type=parse_list, default=[16, 64, 256, 1024])
    parser.add_argument("--parts", default="real,sim,bare")
    parser.add_argument("--episode-steps", type=int, default=100)
    parser.add_argument("--cost", type=float, default=0.05)
    parser.add_argument("--peer-iterations", type=int, default=5)
    parser.add_argument("--noise-size", type=int, default=50_000_000)
    parser.add_argument("--worker-mib", type=float, default=None)
    parser.add_argument("--reserve-gib", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.population, args.iterations, args.cost, args.peer_iterations = 64, 3, 0.02, 2
        args.workers, args.sim_workers = [4, 8], [4, 8]
        args.episode_steps = min(args.episode_steps, 50)
    if args.real_iterations is None:
        args.real_iterations = args.iterations
    if min(args.iterations, args.real_iterations) < 2:
        parser.error("--iterations and --real-iterations need at least 2 (the first iteration waits for the workers)")
    parts = set(args.parts.split(","))
    out = args.out or REPO / "experiments" / "results" / "es_scaling" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)

    import fiberrl.app
    base = ["algo=es", "seed=0", "tensorboard=false", f"algo.population={args.population}",
            f"algo.noise_size={args.noise_size}", "algo.checkpoint_every=100000"]

    rss, pss, private = measure_worker(base, out)
    print(f"one ES worker (BipedalWalker): RSS {rss / 2**20:.0f} MiB, PSS {pss / 2**20:.0f} MiB, "
          f"private {private / 2**20:.0f} MiB")
    if args.worker_mib is not None:
        per_worker = int(args.worker_mib * 2**20)
        fiberrl.app.LOCAL_WORKER_BYTES = per_worker
        source = "--worker-mib (also the app's per-worker figure)"
    else:
        # a lone worker's PSS holds half the fork server's pages; among many workers each adds
        # what is its own (1024 BipedalWalker workers peaked at 15.7 GiB: ~15 MiB each, 16 private)
        per_worker = private
        source = "measured private"
    budget = available_bytes() - int(args.reserve_gib * 2**30) - args.noise_size * 4
    print(f"planning {per_worker / 2**20:.0f} MiB per worker ({source}); {budget / 2**30:.1f} GiB usable "
          f"(available now, less {args.reserve_gib:g} GiB reserve and the {args.noise_size * 4 / 2**20:.0f} MiB "
          f"noise table)")
    args.workers, skipped_real = fit_workers(args.workers, per_worker, budget)
    args.sim_workers, skipped_sim = fit_workers(args.sim_workers, per_worker, budget)
    for line in skipped_real if "real" in parts else []:
        print(f"(a) {line}")
    for line in skipped_sim if "sim" in parts else []:
        print(f"(b) {line}")

    summary = dict(args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   cores=os.cpu_count(), worker_memory=dict(rss=rss, pss=pss, private=private),
                   skipped=dict(real=skipped_real, sim=skipped_sim))
    if "real" in parts:
        summary["real"] = part_real(args, base, out)
    if "sim" in parts:
        summary["sim"] = part_sim(args, base, out)
    if "bare" in parts:
        summary["bare"] = part_bare(args)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\nruns and summary.json in {out}")


if __name__ == "__main__":
    main()
