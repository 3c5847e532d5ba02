"""A JobSpec as a pod spec: the environment (the run's secret through a
``secretKeyRef``, the pod's own name, namespace and IP through the downward
API), resources and GPUs, hostPath and PVC volumes, labels and
ownerReferences."""
from __future__ import annotations

import json
from collections.abc import Callable

from ..base import JobSpec, parse_volumes, remote_env, working_directory
from .names import (CONFIG_ENV, CONTAINER, POD_IP_ENV, POD_NAME_ENV, POD_NAMESPACE_ENV, POD_SET_ENV, SECRET_ENV,
                    SECRET_KEY, secret_name)

TERMINATE_GRACE = 30


def escape_expansion(text: str) -> str:
    """Kubernetes expands ``$(VAR)`` in commands and env values; ``$$`` is a literal ``$``."""
    return text.replace("$", "$$")


def pod_config(serialized: str) -> str:
    """The parent's resolved settings as a pod should inherit them: a pod
    listens on its own IP, not on the address its parent chose for itself."""
    try:
        values = json.loads(serialized)
    except ValueError:
        return serialized
    if not values.get("host"):
        return serialized
    values["host"] = ""
    return json.dumps(values)


def cpu_quantity(cores: float) -> str:
    return str(int(cores)) if float(cores).is_integer() else f"{int(round(cores * 1000))}m"


def _env(spec: JobSpec, config) -> list[dict]:
    forwarded = {k: v for k, v in remote_env(spec.env, config.forward_env).items() if k not in POD_SET_ENV}
    if forwarded.get(CONFIG_ENV):
        forwarded[CONFIG_ENV] = pod_config(forwarded[CONFIG_ENV])
    env = [{"name": k, "value": escape_expansion(v)} for k, v in forwarded.items()]
    env += [
        {"name": SECRET_ENV, "valueFrom": {"secretKeyRef": {"name": secret_name(spec.run), "key": SECRET_KEY}}},
        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": POD_NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    return env


def _resources(spec: JobSpec) -> dict:
    resources: dict = {}
    if spec.cpu:
        resources.setdefault("requests", {})["cpu"] = cpu_quantity(spec.cpu)
        resources.setdefault("limits", {})["cpu"] = cpu_quantity(spec.cpu)
    if spec.mem:
        resources.setdefault("requests", {})["memory"] = f"{int(spec.mem)}Mi"
        resources.setdefault("limits", {})["memory"] = f"{int(spec.mem)}Mi"
    if spec.gpu:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = str(int(spec.gpu))
    return resources


def _volumes(spec: JobSpec, config) -> tuple[list[dict], list[dict]]:
    """The pod's volumes and the container's mounts of them."""
    mounts = parse_volumes(config.volumes) + [(src, dst, False) for src, dst in spec.volumes.items()]
    volumes, volume_mounts = [], []
    for index, (source, target, read_only) in enumerate(mounts):
        volume = {"name": f"fiberrl-volume-{index}"}
        if source.startswith("/"):
            volume["hostPath"] = {"path": source}
        else:
            volume["persistentVolumeClaim"] = {"claimName": source, "readOnly": read_only}
        volumes.append(volume)
        volume_mounts.append({"name": volume["name"], "mountPath": target, "readOnly": read_only})
    return volumes, volume_mounts


def pod_body(spec: JobSpec, name: str, labels: dict, owners: list | None, config, parent: dict | None,
             image: Callable[[], str]) -> dict:
    """The pod for ``spec``.  ``parent`` is the pod of this process where it
    may own its jobs; ``image()`` is asked last, so a bad volume is reported
    before a missing image."""
    env = _env(spec, config)
    resources = _resources(spec)
    volumes, volume_mounts = _volumes(spec, config)
    container = {"name": CONTAINER, "image": image(),
                 "command": [escape_expansion(part) for part in spec.command],
                 "workingDir": working_directory(spec), "env": env}
    if resources:
        container["resources"] = resources
    if volume_mounts:
        container["volumeMounts"] = volume_mounts
    pod_spec: dict = {"restartPolicy": "Never", "enableServiceLinks": False,
                      "terminationGracePeriodSeconds": TERMINATE_GRACE, "containers": [container]}
    if volumes:
        pod_spec["volumes"] = volumes
    if parent:
        # the jobs of a pod act with its account and pull with its credentials
        for key in ("serviceAccountName", "imagePullSecrets"):
            if parent["spec"].get(key):
                pod_spec[key] = parent["spec"][key]
    metadata = {"name": name, "labels": labels, "annotations": {"fiberrl/process-name": spec.name}}
    if owners:
        metadata["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def owner_references(parent: dict | None) -> list:
    if not parent:
        return []
    meta = parent["metadata"]
    return [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}]
