"""A job's link to its parent (fiberrl.runtime.processes.parent_link): real streams and sockets."""
import os
import socket
import threading
import time

import pytest

import fiberrl.runtime as mp
from fiberrl.runtime.backends import listen_host
from fiberrl.runtime.net.errors import PeerGone
from fiberrl.runtime.net.stream_pump import StreamPump
from fiberrl.runtime.net.transport import ERROR, MISSING, OK
from fiberrl.runtime.processes.hub import BEAT, LAUNCH, PING, get_hub
from fiberrl.runtime.processes.parent_link import ChildLinks, ParentLink


def thread_names(_):
    return sorted(open(f"/proc/self/task/{tid}/comm").read().strip() for tid in os.listdir("/proc/self/task"))


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc to list a process's threads")
def test_a_pool_worker_starts_without_nng():
    """nng starts a pool of threads in each process that opens a socket (~2.8 ms of
    CPU, a quarter of a pool worker's start): a job's link to its parent is a stream."""
    with mp.Pool(2) as pool:
        names = pool.map(thread_names, range(4), chunksize=1)
    assert all(not any(name.startswith("nng") for name in worker) for worker in names), names


def test_the_hub_answers_a_job_and_refuses_what_it_does_not_know():
    link = ParentLink(get_hub().child_address, connect_timeout=10)
    try:
        assert link.request(PING, timeout=10)[0] == OK
        assert link.request(LAUNCH, os.urandom(16), timeout=10)[0] == MISSING  # no such job
        status, payload = link.request(99, b"what", timeout=10)
        assert status == ERROR and b"unknown request 99" in bytes(payload)
        assert link.request(PING, timeout=10)[0] == OK  # the link still serves
    finally:
        link.close()


def test_a_stranger_without_the_secret_gets_nothing_and_is_reported(caplog):
    host, _, port = get_hub().child_address.partition("/")[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((33).to_bytes(8, "little") + bytes((LAUNCH,)) + os.urandom(32))
        sock.settimeout(10)
        received = b""
        try:
            while chunk := sock.recv(4096):  # the handshake fails: closed without a launch payload
                received += chunk
        except ConnectionResetError:
            pass  # closed with the stranger's bytes unread
        assert len(received) < 64
    assert any("failed authentication" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)


def test_a_peer_gone_during_its_handshake_is_no_alarm(caplog):
    """A job killed as it connects (a pool terminated while its workers start) is not an attack."""
    host, _, port = get_hub().child_address.partition("/")[0].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10):
        pass
    time.sleep(0.5)
    assert not any("failed authentication" in r.getMessage() for r in caplog.records)


@pytest.fixture
def links():
    made = []

    def make(handle):
        made.append(ChildLinks(listen_host(), handle))
        return made[-1]
    yield make
    for parent in made:
        parent.close()


def test_the_job_sees_its_parent_hang_up_at_once(links):
    """The hang-up itself ends the job's wait: not its timeout (wait_lost is False when that passes),
    nor a request that fails (none is sent until the job knows)."""
    parent = links(lambda op, body, link: (OK, b""))
    link = ParentLink(parent.address, connect_timeout=10)
    assert link.request(PING, timeout=10)[0] == OK
    assert not link.wait_lost(0.2) and link.alive
    seen = []
    waiting = threading.Thread(target=lambda: seen.append(link.wait_lost(60)))
    waiting.start()
    parent.close()
    waiting.join(90)
    assert seen == [True] and not link.alive
    with pytest.raises(PeerGone):
        link.request(PING, timeout=10)


def test_a_beat_is_heard_and_not_answered(links):
    """The lifeline's beats between its answered pings: each one is heard (the parent's silence
    check), none answered, so that the next request's answer is its own."""
    heard = []

    def handle(op, body, link):
        heard.append(op)
        return None if op == BEAT else (OK, bytes(body))
    link = ParentLink(links(handle).address, connect_timeout=10)
    for _ in range(3):
        link.tell(BEAT)
    assert bytes(link.request(PING, b"mine", timeout=10)[1]) == b"mine"
    assert heard == [BEAT, BEAT, BEAT, PING]
    assert not link._stream.readable(0.3)  # no answer to a beat came after


