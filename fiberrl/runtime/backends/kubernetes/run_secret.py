"""The run's secret: one Kubernetes Secret per run (``fiberrl-<run>``) in
each namespace, which pods read through a ``secretKeyRef``."""
from __future__ import annotations

import base64

from ..base import JobSpec
from .api import api_message
from .connection import _Connection
from .names import SECRET_ENV, SECRET_KEY, secret_name


def secret_of(spec: JobSpec) -> str:
    """The run secret ``spec`` carries, else this process's."""
    secret = spec.env.get(SECRET_ENV)
    if not secret:
        from ...net import auth
        secret = auth.run_secret().hex()
    return secret


class RunSecrets:
    """The runs' Secrets this process has made (or found), by namespace."""

    def __init__(self):
        self._made: set[tuple[str, str]] = set()

    def ensure(self, connection: _Connection, run: str, secret: str, labels: dict, owners: list | None) -> None:
        """The run's Secret, created once; an existing one belongs to whoever made it."""
        key = (connection.namespace, run)
        if key in self._made:
            return
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": secret_name(run), "labels": labels},
                "data": {SECRET_KEY: base64.b64encode(secret.encode()).decode()}}
        if owners:
            body["metadata"]["ownerReferences"] = owners
        try:
            connection.create(connection.api.create_namespaced_secret, connection.namespace, body)
        except connection.client_module.ApiException as exc:
            if exc.status != 409:
                raise RuntimeError(f"the kubernetes backend cannot create the run's Secret {secret_name(run)} in "
                                   f"namespace {connection.namespace}: {api_message(exc)}") from None
        self._made.add(key)

    def forget(self, namespace: str) -> None:
        """Forget the Secrets made in ``namespace`` (they were deleted)."""
        self._made = {key for key in self._made if key[0] != namespace}
