"""Many workers: ES-shaped iterations (2048 tasks of 50 ms sleep) on 16 to 256
local workers.  Prints iteration time / ideal (after one iteration not
counted), worker start-up time and the master's CPU time per task for
fiberrl, and multiprocessing.Pool (fork) as the peer in the same run.

    python experiments/micro/bench_pool_many_workers.py [--workers 16,64,256] [--iterations 3]
"""
import argparse
import multiprocessing
import time

TASKS = 2048
DURATION = 0.05


def evaluate(seed):
    time.sleep(DURATION)
    return seed, 1.0, -1.0, 100  # noise index, return+, return-, length


def iterate(pool, iterations: int, workers: int):
    ideal = TASKS * DURATION / workers
    ratios, cpu = [], 0.0
    pool.map(evaluate, range(TASKS), chunksize=1)  # not counted: the machine settles after the start-up
    for _ in range(iterations):
        cpu_start, start = time.process_time(), time.perf_counter()
        results = pool.map(evaluate, range(TASKS), chunksize=1)
        ratios.append((time.perf_counter() - start) / ideal)
        cpu += time.process_time() - cpu_start
        assert len(results) == TASKS
    return sorted(ratios)[len(ratios) // 2], cpu / (iterations * TASKS)


def fiberrl_pool(workers):
    import fiberrl.runtime as frl
    pool = frl.Pool(workers)
    while pool.statistics().workers_alive < workers:
        time.sleep(0.05)
    return pool


def mp_pool(workers):
    pool = multiprocessing.get_context("fork").Pool(workers)
    pool.map(evaluate, range(workers), chunksize=1)  # every worker forked and serving
    return pool


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="16,64,256")
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    print(f"{TASKS} tasks of {DURATION * 1000:.0f} ms per iteration; median of {args.iterations} iterations")
    for workers in [int(w) for w in args.workers.split(",")]:
        row = []
        for name, make in (("fiberrl", fiberrl_pool), ("multiprocessing (fork)", mp_pool)):
            start = time.perf_counter()
            pool = make(workers)
            startup = time.perf_counter() - start
            try:
                ratio, cpu_per_task = iterate(pool, args.iterations, workers)
            finally:
                pool.terminate()
            row.append(ratio)
            print(f"{workers:4d} workers  {name:24s} iteration/ideal {ratio:5.2f}  start-up {startup:6.2f} s  "
                  f"master CPU {cpu_per_task * 1e6:6.0f} us/task", flush=True)
        print(f"{workers:4d} workers  fiberrl / multiprocessing iteration time: {row[0] / row[1]:.2f}", flush=True)


if __name__ == "__main__":
    main()
