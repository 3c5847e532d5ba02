"""Job start latency and Pool framework overhead on every backend this
machine has, against the local backend in the same run.

- start: one Process from ``start()`` until its target has sent a message
  back (median of --starts), and --burst processes started at once until
  the last has reported;
- overhead: the Fiber paper's test (as ``bench_pool_overhead.py``): 5 pool
  workers, waves of 5 ``apply_async`` of a 1 ms (and 10 ms) sleep, each wave
  awaited, 1 s of ideal work; elapsed / ideal.

The cluster backends are set up as the tests set them up (the helper
modules in tests/helpers/: a locally built image for docker, the stand-in API
server for kubernetes, the single-node Slurm of .ci/start-slurm).

    python experiments/micro/bench_backends.py [--backends local,docker,kubernetes,slurm]
"""
import argparse
import importlib
import os
import statistics
import sys
import time

import fiberrl.runtime as mp
from fiberrl.runtime import config as runtime_config

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests")
WORKERS = 5


def report(q):
    q.put(time.time())


def sleep_task(seconds):
    time.sleep(seconds)
    return seconds


def settings_for(name: str):
    if name == "local":
        return dict(backend="local")
    sys.path.insert(0, TESTS)
    helper = importlib.import_module(f"helpers.{name}_backend")
    reason = helper.available()
    if reason:
        print(f"{name}: cannot run here ({reason}), skipped")
        return None
    return helper.settings()


def start_latency(starts: int, burst: int) -> tuple[float, float]:
    q = mp.Queue()
    singles = []
    for _ in range(starts):
        begin = time.perf_counter()
        p = mp.Process(target=report, args=(q,))
        p.start()
        q.get(timeout=300)
        singles.append(time.perf_counter() - begin)
        p.join(60)
    begin = time.perf_counter()
    processes = [mp.Process(target=report, args=(q,)) for _ in range(burst)]
    for p in processes:
        p.start()
    for _ in processes:
        q.get(timeout=600)
    burst_s = time.perf_counter() - begin
    for p in processes:
        p.join(60)
    return statistics.median(singles), burst_s


def overhead(duration: float) -> float:
    with mp.Pool(WORKERS) as pool:
        while pool.statistics().workers_alive < WORKERS:
            time.sleep(0.05)
        for _ in range(3):
            [r.get() for r in [pool.apply_async(sleep_task, (0.0,)) for _ in range(WORKERS)]]
        waves = max(1, round(1.0 / duration))
        begin = time.perf_counter()
        for _ in range(waves):
            for r in [pool.apply_async(sleep_task, (duration,)) for _ in range(WORKERS)]:
                r.get()
        return (time.perf_counter() - begin) / (waves * duration)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="local,docker,kubernetes,slurm")
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--durations", default="0.01,0.001")
    args = parser.parse_args()
    durations = [float(d) for d in args.durations.split(",")]

    rows = {}
    for name in args.backends.split(","):
        settings = settings_for(name)
        if settings is None:
            continue
        mp.configure(**settings)
        try:
            single, burst = start_latency(args.starts, args.burst)
            ratios = [overhead(d) for d in durations]
        finally:
            runtime_config.reset()
        rows[name] = (single, burst, ratios)
        tasks = "   ".join(f"{d * 1000:g} ms tasks {r:.3f}x ideal" for d, r in zip(durations, ratios, strict=True))
        print(f"{name:<11} start {single * 1000:7.0f} ms   {args.burst} at once {burst:6.2f} s   {tasks}", flush=True)

    if "local" in rows:
        base = rows["local"]
        print("\nagainst local (same run):")
        for name, (single, burst, ratios) in rows.items():
            if name != "local":
                print(f"{name:<11} start x{single / base[0]:.1f}   burst x{burst / base[1]:.1f}   "
                      + "   ".join(f"{d * 1000:g} ms overhead x{r / b:.2f}"
                                   for d, r, b in zip(durations, ratios, base[2], strict=True)))


if __name__ == "__main__":
    main()
