"""The run's secret and the mutual HMAC challenge every connection passes
before any byte it carries is unpickled.

Handshake, once per connection (nng pipe):

    client -> server   HELLO  client_nonce
    server -> client   CHALLENGE  server_nonce, HMAC(secret, "server" | cn | sn)
    client -> server   PROOF  HMAC(secret, "client" | sn | cn)
    server -> client   OK

Each side proves it knows the secret over fresh nonces of the other side,
so a recorded exchange cannot be replayed.  After it, the connection is
trusted for its lifetime, as with ``multiprocessing.connection``'s
``answer_challenge``; no per-message cost.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets

SECRET_ENV = "FIBERRL_RUN_SECRET"
SECRET_FILE_ENV = "FIBERRL_RUN_SECRET_FILE"
NONCE_BYTES = 32
_secret: bytes | None = None


def run_secret() -> bytes:
    """This run's secret: inherited from the parent, or made here once."""
    global _secret
    if _secret is None:
        inherited = os.environ.get(SECRET_ENV)
        secret_file = os.environ.get(SECRET_FILE_ENV)
        if not inherited and secret_file:
            # backends whose job environment others can read hand the secret over in a private file
            try:
                with open(secret_file) as fh:
                    inherited = fh.read().strip()
            except OSError as exc:
                raise RuntimeError(f"{SECRET_FILE_ENV} names {secret_file}, which cannot be read: {exc}") from None
        if inherited:
            try:
                _secret = bytes.fromhex(inherited)
            except ValueError:
                raise RuntimeError(f"{SECRET_ENV} must be hex; unset it to let fiberrl make one") from None
            if len(_secret) < 32:
                raise RuntimeError(f"{SECRET_ENV} holds {len(_secret)} bytes; at least 32 are required")
        else:
            _secret = secrets.token_bytes(32)
    return _secret


def secret_known() -> bool:
    """Whether this process has read or made the run's secret, as every
    connection of the runtime does first."""
    return _secret is not None


def run_id(secret: bytes | None = None) -> str:
    """A public name of the run with ``secret`` (this run's by default), the
    same in all its processes (labels, job names); it reveals nothing of the secret."""
    return hashlib.sha256(b"fiberrl-run-id" + (secret or run_secret())).hexdigest()[:12]


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def server_proof(secret: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(secret, b"server" + client_nonce + server_nonce, hashlib.sha256).digest()


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, b"client" + server_nonce + client_nonce, hashlib.sha256).digest()


def verify(expected: bytes, received: bytes) -> bool:
    return hmac.compare_digest(expected, received)
