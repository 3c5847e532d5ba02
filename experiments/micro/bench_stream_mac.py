"""What the MAC on every frame over TCP costs: echo round trips through a
stream over loopback TCP, with the MACs and with them switched off, in
alternating slices in this one process.  Streams between processes of one
host take a Unix socket and pipes, which carry no MAC, so only streams
between hosts (docker, slurm, kubernetes jobs) pay this.

    python experiments/micro/bench_stream_mac.py [--seconds 1] [--rounds 10]
"""
from __future__ import annotations

import argparse
import socket
import statistics
import time

from fiberrl.runtime.net import stream
from fiberrl.runtime.net.listener import Listener

SIZES = (100, 64 << 10, 1 << 20)


def echo(s):
    while True:
        s.send([s.recv()])


def tcp_stream(address: str) -> stream.Stream:
    gate, _, service = address.partition("/")
    host, _, port = gate.rpartition(":")
    return stream.ask_for(stream._authenticate(stream.Stream(socket.create_connection((host, int(port)))), gate),
                          service)


def round_trips(client: stream.Stream, size: int, seconds: float) -> float:
    """Round trips per second."""
    frame = bytes(size)
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        client.send([frame])
        client.recv()
        count += 1
    return count / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one slice")
    parser.add_argument("--rounds", type=int, default=10, help="slices of each kind")
    args = parser.parse_args()
    listener = Listener("127.0.0.1", echo)
    signed = tcp_stream(listener.address)
    signed.send([b"x"])  # answered once the listener's side of it is set up, with MACs
    signed.recv()
    original = stream.Stream.sign_frames
    stream.Stream.sign_frames = lambda self, signer, checker: None  # both ends of the next stream skip MACs
    try:
        unsigned = tcp_stream(listener.address)
        unsigned.send([b"x"])  # answered once the listener's side of it is set up (without MACs too)
        unsigned.recv()
    finally:
        stream.Stream.sign_frames = original
    print(f"{'frame':>10} {'with MAC /s':>12} {'without /s':>12} {'ratio':>7}")
    for size in SIZES:
        pairs = []
        for _ in range(args.rounds):
            pairs.append((round_trips(signed, size, args.seconds), round_trips(unsigned, size, args.seconds)))
        with_mac = statistics.median(p[0] for p in pairs)
        without = statistics.median(p[1] for p in pairs)
        ratio = statistics.median(p[0] / p[1] for p in pairs)
        print(f"{size:>10} {with_mac:>12.0f} {without:>12.0f} {ratio:>7.3f}")
    signed.close()
    unsigned.close()
    listener.close()


if __name__ == "__main__":
    main()
