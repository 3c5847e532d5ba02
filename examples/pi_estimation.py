"""Estimate pi by Monte Carlo on job-backed processes.

The ordinary multiprocessing program, with only the import changed:
    python examples/pi_estimation.py [--workers N] [--samples S]
"""
import argparse
import random
import time

import fiberrl.runtime as mp


def count_inside(n_samples: int, seed: int, results: mp.Queue) -> None:
    rng = random.Random(seed)
    inside = sum(1 for _ in range(n_samples) if rng.random() ** 2 + rng.random() ** 2 <= 1.0)
    results.put((seed, inside))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=mp.cpu_count())
    parser.add_argument("--samples", type=int, default=2_000_000, help="samples in total")
    args = parser.parse_args()
    if args.workers < 1 or args.samples < args.workers:
        parser.error("need --workers >= 1 and --samples >= --workers")

    start = time.perf_counter()
    results = mp.Queue()
    per_worker = args.samples // args.workers
    workers = [mp.Process(target=count_inside, args=(per_worker, seed, results)) for seed in range(args.workers)]
    for w in workers:
        w.start()
    inside = sum(results.get(timeout=600)[1] for _ in workers)
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise SystemExit(f"{w.name} exited with code {w.exitcode}")
    estimate = 4.0 * inside / (per_worker * args.workers)
    print(f"pi ~= {estimate:.5f} from {per_worker * args.workers:,} samples on {args.workers} "
          f"job-backed processes in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
