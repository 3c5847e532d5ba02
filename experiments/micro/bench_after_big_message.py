"""Small tasks before and after the pool's processes once pickled a big message, real local workers.

A thread's pickler is reused from message to message (``net.wire``); the C pickler's memo table
never shrinks, and clearing it costs its largest size.  This times ``--tasks`` unchunked tasks
(``str(i)``) on a pool of ``--workers``, then lets the workers return lists of 60,000 strings and
the master send chunks of 50,000 strings, then times the same small tasks again: the ratio
after/before is what those big messages cost every later one (1.0: nothing).

    python experiments/micro/bench_after_big_message.py [--tasks 20000] [--workers 2] [--rounds 3]
"""
import argparse
import statistics
import time

import fiberrl.runtime as mp


def words(n):
    return [str(i) for i in range(n)]


def small(x):
    return str(x)


def timed(pool, tasks: int) -> tuple[float, float]:
    """Wall and master CPU seconds of ``tasks`` unchunked small tasks."""
    wall, cpu = time.perf_counter(), time.process_time()
    assert pool.map(small, range(tasks), chunksize=1)[-1] == str(tasks - 1)
    return time.perf_counter() - wall, time.process_time() - cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ratios = []
    for _ in range(args.rounds):
        with mp.Pool(args.workers) as pool:
            pool.map(small, range(100))
            before = timed(pool, args.tasks)
            pool.map(words, [60_000] * 4 * args.workers, chunksize=1)  # big results, in the workers
            pool.map(small, [str(i) for i in range(100_000 * 4 * args.workers)])  # big chunks, in the master
            after = timed(pool, args.tasks)
        ratios.append(after[0] / before[0])
        print(f"{args.tasks} small tasks: {before[0]:.2f} s (master CPU {before[1]:.2f} s) before the big messages, "
              f"{after[0]:.2f} s (master CPU {after[1]:.2f} s) after: {ratios[-1]:.2f}x", flush=True)
    print(f"bench_after_big_message: after/before median {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
