"""A map under a storm on the local fork server: with its rest after 5 deaths in 60 s, and without.

``Pool(4)`` maps ``--tasks`` tasks of 5 ms (chunksize 1) while a thread SIGKILLs the fork server
each time it has forked all four workers (polled every 10 ms), which takes the workers with it:
the harshest form of CI's storm test, where a map of 500 ran out its 300 s.  Passes alternate
between the backend as it is and the backend with the rest switched off (the deaths' limit set
out of reach); each pass prints its wall time (or the tasks done when ``--limit`` ran out), the
kills and the worker restarts, and the end the ratio of the medians.

    python experiments/micro/bench_fork_server_storm.py --passes 2
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import threading
import time
from collections import deque

import fiberrl.runtime as mp
from fiberrl.runtime.backends import get_backend, local

WORKERS = 4
DEATHS = local.FORK_SERVER_DEATHS  # the backend's limit, before a pass without the rest moves it


def nap(x):
    time.sleep(0.005)
    return x


def parents() -> dict[int, int]:
    """Each live process's parent."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            except OSError:
                continue
            if state not in "ZX":
                found[int(entry)] = int(ppid)
    return found


def full_fork_servers() -> list[int]:
    """This process's fork servers that have forked all the pool's workers."""
    found = parents()
    servers = []
    for pid, parent in found.items():
        if parent != os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().decode(errors="replace")
        except OSError:
            continue
        if "fork_server" in command and sum(p == pid for p in found.values()) >= WORKERS:
            servers.append(pid)
    return servers


def one_pass(tasks: int, limit: float, rest: bool) -> tuple[float | None, int, int, int]:
    backend = get_backend("local")
    local.FORK_SERVER_DEATHS = DEATHS if rest else 10**9
    backend._fork_server_deaths = deque(maxlen=local.FORK_SERVER_DEATHS)
    backend._fork_server_rests_until = 0.0
    stop, kills = threading.Event(), []

    def storm():
        while not stop.wait(0.01):
            for pid in full_fork_servers():
                try:
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                except ProcessLookupError:
                    pass

    with mp.Pool(WORKERS) as pool:
        pool.map(nap, range(2 * WORKERS), chunksize=1)
        killer = threading.Thread(target=storm)
        killer.start()
        began = time.perf_counter()
        result = pool.map_async(nap, range(tasks), chunksize=1)
        try:
            assert result.get(limit) == list(range(tasks))
            wall = time.perf_counter() - began
        except mp.TimeoutError:
            wall = None
        finally:
            stop.set()
            killer.join()
        stats = pool.statistics()
    return wall, stats.tasks_done - 2 * WORKERS, len(kills), stats.worker_restarts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--limit", type=float, default=60.0, help="seconds a pass's map may take")
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    walls = {True: [], False: []}
    for n in range(args.passes):
        for rest in (True, False):
            wall, done, kills, restarts = one_pass(args.tasks, args.limit, rest)
            walls[rest].append(args.limit if wall is None else wall)
            took = f"{wall:.1f} s" if wall is not None else f"not done in {args.limit:.0f} s ({done} of {args.tasks})"
            print(f"pass {n} {'with the rest' if rest else 'without it  '}: {took}, {kills} fork servers killed, "
                  f"{restarts} worker restarts", flush=True)
    with_rest, without = statistics.median(walls[True]), statistics.median(walls[False])
    print(f"median map: {with_rest:.1f} s with the rest, {without:.1f} s{'+' if without >= args.limit else ''} "
          f"without: {without / with_rest:.1f}x{'+' if without >= args.limit else ''}")


if __name__ == "__main__":
    main()
