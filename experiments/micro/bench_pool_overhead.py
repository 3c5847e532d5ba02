"""Framework overhead after the Fiber paper: 5 workers, tasks of 1 s, 100 ms,
10 ms and 1 ms, in waves of 5 ``apply_async`` each awaited, 1 s of ideal
work per duration.  Prints elapsed / ideal for fiberrl and, in the same
run, multiprocessing (spawn and fork), bare sockets between forked processes
(the floor of the machine), and Ray's Pool and Dask when they are installed.

    python experiments/micro/bench_pool_overhead.py [--durations 1,0.1,0.01,0.001] [--repeat 3]
"""
import argparse
import importlib.util
import multiprocessing
import os
import pickle
import socket
import statistics
import time

WORKERS = 5


def sleep_task(seconds):
    time.sleep(seconds)
    return seconds


def run_waves(pool, duration: float) -> float:
    waves = max(1, round(1.0 / duration))
    for _ in range(3):  # warm every worker up
        [r.get() for r in [pool.apply_async(sleep_task, (0.0,)) for _ in range(WORKERS)]]
    start = time.perf_counter()
    for _ in range(waves):
        results = [pool.apply_async(sleep_task, (duration,)) for _ in range(WORKERS)]
        for r in results:
            r.get()
    return (time.perf_counter() - start) / (waves * duration)


class BareSockets:
    """The floor of this machine: forked processes, one socketpair each, pickle
    and nothing else (no fault tolerance, no scheduling): what any pool pays
    for processes waking and messages crossing, before its own code."""

    def __init__(self):
        self._socks, self._pids, self._next = [], [], 0
        for _ in range(WORKERS):
            ours, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:
                ours.close()
                while message := theirs.recv(1 << 16):
                    func, args = pickle.loads(message)
                    theirs.send(pickle.dumps(func(*args)))
                os._exit(0)
            theirs.close()
            self._socks.append(ours)
            self._pids.append(pid)

    def apply_async(self, func, args):
        sock = self._socks[self._next % WORKERS]  # a wave's tasks go to different workers
        self._next += 1
        sock.send(pickle.dumps((func, args)))
        return _BareReply(sock)

    def terminate(self):
        for sock in self._socks:
            sock.close()
        for pid in self._pids:
            os.waitpid(pid, 0)


class _BareReply:
    def __init__(self, sock):
        self._sock = sock

    def get(self):
        return pickle.loads(self._sock.recv(1 << 16))


def fiberrl_pool():
    import fiberrl.runtime as frl
    pool = frl.Pool(WORKERS)
    while pool.statistics().workers_alive < WORKERS:
        time.sleep(0.05)
    return pool


def peers():
    yield "fiberrl", fiberrl_pool
    yield "multiprocessing (spawn)", lambda: multiprocessing.get_context("spawn").Pool(WORKERS)
    yield "multiprocessing (fork)", lambda: multiprocessing.get_context("fork").Pool(WORKERS)
    yield "bare sockets (the floor)", BareSockets
    if importlib.util.find_spec("ray"):
        def ray_pool():
            import ray
            from ray.util.multiprocessing import Pool as RayPool
            ray.init(num_cpus=WORKERS, include_dashboard=False, ignore_reinit_error=True)
            return RayPool(WORKERS)
        yield "ray.util.multiprocessing", ray_pool
    else:
        print("ray: not installed, skipped")
    if importlib.util.find_spec("dask") and importlib.util.find_spec("distributed"):
        def dask_pool():
            from distributed import Client, LocalCluster

            class DaskPool:
                def __init__(self):
                    self.client = Client(LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True))

                def apply_async(self, func, args):
                    future = self.client.submit(func, *args, pure=False)
                    future.get = future.result
                    return future

                def terminate(self):
                    self.client.close()
            return DaskPool()
        yield "dask.distributed", dask_pool
    else:
        print("dask.distributed: not installed, skipped")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--durations", default="1,0.1,0.01,0.001")
    parser.add_argument("--repeat", type=int, default=3, help="runs per duration; the median is printed")
    args = parser.parse_args()
    durations = [float(d) for d in args.durations.split(",")]
    table: dict[str, dict[float, float]] = {}
    for name, make in peers():
        pool = make()
        try:
            table[name] = {d: statistics.median(run_waves(pool, d) for _ in range(args.repeat)) for d in durations}
        finally:
            pool.terminate()
        print(name.ljust(28), "  ".join(f"{d * 1000:g} ms: {table[name][d]:.3f}x" for d in durations), flush=True)
    print("\nelapsed / ideal (1.0 is perfect); fiberrl's ratio to each peer (below 1: fiberrl faster):")
    for name in table:
        if name != "fiberrl":
            print(f"  vs {name:26s}", "  ".join(f"{d * 1000:g} ms: {table['fiberrl'][d] / table[name][d]:.2f}"
                                                 for d in durations))


if __name__ == "__main__":
    main()
