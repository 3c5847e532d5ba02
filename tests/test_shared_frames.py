"""Streams between processes of one host move from their socket to pipes,
and their large frames go through shared memory: equal on arrival, in the
order sent, through the pipe when they do not fit, and only between peers
that proved they hold the run's secret."""
import os
import socket
import sys
import threading
import time

import pytest
from conftest import wait_until

from fiberrl.runtime.net import auth, dial, errors, shared_frames, stream
from fiberrl.runtime.net.listener import Listener

pytestmark = pytest.mark.skipif(not (stream.LOCAL_SOCKETS and shared_frames.AVAILABLE),
                                reason="shared frame rings need Linux (abstract Unix sockets and memfd)")


def echo(s: stream.Stream) -> None:
    while True:
        s.send([s.recv()])


@pytest.fixture
def echoed():
    listener = Listener("127.0.0.1", echo)
    client = dial.connect(listener.address)
    yield client
    client.close()
    listener.close()


def frame(size: int, seed: int) -> bytes:
    return (seed.to_bytes(4, "little") * (size // 4 + 1))[:size]


def test_frames_of_every_size_arrive_equal_and_large_ones_take_the_ring(echoed, monkeypatch):
    assert echoed.sock.family == socket.AF_UNIX
    taken = []
    real_take = shared_frames.RingReader.take
    monkeypatch.setattr(shared_frames.RingReader, "take",
                        lambda self, where, size: taken.append(size) or real_take(self, where, size))
    sizes = [0, 10, stream.SMALL_FRAME, stream.SMALL_FRAME + 1, 100_800, 5 << 20, shared_frames.RING_BYTES + 1, 7]
    for i, size in enumerate(sizes):
        echoed.send([frame(size, i)])
        assert echoed.recv() == frame(size, i)
    # the three from 16 KiB + 1 to 5 MiB through the rings both ways (the echo server is in this
    # process too), the frame larger than a ring through the pipe
    assert len(taken) == 3 * 2
    assert echoed._ring_out is not None and echoed._ring_in is not None
    assert echoed._pipe_out is not None and echoed._pipe_in is not None and echoed.sock.fileno() == -1
    assert open_rings() == []  # the mappings hold no fds: a pool's master has hundreds of streams


def test_a_reader_that_falls_behind_gets_frames_through_the_pipe_in_order(monkeypatch):
    """More than a ring's worth in flight: the rest goes through the pipe, order kept."""
    size, count = 3 << 20, 12  # 36 MiB in flight against a 16 MiB ring
    taken, got, done = [], [], threading.Event()
    real_take = shared_frames.RingReader.take
    monkeypatch.setattr(shared_frames.RingReader, "take",
                        lambda self, where, size: taken.append(size) or real_take(self, where, size))

    def read_late(s):
        time.sleep(0.5)  # the ring fills meanwhile, and the sender blocks on the pipe
        for _ in range(count + 1):
            got.append(bytes(s.recv()))
        done.set()

    listener = Listener("127.0.0.1", read_late)
    client = dial.connect(listener.address)
    for i in range(count):
        client.send([frame(size, i)])
    assert wait_until(lambda: len(got) == count, 30)
    assert 5 <= len(taken) < count  # the first five filled the ring; the sixth at least took the pipe
    # with nothing in flight the writer starts again at the beginning: memory in use is the high water
    client.send([frame(size, 99)])
    assert done.wait(30)
    assert got == [frame(size, i) for i in range(count)] + [frame(size, 99)]
    assert client._ring_out._pos == size
    client.close()
    listener.close()


def test_threads_sending_large_frames_at_once_keep_each_frame_whole():
    got = []
    done = threading.Event()

    def collect(s):
        while len(got) < 4 * 50:
            got.append(bytes(s.recv()))
        done.set()

    listener = Listener("127.0.0.1", collect)
    client = dial.connect(listener.address)

    def send(k):
        for j in range(50):
            client.send([frame(40_000 + 1000 * k, 100 * k + j)])
    threads = [threading.Thread(target=send, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert done.wait(60)
    for k in range(4):
        mine = [f for f in got if len(f) == 40_000 + 1000 * k]
        assert mine == [frame(40_000 + 1000 * k, 100 * k + j) for j in range(50)]  # whole and in order
    client.close()
    listener.close()


def test_streams_over_tcp_have_no_ring(monkeypatch):
    monkeypatch.setattr(stream, "LOCAL_SOCKETS", False)
    listener = Listener("127.0.0.1", echo)
    client = dial.connect(listener.address)
    assert client.sock.family == socket.AF_INET and client._ring_out is None
    client.send([frame(100_000, 1)])
    assert client.recv() == frame(100_000, 1)
    client.close()
    listener.close()


def raw_local_connection(listener) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(auth.local_name(listener._gate.address))
    return sock


def open_rings() -> list[str]:
    rings = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:fiberrl-stream"):
                rings.append(fd)
        except FileNotFoundError:
            pass  # the listing's own fd
    return rings


def test_a_ring_offered_before_the_proof_is_refused_and_its_memory_let_go():
    served = []
    listener = Listener("127.0.0.1", lambda s: served.append(s))
    sock = raw_local_connection(listener)
    ring = shared_frames.RingWriter(1 << 20)
    socket.send_fds(sock, [stream.RING_OFFER.to_bytes(8, "little")], [ring.fd])
    ring.detach()  # now the listener holds the only fd of it
    sock.settimeout(10)
    assert sock.recv(64) == b""  # the listener hung up without answering
    assert served == []
    assert wait_until(lambda: open_rings() == [], 10)  # the listener's copy of the fd was closed, not kept
    sock.close()
    listener.close()


def test_a_peer_without_the_secret_never_gets_a_ring():
    listener = Listener("127.0.0.1", lambda s: None)
    sock = raw_local_connection(listener)
    sock.sendall((auth.NONCE_BYTES).to_bytes(8, "little") + auth.new_nonce())
    sock.settimeout(10)
    reply = sock.recv(4096)
    assert len(reply) == 8 + 2 * auth.NONCE_BYTES  # the listener's nonce and proof, nothing more
    sock.sendall((auth.NONCE_BYTES).to_bytes(8, "little") + os.urandom(auth.NONCE_BYTES))  # a wrong proof
    message, fds, _, _ = socket.recv_fds(sock, 4096, 4)
    assert message == b"" and fds == []
    sock.close()
    listener.close()


@pytest.mark.parametrize("size, where", [(10, (shared_frames.RING_BYTES, 10, 10)),  # past the end
                                         (10, (0, 1 << 20, 1 << 20))])  # larger than its header says
def test_a_frame_said_to_lie_where_it_cannot_ends_the_stream(echoed, size, where):
    echoed.send([frame(100_000, 1)])
    assert echoed.recv() == frame(100_000, 1)
    with echoed._send_lock:
        echoed._write([(stream.IN_RING | size).to_bytes(8, "little") + shared_frames.WHERE.pack(*where)])
    deadline = time.monotonic() + 10
    with pytest.raises(errors.PeerGone):  # the server hung up on it
        while time.monotonic() < deadline:
            echoed.send([b"x"])
            echoed.recv()


@pytest.mark.skipif(sys.byteorder != "little", reason="the test writes frame headers by hand")
def test_the_ring_offer_is_read_even_when_it_arrives_with_the_first_frame():
    """The server's offer and its first frame may be read at once: the fd is not lost."""
    served = threading.Event()

    def answer_at_once(s):
        s.send([frame(200_000, 5)])  # right behind the offer, before the client reads anything
        served.set()
        s.recv()

    listener = Listener("127.0.0.1", answer_at_once)
    client = dial.connect(listener.address)
    assert served.wait(10)
    time.sleep(0.05)
    assert client.recv() == frame(200_000, 5)
    assert client._ring_in is not None
    client.close()
    listener.close()


@pytest.mark.slow
def test_a_close_reaches_the_peer_while_a_forked_process_still_holds_the_pipe():
    """Unlike a socket's shutdown, closing a pipe's write end says nothing while a
    fork holds a copy of it: the stream's last word does."""
    ended = threading.Event()

    def serve(s):
        with pytest.raises(errors.PeerGone, match="closed the connection"):
            s.recv()
        ended.set()

    listener = Listener("127.0.0.1", serve)
    client = dial.connect(listener.address)
    assert client._pipe_out is not None
    child = os.fork()
    if child == 0:  # holds every fd of the parent until it is killed
        time.sleep(60)
        os._exit(0)
    try:
        client.close()
        assert ended.wait(5)
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
    listener.close()


def handshake_by_hand(listener) -> socket.socket:
    """A local connection that passes the handshake, as a peer with the secret would."""
    sock = raw_local_connection(listener)
    sock.settimeout(10)
    secret, client_nonce = auth.run_secret(), auth.new_nonce()
    sock.sendall(len(client_nonce).to_bytes(8, "little") + client_nonce)
    reply = b""
    while len(reply) < 8 + 2 * auth.NONCE_BYTES:
        reply += sock.recv(4096)
    server_nonce = reply[8:8 + auth.NONCE_BYTES]
    proof = auth.client_proof(secret, server_nonce, client_nonce, auth.channel("unix", listener._gate.address))
    sock.sendall(len(proof).to_bytes(8, "little") + proof)
    return sock


@pytest.mark.skipif(sys.byteorder != "little", reason="the test writes frame headers by hand")
def test_an_offer_of_a_pipes_write_end_is_refused(caplog):
    served = []
    listener = Listener("127.0.0.1", lambda s: served.append(s))
    sock = handshake_by_hand(listener)
    read_end, write_end = os.pipe()
    socket.send_fds(sock, [(stream.RING_OFFER | stream.OFFER_PIPE).to_bytes(8, "little")], [write_end])
    os.close(write_end)
    while sock.recv(4096):  # the listener's own offer, then it hangs up
        pass
    assert served == []
    assert "other than the read end of a pipe" in caplog.text
    os.close(read_end)
    sock.close()
    listener.close()


def test_readable_works_for_a_stream_whose_fds_are_past_1024():
    """select() cannot watch fds from 1024 on; a pool's master holds that many."""
    import resource

    from fiberrl.runtime.processes.startup import raise_open_files_limit
    raise_open_files_limit()
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1200:
        pytest.skip("this process may not open 1200 files (its hard limit is lower)")
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    try:
        listener = Listener("127.0.0.1", echo)
        client = dial.connect(listener.address)
        assert client.fileno() >= 1024
        assert not client.readable(0.05)
        client.send([b"ping"])
        assert client.readable(5)
        assert client.recv() == b"ping"
        client.close()
        listener.close()
    finally:
        for fd in fillers:
            os.close(fd)


def test_a_side_that_cannot_make_a_pipe_stays_on_the_socket(monkeypatch):
    """Out of fds on the client's side: its frames take the socket, the server's its pipe."""
    real_pipe, client_thread = os.pipe, threading.current_thread()

    def pipe():
        if threading.current_thread() is client_thread:
            raise OSError(24, "Too many open files")
        return real_pipe()
    monkeypatch.setattr(os, "pipe", pipe)
    listener = Listener("127.0.0.1", echo)
    client = dial.connect(listener.address)
    assert client._pipe_out is None and client._pipe_in is not None and client.sock.fileno() >= 0
    for i, size in enumerate([10, 100_000, shared_frames.RING_BYTES + 1]):
        client.send([frame(size, i)])
        assert client.recv() == frame(size, i)
    client.close()
    listener.close()
