"""What one all-reduce costs a Ring member, by the number of members and of floats: the price PPO's learners
(``algo.learners=K``) pay at every minibatch step for their averaged gradient, through gloo and, for members of
one host, through shared memory (``HostSum``, what the learners use there).

    python experiments/micro/bench_ring_allreduce.py [--members 2 4] [--floats 1 11000 1700000] [--repeat 50]

Each member sets its torch threads as PPO's learners do (its share of the host's cores) and times ``repeat``
sums of each size through each, after 5 to warm up; the figure is rank 0's median in ms.  11,000 floats are
BipedalWalker's MLPs, 1.7M the Atari CNN's.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

from fiberrl.runtime import Ring
from fiberrl.runtime.primitives.host_sum import HostSum


def join(node) -> None:
    global _node
    _node = node
    node.init_process_group("gloo")


def timings(floats: list[int], repeat: int, rank: int, size: int) -> dict[tuple[str, int], float]:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // size))
    shared = HostSum.join(_node.store, rank, size, max(floats) * 4, "bench")
    ways = {"gloo": dist.all_reduce, **({"shared memory": shared.all_reduce} if shared else {})}
    medians = {}
    for n in floats:
        for way, reduce in ways.items():
            tensor = torch.zeros(n)  # zeros stay finite however many times they are summed
            for _ in range(5):
                reduce(tensor)
            seconds = []
            for _ in range(repeat):
                began = time.perf_counter()
                reduce(tensor)
                seconds.append(time.perf_counter() - began)
            medians[way, n] = statistics.median(seconds) * 1e3
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--floats", type=int, nargs="+", default=[1, 11_000, 1_700_000])
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    print(f"all-reduce, {os.cpu_count()} cores, median of {args.repeat} (ms, rank 0)")
    print(f"{'members':<10}{'through':<16}" + "".join(f"{n:>14,} floats" for n in args.floats))
    for members in args.members:
        result = Ring(members, functools.partial(timings, args.floats, args.repeat), join).run()[0]
        for way in dict.fromkeys(way for way, _ in result):
            print(f"{members:<10}{way:<16}" + "".join(f"{result[way, n]:>21.3f}" for n in args.floats), flush=True)


if __name__ == "__main__":
    main()
