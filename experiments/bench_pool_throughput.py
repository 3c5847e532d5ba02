"""Throughput of tiny tasks: ``map`` of 10^6 trivial calls, tasks per second
for fiberrl and multiprocessing.Pool (spawn and fork) with the same chunksize
rule (about four chunks per worker), measured in the same run.

    python experiments/bench_pool_throughput.py [--tasks 1000000] [--workers 2]
"""
import argparse
import multiprocessing
import time


def trivial(x):
    return x + 1


def measure(pool, tasks: int) -> float:
    pool.map(trivial, range(100))  # warm up
    start = time.perf_counter()
    out = pool.map(trivial, range(tasks))
    elapsed = time.perf_counter() - start
    assert out[-1] == tasks
    return tasks / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=multiprocessing.cpu_count())
    args = parser.parse_args()
    import fiberrl.runtime as frl

    rates = {}
    for name, make in [("fiberrl", lambda: frl.Pool(args.workers)),
                       ("multiprocessing (spawn)", lambda: multiprocessing.get_context("spawn").Pool(args.workers)),
                       ("multiprocessing (fork)", lambda: multiprocessing.get_context("fork").Pool(args.workers))]:
        pool = make()
        try:
            rates[name] = measure(pool, args.tasks)
        finally:
            pool.terminate()
        print(f"{name:26s} {rates[name]:12,.0f} tasks/s", flush=True)
    for name in rates:
        if name != "fiberrl":
            print(f"fiberrl / {name}: {rates['fiberrl'] / rates[name]:.2f}x")


if __name__ == "__main__":
    main()
