"""Nothing from the network is unpickled before its sender proves it holds
the run's secret; the runtime listens on loopback only."""
import os
import socket
import time

import pytest

import fiberrl.runtime as mp
from fiberrl.runtime.net import transport, wire


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(ip, port) of the TCP sockets process ``pid`` listens on, from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            next(fh)
            for line in fh:
                cols = line.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state == "0A" and inode in inodes:
                    ip_hex, port_hex = local.split(":")
                    ip = socket.inet_ntop(socket.AF_INET, bytes.fromhex(ip_hex)[::-1]) if len(ip_hex) == 8 else ip_hex
                    found.append((ip, int(port_hex, 16)))
    return found


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def framed(body: bytes) -> bytes:
    return len(body).to_bytes(8, "little") + body


def attack(port: int, payload: bytes, queue_ids) -> None:
    """Everything a local client without the secret might try on one port,
    even knowing the ids of the queues it wants to poison."""
    # a queue put as a client of the run frames it: op, call id, token, queue id, then the pickle
    puts = [framed(bytes((10,)) + (1).to_bytes(8, "little") + bytes(8) + qid + bytes(8) + payload)
            for qid in queue_ids]
    attempts = [
        payload,  # 1. raw bytes, no protocol at all
        framed(payload),  # 2. the pickle as a frame
        b"".join(puts),  # 3. putting the pickle into real queues without any handshake
        # 4. starting the handshake, then forging its proof, then the puts
        framed(os.urandom(32)) + framed(os.urandom(32)) + b"".join(puts),
        (2 << 30).to_bytes(8, "little") + payload,  # 5. a frame said to be 2 GiB long
    ]
    for attempt in attempts:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(attempt)
                time.sleep(0.05)
        except ConnectionRefusedError:
            return  # that process is gone (which the test notices later)
        except OSError:
            continue  # hung up on mid-send


def host_queue_in_child(ready, out):
    mine = mp.Queue()  # the child's own hub now listens too
    ready.put(("listening", os.getpid(), mine))
    out.get(timeout=120)


@pytest.mark.slow
def test_rogue_client_never_gets_a_pickle_loaded(tmp_path):
    marker = tmp_path / "pwned"
    payload = bytes(wire.join(wire.dumps(Evil(marker))))  # what a real put would carry
    ready, out = mp.Queue(), mp.Queue()
    child = mp.Process(target=host_queue_in_child, args=(ready, out))
    child.start()
    tag, child_pid, childs_queue = ready.get(timeout=30)
    assert tag == "listening"

    # this process may also listen where an earlier test's cluster backend reached it; the child is
    # fresh, and the queues of this test are this process's local-backend address
    childs_ports = listening_sockets(child_pid)
    assert childs_ports and all(ip == "127.0.0.1" for ip, _ in childs_ports), \
        f"listening beyond loopback: {childs_ports}"
    assert all(q._ref.address.split("//")[-1].startswith("127.0.0.1:") for q in (ready, out)), ready._ref.address
    ports = listening_sockets(os.getpid()) + childs_ports
    queue_ids = [q._ref.obj_id for q in (ready, out, childs_queue)]
    for _, port in ports:
        attack(port, payload, queue_ids)
    time.sleep(0.5)
    assert not marker.exists(), "a pickle from an unauthenticated client was loaded"

    # reading the queues would load anything an attacker managed to put there
    childs_queue.put("still fine")
    assert childs_queue.get(timeout=30) == "still fine"
    assert ready.empty()
    assert not marker.exists(), "a pickle from an unauthenticated client was loaded"
    out.put("done")
    child.join(30)
    assert child.exitcode == 0
    again = mp.Process(target=os.getpid)
    again.start()
    again.join(30)
    assert again.exitcode == 0


def test_wrong_secret_is_refused():
    """A client holding another secret fails the handshake both ways."""
    q = mp.Queue()
    address = q._ref.address
    from fiberrl.runtime.net import auth
    real = auth.run_secret()
    auth._secret = os.urandom(32)
    try:
        with pytest.raises(PermissionError):
            transport.Client(address, connect_timeout=5)
    finally:
        auth._secret = real
    q.put(1)
    assert q.get(timeout=5) == 1


