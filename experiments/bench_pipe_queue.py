"""Round-trip latency and throughput of Pipe and Queue, fiberrl against
multiprocessing (spawn) in the same run, plus the cost of authenticating a
connection.

    python experiments/bench_pipe_queue.py [--quick]

Ratios are fiberrl / multiprocessing: below 1 is faster for latency, above 1
is faster for throughput.
"""
import argparse
import multiprocessing
import time

import numpy as np

import fiberrl.runtime as frl

MB = 1 << 20


def pipe_echo(conn):
    while True:
        item = conn.recv()
        if item is None:
            return
        conn.send(item)


def queue_echo(inbox, outbox):
    while True:
        item = inbox.get()
        if item is None:
            return
        outbox.put(item)


def queue_produce(outbox, item, n):
    for _ in range(n):
        outbox.put(item)


def pipe_produce(conn, item, n):
    for _ in range(n):
        conn.send(item)


def pipe_rtt(lib, item, n):
    a, b = lib.Pipe()
    p = lib.Process(target=pipe_echo, args=(b,))
    p.start()
    a.send(item), a.recv()  # warm up the connection
    t = time.perf_counter()
    for _ in range(n):
        a.send(item)
        a.recv()
    elapsed = time.perf_counter() - t
    a.send(None)
    p.join()
    return elapsed / n


def queue_rtt(lib, item, n):
    inbox, outbox = lib.Queue(), lib.Queue()
    p = lib.Process(target=queue_echo, args=(inbox, outbox))
    p.start()
    inbox.put(item), outbox.get()
    t = time.perf_counter()
    for _ in range(n):
        inbox.put(item)
        outbox.get()
    elapsed = time.perf_counter() - t
    inbox.put(None)
    p.join()
    return elapsed / n


def queue_stream(lib, item, n):
    """Items per second from a child to this process."""
    outbox = lib.Queue()
    p = lib.Process(target=queue_produce, args=(outbox, item, n + 1))
    p.start()
    outbox.get()
    t = time.perf_counter()
    for _ in range(n):
        outbox.get()
    elapsed = time.perf_counter() - t
    p.join()
    return n / elapsed


def pipe_stream(lib, item, n):
    a, b = lib.Pipe()
    p = lib.Process(target=pipe_produce, args=(b, item, n + 1))
    p.start()
    a.recv()
    t = time.perf_counter()
    for _ in range(n):
        a.recv()
    elapsed = time.perf_counter() - t
    p.join()
    return n / elapsed


def auth_cost(n):
    """Connecting with the HMAC handshake vs a bare nng dial, and one request after."""
    import pynng
    from fiberrl.runtime import transport
    from fiberrl.runtime.hub import PING, get_hub
    address = get_hub().address
    t = time.perf_counter()
    for _ in range(n):
        with pynng.Req0() as s:
            s.dial(address, block=True)
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

    rows = []
    for label, fn, item, n, unit in [
        ("Pipe round trip, 64 B", pipe_rtt, small, small_n, "us"),
        ("Pipe round trip, 1 MiB array", pipe_rtt, big, big_n, "us"),
        ("Queue round trip, 64 B", queue_rtt, small, small_n, "us"),
        ("Queue round trip, 1 MiB array", queue_rtt, big, big_n, "us"),
        ("Pipe stream child->parent, 64 B", pipe_stream, small, small_n * 3, "msg/s"),
        ("Queue stream child->parent, 64 B", queue_stream, small, small_n * 3, "msg/s"),
        ("Queue stream child->parent, 1 MiB array", queue_stream, big, big_n, "MiB/s"),
    ]:
        ours, theirs = fn(frl, item, n), fn(mp, item, n)
        if unit == "us":
            ours, theirs = ours * 1e6, theirs * 1e6
        rows.append((label, unit, ours, theirs))
        print(f"{label:42s} fiberrl {ours:10.1f} {unit:6s} multiprocessing {theirs:10.1f} {unit:6s} "
              f"ratio {ours / theirs:5.2f}", flush=True)

    bare, authed, ping = auth_cost(20 if args.quick else 200)
    print(f"\nconnection set-up: bare nng dial {bare * 1e3:.2f} ms, with HMAC handshake {authed * 1e3:.2f} ms "
          f"(+{(authed - bare) * 1e3:.2f} ms once per connection); request round trip after it {ping * 1e6:.0f} us "
          f"(no per-message authentication cost)")


if __name__ == "__main__":
    main()
