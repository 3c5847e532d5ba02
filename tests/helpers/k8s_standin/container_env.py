"""A container's environment as a kubelet builds it: ``value`` (with
``$(VAR)`` expansion), ``secretKeyRef``, ``fieldRef``, plus ``PATH`` from
this server's environment."""
from __future__ import annotations

import base64
import os

from .objects import NODE, POD_IP


class _NotReady(Exception):
    """A container cannot be created yet (a referenced Secret is missing)."""


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, ``$$`` is
    a literal ``$``, anything else is left as it is."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i):
            end = text.find(")", i)
            name = text[i + 2:end] if end != -1 else None
            if name is not None and name in env:
                out.append(env[name])
                i = end + 1
            else:
                out.append("$(")
                i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def container_env(pod: dict, container: dict, secrets: dict[tuple[str, str], dict]) -> dict[str, str]:
    """The environment of ``container`` in ``pod``, as a kubelet makes it (``secrets``: the store's)."""
    env: dict[str, str] = {}
    namespace = pod["metadata"]["namespace"]
    fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": namespace,
              "metadata.uid": pod["metadata"]["uid"], "status.podIP": POD_IP, "status.hostIP": POD_IP,
              "spec.nodeName": NODE, "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default")}
    for item in container.get("env") or []:
        name = item["name"]
        source = item.get("valueFrom")
        if source is None:
            env[name] = expand(item.get("value", ""), env)
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            secret = secrets.get((namespace, ref["name"]))
            if secret is None:
                raise _NotReady(f'secret "{ref["name"]}" not found')
            data = secret.get("data") or {}
            if ref["key"] not in data:
                raise _NotReady(f'couldn\'t find key {ref["key"]} in Secret {namespace}/{ref["name"]}')
            env[name] = base64.b64decode(data[ref["key"]]).decode()
        elif "fieldRef" in source:
            env[name] = fields.get(source["fieldRef"]["fieldPath"], "")
        else:
            env[name] = ""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
