"""Round-trip latency and throughput of Pipe and Queue, fiberrl against
multiprocessing (spawn) in the same run, plus the cost of authenticating a
connection.

    python experiments/micro/bench_pipe_queue.py [--quick]

Ratios are fiberrl / multiprocessing: below 1 is faster for latency, above 1
is faster for throughput.
"""
import argparse
import multiprocessing
import time

import numpy as np

import fiberrl.runtime as frl

MB = 1 << 20


def _put(end, item):
    (end.send if hasattr(end, "send") else end.put)(item)


def _take(end):
    return end.recv() if hasattr(end, "recv") else end.get()


def endpoints(lib, kind: str):
    """(this process's way in, its way out, the child's two ends) over a
    duplex Pipe or over a pair of Queues."""
    if kind == "Pipe":
        a, b = lib.Pipe()
        return a, a, (b, b)
    inbox, outbox = lib.Queue(), lib.Queue()
    return inbox, outbox, (inbox, outbox)


def echo(inbox, outbox):
    while (item := _take(inbox)) is not None:
        _put(outbox, item)


def produce(_inbox, outbox, item, n):
    for _ in range(n):
        _put(outbox, item)


def round_trip(lib, kind, item, n):
    """Seconds per round trip through a child that echoes."""
    to_child, from_child, child_ends = endpoints(lib, kind)
    p = lib.Process(target=echo, args=child_ends)
    p.start()
    _put(to_child, item), _take(from_child)  # warm up the connection
    t = time.perf_counter()
    for _ in range(n):
        _put(to_child, item)
        _take(from_child)
    elapsed = time.perf_counter() - t
    _put(to_child, None)
    p.join()
    return elapsed / n


def stream(lib, kind, item, n):
    """Items per second from a child to this process."""
    _, from_child, child_ends = endpoints(lib, kind)
    p = lib.Process(target=produce, args=(*child_ends, item, n + 1))
    p.start()
    _take(from_child)
    t = time.perf_counter()
    for _ in range(n):
        _take(from_child)
    elapsed = time.perf_counter() - t
    p.join()
    return n / elapsed


def auth_cost(n):
    """Connecting with the HMAC handshake vs a bare TCP connect, and one request after."""
    import socket

    from fiberrl.runtime.net import transport
    from fiberrl.runtime.processes.hub import PING, get_hub
    address = get_hub().address
    host, _, port = address.partition("/")[0].rpartition(":")
    t = time.perf_counter()
    for _ in range(n):
        socket.create_connection((host, int(port))).close()
    bare = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        transport.Client(address).close()
    authed = (time.perf_counter() - t) / n
    c = transport.Client(address)
    t = time.perf_counter()
    for _ in range(n * 10):
        c.request(PING)
    ping = (time.perf_counter() - t) / (n * 10)
    c.close()
    return bare, authed, ping


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    small_n, big_n = (300, 20) if args.quick else (3000, 200)
    small = b"x" * 64
    big = np.random.default_rng(0).random(MB // 8)  # 1 MiB of float64
    mp = multiprocessing.get_context("spawn")

    for label, fn, kind, item, n, unit in [
        ("Pipe round trip, 64 B", round_trip, "Pipe", small, small_n, "us"),
        ("Pipe round trip, 1 MiB array", round_trip, "Pipe", big, big_n, "us"),
        ("Queue round trip, 64 B", round_trip, "Queue", small, small_n, "us"),
        ("Queue round trip, 1 MiB array", round_trip, "Queue", big, big_n, "us"),
        ("Pipe stream child->parent, 64 B", stream, "Pipe", small, small_n * 3, "msg/s"),
        ("Queue stream child->parent, 64 B", stream, "Queue", small, small_n * 3, "msg/s"),
        ("Queue stream child->parent, 1 MiB array", stream, "Queue", big, big_n, "MiB/s"),
    ]:
        ours, theirs = fn(frl, kind, item, n), fn(mp, kind, item, n)
        if unit == "us":
            ours, theirs = ours * 1e6, theirs * 1e6
        print(f"{label:42s} fiberrl {ours:10.1f} {unit:6s} multiprocessing {theirs:10.1f} {unit:6s} "
              f"ratio {ours / theirs:5.2f}", flush=True)

    bare, authed, ping = auth_cost(20 if args.quick else 200)
    print(f"\nconnection set-up: bare TCP connect {bare * 1e3:.2f} ms, an authenticated stream (a Unix socket and "
          f"pipes on this host) {authed * 1e3:.2f} ms; request round trip after it {ping * 1e6:.0f} us")


if __name__ == "__main__":
    main()
