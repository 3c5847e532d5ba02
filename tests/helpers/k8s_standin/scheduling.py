"""Admission and scheduling on the one node: a quota on unfinished pods per
namespace, and the node's capacity a pod's resources must fit in."""
from __future__ import annotations

from .objects import ApiError


def quantity(value) -> float:
    """A Kubernetes quantity as a number (cpu cores, bytes, devices)."""
    text = str(value)
    suffixes = {"m": 1e-3, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix, factor in sorted(suffixes.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * factor
    return float(text)


def check_quota(pods: dict[tuple[str, str], dict], quota: dict | None, namespace: str, name: str) -> None:
    """Refuse pod ``name`` if ``namespace`` has as many unfinished pods as ``quota`` allows."""
    if quota is not None:
        used = sum(1 for (ns, _), p in pods.items()
                   if ns == namespace and p["status"]["phase"] in ("Pending", "Running"))
        if used + 1 > quota["pods"]:
            raise ApiError(403, "Forbidden",
                           f'pods "{name}" is forbidden: exceeded quota: standin-quota, requested: pods=1, '
                           f'used: pods={used}, limited: pods={quota["pods"]}')


def unschedulable(pod: dict, capacity: dict) -> str | None:
    """Why ``pod`` fits on no node, or None."""
    short = []
    for c in pod["spec"]["containers"]:
        resources = c.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for key, value in wanted.items():
            if key in capacity and quantity(value) > capacity[key]:
                short.append(key)
    if short:
        return "0/1 nodes are available: " + ", ".join(f"1 Insufficient {k}" for k in sorted(set(short))) + \
            ". preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
    return None
