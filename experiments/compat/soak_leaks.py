"""Leak soak: items of 1 MiB through a queue from a child, then many tiny pool
tasks, printing this process's RSS, open fds and threads after each round;
they should stay flat.

    python experiments/compat/soak_leaks.py [--rounds 4] [--items 500] [--tasks 50000]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import fiberrl.runtime as mp


def produce(q, n):
    item = np.ones(1 << 17)  # 1 MiB
    for _ in range(n):
        q.put(item)


def square(x):
    return x * x


def usage() -> str:
    with open("/proc/self/statm") as fh:
        rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
    return f"RSS {rss} MiB, {len(os.listdir('/proc/self/fd'))} fds, {len(os.listdir('/proc/self/task'))} threads"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--items", type=int, default=500, help="1 MiB items per queue round")
    parser.add_argument("--tasks", type=int, default=50_000, help="tasks per pool round")
    args = parser.parse_args()
    q = mp.Queue()
    for round_ in range(args.rounds):
        p = mp.Process(target=produce, args=(q, args.items))
        p.start()
        for _ in range(args.items):
            q.get(timeout=60)
        p.join()
        print(f"queue round {round_}: {usage()}", flush=True)
    with mp.Pool(2) as pool:
        expected = sum(x * x for x in range(args.tasks))
        for round_ in range(args.rounds):
            assert sum(pool.map(square, range(args.tasks), chunksize=100)) == expected
            print(f"pool round {round_}: {usage()}", flush=True)


if __name__ == "__main__":
    main()
