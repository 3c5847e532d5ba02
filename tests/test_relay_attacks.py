"""A party in the middle of a connection gets no code run: a local process
that squats the socket names the runtime would use and relays the handshake
to the real listener (what an outside review did to every connection kind),
and a party on a TCP path that relays every byte and adds frames of its own."""
import os
import pickle
import selectors
import socket
import threading
import time

import cloudpickle
import pytest
from conftest import wait_until

import fiberrl.runtime as mp
from fiberrl.runtime.net import auth, dial, stream, transport, wire
from fiberrl.runtime.net import listener as listener_module
from fiberrl.runtime.net.listener import Listener
from fiberrl.runtime.pool.worker import CHUNK
from fiberrl.runtime.processes.hub import get_hub

_dial = socket.create_connection
linux_only = pytest.mark.skipif(not stream.LOCAL_SOCKETS, reason="abstract Unix sockets are Linux only")


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def evil_frame(marker) -> bytes:
    payload = bytes(wire.join(wire.dumps(Evil(marker))))
    return len(payload).to_bytes(8, "little") + payload


class Relay:
    """Accepts connections on ``listening``, relays each to TCP ``target`` byte
    for byte, and once the client has sent ``after`` bytes (its part of the
    handshake) sends ``inject`` both ways."""

    def __init__(self, listening: socket.socket, target: str, inject: bytes = b"", after: int = 80,
                 hijack: bool = False):
        """``hijack``: from then on the server's bytes no longer reach the client,
        and ``inject`` goes to the client alone (it answers in the server's place)."""
        self.listening, self.target, self.inject, self.after, self.hijack = listening, target, inject, after, hijack
        self.hijacked = False
        self.accepted = 0
        self.on_close = []
        self._threads: list[threading.Thread] = []
        listening.listen(16)
        listening.settimeout(0.2)
        self._stop = False
        self._start(self._accept)

    def _start(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listening.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            self.accepted += 1
            host, _, port = self.target.partition("/")[0].rpartition(":")
            server = _dial((host, int(port)))
            self._start(self._pump, client, server, True)
            self._start(self._pump, server, client, False)

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        passed = 0
        try:
            while chunk := src.recv(65536):
                if not from_client and self.hijacked:
                    continue
                dst.sendall(chunk)
                passed += len(chunk)
                if from_client and self.inject and passed >= self.after:
                    self.hijacked = self.hijack
                    if not self.hijack:
                        dst.sendall(self.inject)  # to the server, and to the client
                    src.sendall(self.inject)
                    self.inject = b""
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop = True
        self.listening.close()
        for undo in self.on_close:
            undo()


def squat(name: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(name)
    except OSError:
        sock.close()
        return None
    return sock


def predictable_name(address: str) -> str:
    """The name a listener at ``address`` used to bind, which anyone could compute."""
    return f"\0fiberrl-stream/{address}"


@linux_only
def test_the_local_name_cannot_be_computed_without_the_secret():
    address = "127.0.0.1:40000"
    assert auth.local_name(address) != predictable_name(address)
    assert auth.local_name(address) != auth.local_name(address, secret=os.urandom(32))
    assert auth.local_name(address) != auth.local_name("127.0.0.1:40001")


def echo_after_loading(marker_dir):
    def serve(s):
        while True:
            frame = s.recv()
            s.send([bytes(wire.join(wire.dumps(("echo", len(frame)))))])
    return serve


@linux_only
def test_a_squatter_on_the_old_name_never_sees_a_connection(tmp_path):
    listener = Listener("127.0.0.1", echo_after_loading(tmp_path))
    squatter = squat(predictable_name(listener._gate.address))
    assert squatter is not None
    relay = Relay(squatter, listener.address, evil_frame(tmp_path / "pwned"))
    client = dial.connect(listener.address)
    client.send([b"hello"])
    assert wire.loads(client.recv()) == ("echo", 5)
    assert client.sock.family == socket.AF_UNIX or client._pipe_in is not None
    assert relay.accepted == 0 and not (tmp_path / "pwned").exists()
    client.close()
    relay.close()
    listener.close()


@linux_only
def test_a_holder_of_the_local_name_that_relays_to_tcp_is_refused_and_logged(tmp_path, caplog):
    """Were the name to leak, the relayed handshake still fails: the client proves it
    over a Unix socket, the listener sees TCP.  The client says so and goes over TCP."""
    loaded = []
    # a gate of its own (no other service of this process is on 127.0.0.4): its name is not given back
    listener = Listener("127.0.0.4", lambda s: loaded.append(wire.loads(s.recv())))
    listener._gate._selector.unregister(listener._gate._local)
    stream._close(listener._gate._local)  # as if a squatter had been first
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    assert wait_until(lambda: _bound(squatter, auth.local_name(listener._gate.address)), 10)
    relay = Relay(squatter, listener.address, evil_frame(tmp_path / "pwned"))
    client = dial.connect(listener.address)
    assert client.sock.family == socket.AF_INET
    client.send([bytes(wire.join(wire.dumps("from the client")))])
    assert wait_until(lambda: loaded == ["from the client"], 10)
    assert relay.accepted == 1
    time.sleep(0.2)
    assert not (tmp_path / "pwned").exists()
    assert "refused the local socket" in caplog.text
    client.close()
    relay.close()
    listener.close()


def _bound(sock: socket.socket, name: str) -> bool:
    try:
        sock.bind(name)
        return True
    except OSError:
        return False


def test_a_party_on_the_tcp_path_cannot_add_frames(tmp_path, caplog):
    """It relays the handshake unchanged (both sides accept it), then sends a pickle
    each way: the MACs tell both sides, and neither loads it."""
    loaded = []
    listener = Listener("127.0.0.1", lambda s: loaded.extend(wire.loads(s.recv()) for _ in range(2)))
    middle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    middle.bind(("127.0.0.1", 0))
    service = listener.address.partition("/")[2]
    # after the client's handshake (80 bytes) and the frame that names the service, MAC'd
    relay = Relay(middle, listener.address, evil_frame(tmp_path / "pwned"),
                  after=80 + 8 + len(service) + auth.MAC_BYTES)
    sock = socket.create_connection(middle.getsockname()[:2], timeout=10)
    # the client believes it dialled the listener: a party on the path keeps addresses alike
    gate, _, service = listener.address.partition("/")
    client = dial.ask_for(dial._authenticate(stream.Stream(sock), gate), service)
    assert wait_until(lambda: relay.inject == b"", 10)
    client.send([bytes(wire.join(wire.dumps("from the client")))])
    with pytest.raises(stream.PeerMisbehaved, match="MAC"):
        wire.loads(client.recv())
    assert wait_until(lambda: caplog.text.count("MAC does not match") >= 2, 10)  # both sides
    assert loaded == [] and not (tmp_path / "pwned").exists()
    client.close()
    relay.close()
    listener.close()


def test_frames_over_tcp_carry_macs_that_the_peer_checks():
    frames = []
    listener = Listener("127.0.0.1", lambda s: frames.extend(s.recv() for _ in range(3)))
    host, _, port = listener.address.partition("/")[0].rpartition(":")
    gate, _, service = listener.address.partition("/")
    client = dial.ask_for(dial._authenticate(stream.Stream(socket.create_connection((host, int(port)))), gate),
                            service)
    for size in (0, 100, 3 << 20):
        client.send([b"x" * size])
    assert wait_until(lambda: len(frames) == 3, 10)
    assert [len(f) for f in frames] == [0, 100, 3 << 20]
    client.close()
    listener.close()


# --- every connection kind ---------------------------------------------------


def put_pid(q):
    q.put(os.getpid())


def take_over_local_name(listener, answers: list[bytes]) -> Relay:
    """Close ``listener``'s Unix socket and hold its name, relaying the handshake to
    its TCP side and then answering the client with ``answers`` (frame bodies): the
    squat the review ran (it bound the names before the listeners did)."""
    name = listener._gate._local.getsockname()
    listener._gate._selector.unregister(listener._gate._local)  # before its fd may be reused
    stream._close(listener._gate._local)
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    assert wait_until(lambda: _bound(squatter, name), 10)
    no_ring = stream.RING_OFFER.to_bytes(8, "little")  # "I have no ring or pipe to offer"
    frames = b"".join(len(body).to_bytes(8, "little") + body for body in answers)
    relay = Relay(squatter, listener.address, no_ring + frames, hijack=True)
    relay.on_close.append(lambda: give_the_name_back(listener._gate, relay._threads[:1]))
    return relay


def give_the_name_back(gate, relay_threads) -> None:
    """The gate listens on its local name again: the process's other services (the
    hub's, the next test's pools) share it."""
    for thread in relay_threads:  # the name is free once its accept() returns
        thread.join(timeout=5)
    gate._local = gate._listen_locally()
    gate._local.setblocking(False)
    gate._selector.register(gate._local, selectors.EVENT_READ, listener_module._ACCEPT)
    gate._wake_write.send(b"x")


ATTACK_MARKER = f"/tmp/fiberrl-relay-attack-{os.getpid()}"


@pytest.fixture
def marker():
    if os.path.exists(ATTACK_MARKER):
        os.unlink(ATTACK_MARKER)
    yield ATTACK_MARKER
    assert not os.path.exists(ATTACK_MARKER), "the attacker's pickle was loaded"


@pytest.mark.slow
@linux_only
def test_a_jobs_parent_link_is_not_hijacked(marker):
    hub = get_hub()
    hub.child_address
    launch = bytes((transport.OK,)) + pickle.dumps(Evil(ATTACK_MARKER))  # a job unpickles its launch payload
    relay = take_over_local_name(hub._child_links._listener, [launch])
    q = mp.Queue()
    p = mp.Process(target=put_pid, args=(q,))
    p.start()
    assert q.get(timeout=30) == p.pid  # the job went past the squatter, over TCP
    p.join(30)
    assert p.exitcode == 0 and relay.accepted >= 1
    relay.close()


def square(x):
    return x * x


def evil_tasks() -> bytes:
    """The master's answer to a worker's first request for work, with the attacker's function."""
    header = bytes((0,)) + CHUNK.pack(1, 1, True, False)
    parts = wire.frames([header, cloudpickle.dumps(Evil(ATTACK_MARKER)), wire.encode([1])])
    return bytes((transport.OK,)) + b"".join(bytes(part) for part in parts)


@pytest.mark.slow
@linux_only
def test_a_pool_workers_stream_is_not_hijacked(marker):
    with mp.Pool(1) as pool:
        assert pool.map(square, range(4)) == [0, 1, 4, 9]
        relay = take_over_local_name(pool._scheduler._listener, [bytes((transport.OK,)), evil_tasks()])
        worker = next(p for p in mp.active_children() if p.name.startswith("PoolWorker"))
        worker.kill()  # its replacement connects now
        assert pool.map(square, range(20)) == [x * x for x in range(20)]
        assert pool.statistics().worker_restarts >= 1 and relay.accepted >= 1
        relay.close()


@pytest.mark.slow
def test_a_manager_stream_through_a_party_on_its_path_loads_nothing(marker, monkeypatch, caplog):
    """The manager's process is another job: its connection is taken on the way,
    a TCP relay that keeps the addresses the client sees, as a party on a network path does."""
    with mp.Manager() as manager:
        d = manager.dict()
        middle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        middle.bind(("127.0.0.1", 0))
        relay = Relay(middle, manager.address, evil_frame(marker))
        host, _, port = manager.address.partition("/")[0].rpartition(":")
        diverted = middle.getsockname()[:2]
        monkeypatch.setattr(dial, "_connect_local", lambda address, timeout: None)
        monkeypatch.setattr(socket, "create_connection",
                            lambda where, *a, **k: _dial(diverted if where == (host, int(port)) else where, *a, **k))
        outcome = []

        def call_from_a_new_thread():  # a thread opens its own stream to the manager
            try:
                d["x"] = 1
                outcome.append("done")
            except Exception as exc:
                outcome.append(exc)

        thread = threading.Thread(target=call_from_a_new_thread)
        thread.start()
        thread.join(30)
        assert relay.accepted == 1 and outcome and outcome[0] != "done"
        assert "MAC does not match" in caplog.text
        relay.close()


def test_a_queue_hubs_connection_relayed_from_another_address_is_refused():
    """A client that reaches the hub through another address (a relay) and the hub
    prove different channels: the client refuses, and the hub goes on."""
    q = mp.Queue()
    q.put("warm")  # the hub listens
    middle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    middle.bind(("127.0.0.1", 0))
    relay = Relay(middle, get_hub().address)
    try:
        with pytest.raises(PermissionError, match="failed to prove"):
            transport.Client("%s:%d" % middle.getsockname()[:2], connect_timeout=5)
        assert relay.accepted == 1
        assert q.get(timeout=10) == "warm"
    finally:
        relay.close()


def test_a_queue_hubs_connection_through_a_party_on_its_path_loads_nothing(marker, monkeypatch, caplog):
    q = mp.Queue()
    q.put("warm")
    hub_address = get_hub().address
    middle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    middle.bind(("127.0.0.1", 0))
    relay = Relay(middle, hub_address, evil_frame(marker))
    host, _, port = hub_address.partition("/")[0].rpartition(":")
    diverted = middle.getsockname()[:2]
    monkeypatch.setattr(dial, "_connect_local", lambda address, timeout: None)
    monkeypatch.setattr(socket, "create_connection",
                        lambda where, *a, **k: _dial(diverted if where == (host, int(port)) else where, *a, **k))
    client = transport.Client(hub_address, connect_timeout=5)
    with pytest.raises(mp.PeerGone):
        client.request(1, timeout=10)
    assert relay.accepted == 1 and "MAC does not match" in caplog.text
    client.close()
    relay.close()
    assert q.get(timeout=10) == "warm"


@linux_only
def test_a_listener_whose_local_name_is_taken_refuses_and_says_so(monkeypatch, caplog):
    """Only the run can compute the name, so a holder is something wrong: no quiet
    fallback to TCP alone, which is what let the old squat work."""
    name = f"\0fiberrl-test-taken-{os.getpid()}"
    holder = squat(name)
    assert holder is not None
    holder.listen(1)
    monkeypatch.setattr(auth, "local_name", lambda address, secret=None: name)
    from fiberrl.runtime.net.listener import ListenerError
    with pytest.raises(ListenerError, match="held by another process"):
        Listener("127.0.0.3", lambda s: None)  # a host this process has no gate on yet
    assert "held by another process" in caplog.text
    holder.close()
