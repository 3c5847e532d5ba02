"""Throughput of tiny tasks: ``map`` of 10^6 trivial calls, tasks per second
for fiberrl and multiprocessing.Pool (spawn and fork) with the same chunksize
rule (about four chunks per worker), measured in the same run.  A map takes
a fraction of a second, so the pools are built first and then take turns,
``--rounds`` maps each, and the median is printed: drifts in the load of a
shared machine fall on all of them.

    python experiments/micro/bench_pool_throughput.py [--tasks 1000000] [--workers 2] [--rounds 7]
"""
import argparse
import multiprocessing
import statistics
import time


def trivial(x):
    return x + 1


def measure(pool, tasks: int) -> float:
    start = time.perf_counter()
    out = pool.map(trivial, range(tasks))
    elapsed = time.perf_counter() - start
    assert out[-1] == tasks
    return tasks / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=multiprocessing.cpu_count())
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import fiberrl.runtime as frl

    pools = {"fiberrl": frl.Pool(args.workers),
             "multiprocessing (spawn)": multiprocessing.get_context("spawn").Pool(args.workers),
             "multiprocessing (fork)": multiprocessing.get_context("fork").Pool(args.workers)}
    runs = {name: [] for name in pools}
    try:
        for pool in pools.values():
            pool.map(trivial, range(100))  # every worker up
        for _ in range(args.rounds):
            for name, pool in pools.items():
                runs[name].append(measure(pool, args.tasks))
    finally:
        for pool in pools.values():
            pool.terminate()
    rates = {name: statistics.median(r) for name, r in runs.items()}
    for name, rate in rates.items():
        print(f"{name:26s} {rate:12,.0f} tasks/s (median of {args.rounds}; {min(runs[name]):,.0f} to "
              f"{max(runs[name]):,.0f})")
    for name in rates:
        if name != "fiberrl":
            print(f"fiberrl / {name}: {rates['fiberrl'] / rates[name]:.2f}x")


if __name__ == "__main__":
    main()
