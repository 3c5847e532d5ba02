"""What a master of thousands of jobs relies on, on real sockets: streams that hold little memory
until their frames need it, a gate that spends no thread on a stream a service keeps, and links
whose unread beats count as heard (experiments/micro/sim_many_workers.py measures the whole)."""
import os
import threading
import time

import pytest
from test_shared_frames import echo, frame

import fiberrl.runtime as mp

from fiberrl.runtime.backends import listen_host
from fiberrl.runtime.net import dial, stream
from fiberrl.runtime.net.errors import PeerGone
from fiberrl.runtime.net.listener import Listener
from fiberrl.runtime.net.transport import OK
from fiberrl.runtime.processes.hub import BEAT, LAUNCH
from fiberrl.runtime.processes.parent_link import ChildLinks, ParentLink


@pytest.fixture
def tcp_echo(monkeypatch):
    """A client's stream over TCP (MACs, no pipes) to a service that echoes each frame."""
    monkeypatch.setattr(stream, "LOCAL_SOCKETS", False)
    listener = Listener("127.0.0.1", echo)
    client = dial.connect(listener.address)
    yield client
    client.close()
    listener.close()


def test_a_streams_read_buffer_grows_only_as_its_frames_need(tcp_echo):
    for i in range(50):  # heartbeats and requests for work: the buffer stays at its first size
        tcp_echo.send([frame(40, i)])
        assert tcp_echo.recv() == frame(40, i)
    assert len(tcp_echo._buf) == stream.FIRST_READ_BUFFER
    for i, size in enumerate([stream.FIRST_READ_BUFFER, 10_000, stream.READ_BUFFER + 1, 3 << 20, 7]):
        tcp_echo.send([frame(size, i)])
        assert tcp_echo.recv() == frame(size, i)
    assert len(tcp_echo._buf) == stream.READ_BUFFER  # and no larger: a larger frame has a buffer of its own


def test_a_burst_of_small_frames_arrives_whole_and_in_order(tcp_echo):
    """Many frames at once fill the small buffer: it grows so that later reads take more at once."""
    sent = [frame(100 + i % 300, i) for i in range(3000)]
    sender = threading.Thread(target=lambda: [tcp_echo.send([f]) for f in sent])
    sender.start()
    time.sleep(0.5)  # the echoes pile up in the socket meanwhile: the first read fills the buffer
    got = [bytes(tcp_echo.recv()) for _ in sent]
    sender.join()
    assert got == sent
    assert stream.FIRST_READ_BUFFER < len(tcp_echo._buf) <= stream.READ_BUFFER


def test_the_gate_hands_tcp_streams_to_a_keeping_service_without_a_thread_each(monkeypatch):
    monkeypatch.setattr(stream, "LOCAL_SOCKETS", False)
    started = []

    class Counted(threading.Thread):
        def start(self):
            if self.name == "fiberrl-stream":
                started.append(self)
            super().start()
    monkeypatch.setattr(threading, "Thread", Counted)
    kept = []
    listener = Listener("127.0.0.1", kept.append, hand_off=True)
    clients = [dial.connect(listener.address) for _ in range(20)]
    try:
        deadline = time.monotonic() + 10
        while len(kept) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(kept) == 20 and started == []
        for i, client in enumerate(clients):  # each a working stream, MACs and all
            client.send([frame(64, i)])
        assert sorted(bytes(s.recv()) for s in kept) == sorted(frame(64, i) for i in range(20))
    finally:
        for s in [*clients, *kept]:
            s.close()
        listener.close()


def ask_and_hold(link) -> None:
    try:
        link.request(99, timeout=20)
    except PeerGone:
        pass  # closed by the test once it has seen what it looks for


def test_a_link_whose_beat_waits_unread_is_not_taken_for_silent():
    """A parent too busy to read its links (one request holds its reader) must not give up the jobs
    whose beats wait in their sockets; a job that sent nothing is silent all the same."""
    names = iter([b"busy", b"beating", b"quiet"])
    hold = threading.Event()

    def handle(op, body, link):
        if op == LAUNCH:
            parent.name(link, next(names))
            return OK, b""
        if op == 99:
            hold.wait(10)  # the reader is held here
            return OK, b""
        return None

    parent = ChildLinks(listen_host(), handle)
    links = [ParentLink(parent.address, connect_timeout=10) for _ in range(3)]
    try:
        for link in links:
            assert link.request(LAUNCH, os.urandom(4), timeout=10)[0] == OK
        time.sleep(0.5)
        cutoff = time.monotonic()
        threading.Thread(target=ask_and_hold, args=(links[0],), daemon=True).start()
        time.sleep(0.3)  # the reader holds on the busy link's request
        links[1].tell(BEAT)
        time.sleep(0.3)  # the beat waits in its socket, unread
        assert parent.unheard_since(cutoff) == {b"quiet"}
        assert parent.heard(b"beating") >= cutoff
    finally:
        hold.set()
        for link in links:
            link.close()
        parent.close()


def test_a_peer_that_reads_slowly_keeps_its_tcp_stream_past_heartbeat_timeout(monkeypatch):
    """A send blocked on a reader that is alive but busy waits as long as it takes (multiprocessing's
    Pipe does): only a peer that acknowledges nothing is given up after ``heartbeat_timeout``."""
    monkeypatch.setattr(stream, "LOCAL_SOCKETS", False)
    mp.configure(heartbeat_timeout=1)
    kept = []
    listener = Listener("127.0.0.1", kept.append, hand_off=True)
    client = dial.connect(listener.address)
    try:
        deadline = time.monotonic() + 10
        while not kept and time.monotonic() < deadline:
            time.sleep(0.01)
        big = frame(16 << 20, 1)  # far past what the sockets' buffers hold
        sender = threading.Thread(target=client.send, args=([big],))
        sender.start()
        time.sleep(4)  # the reader reads nothing meanwhile: the sender waits on its shut window
        assert sender.is_alive()
        assert kept[0].recv() == big
        sender.join(10)
        assert not sender.is_alive()
    finally:
        mp.config.reset()
        for s in [client, *kept]:
            s.close()
        listener.close()
