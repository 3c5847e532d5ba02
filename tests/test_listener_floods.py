"""Listeners outlive floods: running out of file descriptors, connections that
never finish their handshake, and many of them at once."""
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ROOT, wait_until

from fiberrl.runtime.net import auth, dial, stream
from fiberrl.runtime.net import listener as listener_module
from fiberrl.runtime.net.errors import LinkError
from fiberrl.runtime.net.listener import Listener


def echo(s):
    while True:
        s.send([s.recv()])


def host_and_port(address: str) -> tuple[str, int]:
    """Where the gate of a service's address ("host:port/name") listens."""
    host, _, port = address.partition("/")[0].rpartition(":")
    return host, int(port)


def connect_tcp(address: str) -> stream.Stream:
    """A stream over TCP even on this host (the local socket would skip what is tested)."""
    gate, _, service = address.partition("/")
    authenticated = dial._authenticate(stream.Stream(socket.create_connection(host_and_port(address), timeout=10)),
                                         gate)
    return dial.ask_for(authenticated, service)


LISTENER_WITH_FEW_FDS = textwrap.dedent("""
    import resource, sys, time
    from fiberrl.runtime.net.listener import Listener
    def echo(s):
        while True:
            s.send([s.recv()])
    listener = Listener("127.0.0.1", echo)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    print(listener.address, flush=True)
    time.sleep(120)
""")


@pytest.mark.slow
def test_a_listener_out_of_file_descriptors_goes_on_listening(script_env):
    """300 connections against a limit of 64 fds: accept() fails with EMFILE for a
    while, and once they are gone a client of the run is served again."""
    script_env["FIBERRL_RUN_SECRET"] = auth.run_secret().hex()
    server = subprocess.Popen([sys.executable, "-c", LISTENER_WITH_FEW_FDS], env=script_env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        address = server.stdout.readline().strip()
        host, port = host_and_port(address)
        flood = []
        for _ in range(300):  # not waiting for each: past the backlog, connections wait for a SYN answer
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex((host, int(port)))
            flood.append(sock)
        time.sleep(1.0)  # the listener meets EMFILE
        for sock in flood:
            sock.close()
        client = connect_tcp(address)
        client.send([b"still here"])
        assert client.recv() == b"still here"
        client.close()
        local = dial.connect(address)  # and its Unix socket too
        local.send([b"and here"])
        assert local.recv() == b"and here"
        local.close()
    finally:
        server.kill()
        _, stderr = server.communicate(timeout=10)
    assert "cannot accept a connection now" in stderr  # it said what happened


def test_a_handshake_has_one_deadline_for_the_whole_of_it(monkeypatch):
    """A peer that sends a byte now and then is dropped when the handshake's time is up."""
    monkeypatch.setattr(listener_module, "HANDSHAKE_TIMEOUT", 1.0)
    listener = Listener("127.0.0.1", echo)
    host, port = host_and_port(listener.address)
    slow = socket.create_connection((host, int(port)), timeout=10)
    hello = auth.NONCE_BYTES.to_bytes(8, "little") + auth.new_nonce()
    sent = 0
    try:
        for byte in hello:
            slow.send(bytes((byte,)))
            sent += 1
            time.sleep(0.3)
    except (BrokenPipeError, ConnectionResetError):
        pass
    # each byte came within 0.3 s of the one before: the listener hung up while the hello still came
    assert sent < len(hello), f"the listener took all {len(hello)} bytes of the hello, 0.3 s apart"
    slow.close()
    listener.close()


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def test_connections_waiting_in_the_handshake_cost_no_thread_and_are_bounded(monkeypatch):
    monkeypatch.setattr(listener_module, "MAX_HANDSHAKES", 128)  # the bound's logic, with fewer sockets
    listener = Listener("127.0.0.1", echo)
    host, port = host_and_port(listener.address)
    before = thread_count()
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(listener_module.MAX_HANDSHAKES + 72)]
    assert wait_until(lambda: len(listener._gate._pending) == listener_module.MAX_HANDSHAKES, 10)
    assert thread_count() <= before + 1
    # the oldest were dropped to make room: their reads end
    idle[0].settimeout(5)
    assert idle[0].recv(10) == b""
    client = connect_tcp(listener.address)  # and a client of the run is served at once
    client.send([b"x"])
    assert client.recv() == b"x"
    client.close()
    for sock in idle:
        sock.close()
    listener.close()


def test_the_gate_thread_survives_a_peer_that_fails_in_any_way():
    """Peers that connect and vanish, send garbage or reset: the gate goes on."""
    listener = Listener("127.0.0.1", echo)
    host, port = host_and_port(listener.address)
    for attempt in range(50):
        sock = socket.create_connection((host, int(port)), timeout=10)
        if attempt % 3 == 0:
            sock.sendall(os.urandom(100))
        elif attempt % 3 == 1:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
    assert listener._gate._thread.is_alive()
    client = connect_tcp(listener.address)
    client.send([b"y"])
    assert client.recv() == b"y"
    client.close()
    listener.close()


def test_a_process_listens_once_per_host_for_all_its_services():
    """Two services on one host share one gate (one port, one thread); a stream that
    names a service the gate no longer has is hung up on; the gate closes with its
    last service.  127.0.0.2: a host no other test of this process listens on."""
    first, second = Listener("127.0.0.2", echo, name="first"), Listener("127.0.0.2", echo, name="second")
    assert first._gate is second._gate and host_and_port(first.address) == host_and_port(second.address)
    assert first.address != second.address
    for listener, word in ((first, b"one"), (second, b"two")):
        client = dial.connect(listener.address)
        client.send([word])
        assert client.recv() == word
        client.close()
    gate = first._gate
    first.close()
    late = dial.connect(first.address)
    with pytest.raises(LinkError):
        late.recv()
    late.close()
    assert gate._thread.is_alive()
    second.close()
    assert wait_until(lambda: not gate._thread.is_alive(), 5)


def test_a_burst_of_clients_beyond_the_bound_loses_those_that_sent_nothing_first(monkeypatch):
    """A legitimate burst (a thousand pool workers starting at once) is far below the
    bound; past it, a peer that has sent nothing is dropped before one that sent its nonce."""
    assert listener_module.MAX_HANDSHAKES >= 4 * 1024
    monkeypatch.setattr(listener_module, "MAX_HANDSHAKES", 16)
    listener = Listener("127.0.0.1", echo)
    host, port = host_and_port(listener.address)
    started = []
    for _ in range(12):  # their nonce sent, their proof still to come
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(listener_module._PART_HEAD + auth.new_nonce())
        started.append(sock)
    assert wait_until(lambda: sum(h.client_nonce is not None for h in listener._gate._pending.values()) == 12, 10)
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(12)]
    assert wait_until(lambda: len(listener._gate._pending) == 16, 10)
    time.sleep(0.2)
    assert sum(h.client_nonce is not None for h in listener._gate._pending.values()) == 12
    for sock in started:  # each still has its challenge to answer
        assert len(sock.recv(200)) > 0
    client = connect_tcp(listener.address)
    client.send([b"x"])
    assert client.recv() == b"x"
    client.close()
    for sock in started + idle:
        sock.close()
    listener.close()