def test_a_request_that_times_out_ends_the_link(links):
    """Its late reply would otherwise answer the next request."""
    def slow(op, body, link):
        time.sleep(1.0)
        return OK, bytes(body)
    link = ParentLink(links(slow).address, connect_timeout=10)
    with pytest.raises(TimeoutError):
        link.request(PING, b"first", timeout=0.1)
    assert not link.alive
    with pytest.raises(PeerGone):
        link.request(PING, b"second", timeout=10)


def test_replies_come_in_order_to_many_threads(links):
    link = ParentLink(links(lambda op, body, link: (OK, bytes(body))).address, connect_timeout=10)
    wrong = []

    def ask(i):
        for j in range(200):
            body = f"{i}-{j}".encode()
            if bytes(link.request(PING, body, timeout=30)[1]) != body:
                wrong.append(body)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


def test_the_parent_hears_each_job_and_can_hang_up_on_one(links):
    """What a parent needs to give up a job that went silent: when it last spoke, by the process
    it asked to be, and an end to its link that the job sees (its lifeline then exits)."""
    parent = None

    def handle(op, body, link):
        if op == LAUNCH:
            parent.name(link, bytes(body))
        return OK, b""
    parent = links(handle)
    first, second = (ParentLink(parent.address, connect_timeout=10) for _ in range(2))
    assert parent.heard(b"first") is None  # not named yet
    first.request(LAUNCH, b"first", timeout=10)
    second.request(LAUNCH, b"second", timeout=10)
    heard = parent.heard(b"first")
    time.sleep(0.2)
    first.request(PING, timeout=10)
    assert parent.heard(b"first") - heard >= 0.2
    parent.hang_up(b"first")
    assert first.wait_lost(10) and not first.alive
    assert parent.heard(b"first") is None
    assert second.request(PING, timeout=10)[0] == OK and parent.heard(b"second") is not None


def test_a_link_carries_a_service_its_replies_and_the_services_frames_each_to_its_reader(links):
    """A pool's worker speaks to its pool over its job's link (CARRY): the service reads the link
    from then on, and answers the link's own requests through ChildLinks.answer; on the job's side
    one thread waits for the service's frames while another asks over the link, and each gets its
    own, whichever of them read it.  A service the parent does not have is refused (None)."""
    ended = []

    def handle(op, body, link):
        if op == LAUNCH:
            parent.name(link, bytes(body))
        return OK, bytes(body)

    def on_frames(stream, link, frames):
        for frame in frames:
            if frame[0] < 20:
                parent.answer(stream, link, [frame])
            else:
                stream.send([bytes((OK,)), bytes(frame[1:])])  # the service's echo
    service = StreamPump(on_frames, lambda stream, link: ended.append(link), "test-service")

    def take(stream, link):
        service.add(stream, link)
        return lambda: service.drop(stream, link)
    parent = links(handle)
    parent.carry("the-service", take)
    link = ParentLink(parent.address, connect_timeout=10)
    try:
        link.request(LAUNCH, b"job", timeout=10)
        assert link.carry("no-such-service", timeout=10) is None
        carried = link.carry("the-service", timeout=10)
        assert carried is not None
        wrong = []

        def serve_side():
            for i in range(300):
                carried.send([bytes((21,)), f"s{i}".encode()])
                reply = carried.recv()
                if reply != bytearray(bytes((OK,)) + f"s{i}".encode()):
                    wrong.append(bytes(reply))

        def link_side():
            for i in range(300):
                if bytes(link.request(PING, f"p{i}".encode(), timeout=30)[1]) != f"p{i}".encode():
                    wrong.append(i)
        threads = [threading.Thread(target=serve_side), threading.Thread(target=link_side)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not wrong and not any(t.is_alive() for t in threads)
        assert parent.heard(b"job") is not None
        parent.hang_up(b"job")  # through the service that reads it
        assert link.wait_lost(10)
        deadline = time.monotonic() + 10
        while not ended and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ended) == 1
        parent.ended(ended[0])
        assert parent.heard(b"job") is None
    finally:
        link.close()
        service.close()
