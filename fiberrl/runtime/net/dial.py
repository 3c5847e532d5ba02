"""The client's side of a stream: dialling a process's gate (its abstract Unix
socket first, where this host can see it, then TCP), the client's half of
the mutual handshake, and naming the service the stream is for
(:mod:`.stream` says what each way costs and why)."""
from __future__ import annotations

import logging
import socket

from . import auth
from . import stream as streams
from .errors import LinkError, PeerGone, PeerMisbehaved
from .stream import CHALLENGE_BYTES, HANDSHAKE_TIMEOUT, Stream

log = logging.getLogger("fiberrl.stream")


def connect(address: str, timeout: float = HANDSHAKE_TIMEOUT) -> Stream:
    """Open an authenticated stream to the service at ``address`` ("host:port/name": a
    process's gate, and the service in it, ``net.listener``)."""
    gate, _, service = address.partition("/")
    return ask_for(_connect_gate(gate, timeout), service)


def ask_for(stream: Stream, service: str) -> Stream:
    """Name the service the stream is for, its first frame after the handshake."""
    try:
        stream.send([service.encode("ascii")])
    except BaseException:
        stream.close()
        raise
    return stream


def _connect_gate(address: str, timeout: float) -> Stream:
    local = _connect_local(address, timeout)
    if local is not None:
        try:
            return _authenticate(local, address)
        except (PermissionError, PeerMisbehaved) as exc:
            log.warning("refused the local socket of %s, whose holder failed the handshake (%s); "
                        "connecting over TCP instead", address, exc)
        except LinkError as exc:
            log.debug("the local socket of %s closed during the handshake (%s)", address, exc)
    host, _, port = address.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as exc:
        raise PeerGone(f"cannot reach {address}: {exc}") from None
    return _authenticate(Stream(sock), address)


def _authenticate(stream: Stream, address: str) -> Stream:
    """The client's half of the mutual handshake; the stream is closed if it fails."""
    try:
        secret = auth.run_secret()
        local = stream.sock.family == socket.AF_UNIX
        channel = auth.channel("unix" if local else "tcp", address)
        client_nonce = auth.new_nonce()
        stream.send([client_nonce])
        reply = stream.recv(limit=CHALLENGE_BYTES)
        server_nonce, proof = bytes(reply[:auth.NONCE_BYTES]), bytes(reply[auth.NONCE_BYTES:])
        if not auth.verify(auth.server_proof(secret, client_nonce, server_nonce, channel), proof):
            raise PermissionError(f"{address} failed to prove it holds this run's secret")
        stream.send([auth.client_proof(secret, server_nonce, client_nonce, channel)])
        if local:
            stream.await_ring()
            stream.trust_ring()
            stream.offer_ring()
            stream.take_offer()
        else:
            stream.sign_frames(*auth.session_signers(secret, client_nonce, server_nonce, channel, is_client=True))
        stream.handshake_done()
    except BaseException:
        stream.close()
        raise
    return stream


def _connect_local(address: str, timeout: float) -> Stream | None:
    """A stream over the listener's Unix socket, or None where it cannot be seen."""
    if not streams.LOCAL_SOCKETS:  # read at each call, where a test may switch it off
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(auth.local_name(address))
    except OSError:
        sock.close()
        return None
    trusted, who = auth.peer_trusted(sock)
    if not trusted:
        log.warning("refused the local socket of %s: it is held by %s, not this run's user; "
                    "connecting over TCP instead", address, who)
        sock.close()
        return None
    return Stream(sock, peer=address)