def report_env_and_argv(out):
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as fh:
        cmdline = fh.read()
    out.put((os.environ.get("FIBERRL_RUN_SECRET"), cmdline))


@pytest.mark.slow
def test_secret_reaches_children_through_environment_only():
    from fiberrl.runtime.net import auth
    out = mp.Queue()
    p = mp.Process(target=report_env_and_argv, args=(out,))
    p.start()
    secret_hex, cmdline = out.get(timeout=30)
    p.join(30)
    assert secret_hex == auth.run_secret().hex() and len(bytes.fromhex(secret_hex)) >= 32
    assert secret_hex.encode() not in cmdline


def test_a_lost_connection_stays_lost():
    """When its connection drops, a client is done: requests raise PeerGone,
    and only a new client, which passes the handshake again, reaches the server."""
    streams, served = [], []

    def handle(request):
        served.append(request.op)
        streams.append(request._stream)
        request.reply(transport.OK)

    server = transport.Server("127.0.0.1", handle)
    client = transport.Client(server.address, connect_timeout=5)
    try:
        assert client.request(7, timeout=5)[0] == transport.OK
        streams[0].close()  # the server drops it, as it does a connection that misbehaves
        with pytest.raises(mp.PeerGone):
            client.request(7, timeout=5)
        assert not client.alive and served == [7]
        again = transport.Client(server.address, connect_timeout=5)
        assert again.request(7, timeout=5)[0] == transport.OK
        again.close()
    finally:
        client.close()
        server.close()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_a_peer_without_the_secret_cannot_make_the_hub_allocate(tmp_path):
    """A frame that says it is 2 GiB long is cut off at its length word: the
    listener holds 40 bytes of a peer that has not proved itself."""
    import struct

    ready, out = mp.Queue(), mp.Queue()
    child = mp.Process(target=host_queue_in_child, args=(ready, out))
    child.start()
    _, child_pid, childs_queue = ready.get(timeout=30)
    host, _, port = childs_queue._ref.address.partition("/")[0].rpartition(":")
    before = rss_bytes(child_pid)
    sent = 0
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack("<Q", 2 << 30))
        chunk = bytes(1 << 20)
        try:
            while sent < 256 << 20:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # cut off
        time.sleep(0.3)
        grown = rss_bytes(child_pid) - before
    assert grown < 32 << 20, f"the hub grew by {grown >> 20} MiB for a peer that proved nothing"
    childs_queue.put("still fine")
    assert childs_queue.get(timeout=30) == "still fine"
    out.put("done")
    child.join(30)
    assert child.exitcode == 0


def test_an_item_larger_than_a_queue_carries_is_refused_in_one_line():
    from fiberrl.runtime import config
    mp.configure(max_message_size=1 << 20)
    try:
        q = mp.Queue()
        with pytest.raises(transport.MessageTooLarge, match="more than a queue or pipe carries"):
            q.put(bytes(2 << 20))
        q.put("small")
        assert q.get(timeout=10) == "small"
    finally:
        config.reset()


def send_raw_frame(stream_, size: int) -> None:
    """What a client of the run that ignores max_message_size would send."""
    stream_.send([bytes((10,)) + (1).to_bytes(8, "little") + bytes(8) + bytes(16) + bytes(size)])


def test_a_peer_that_sends_past_max_message_size_is_hung_up_on(caplog):
    from fiberrl.runtime import config
    mp.configure(max_message_size=1 << 20)
    try:
        server = transport.Server("127.0.0.1", lambda request: request.reply(transport.OK))
        client = transport.Client(server.address, connect_timeout=5)
        send_raw_frame(client._conn.stream, 2 << 20)
        with pytest.raises(mp.PeerGone):
            client.request(7, timeout=10)
        client.close()
        server.close()
    finally:
        config.reset()
