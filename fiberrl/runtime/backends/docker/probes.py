"""What this machine says about itself without the Docker API: whether this
process runs in a container, and which ids that container may have."""
from __future__ import annotations

import re
import socket


def in_container() -> bool:
    """Whether this process runs in a Docker container (not /.dockerenv:
    machine images made from Docker images have one too)."""
    return bool(_mounted_ids())


def _mounted_ids() -> list[str]:
    """Docker bind-mounts a container's /etc/hostname, /etc/hosts and
    /etc/resolv.conf from its containers/<id>/ directory on the host."""
    found = []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and fields[4] in ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf"):
                    match = re.search(r"/containers/([0-9a-f]{64})/", fields[3])
                    if match and match.group(1) not in found:
                        found.append(match.group(1))
    except OSError:
        pass
    return found


def own_container_candidates() -> list[str]:
    """Ids this process's container may have: from its mounts, its cgroups
    (cgroup v1, or v2 without a cgroup namespace), its host name."""
    found = _mounted_ids()
    try:
        with open("/proc/self/cgroup") as fh:
            found += [m for m in re.findall(r"docker[/-]([0-9a-f]{64})", fh.read()) if m not in found]
    except OSError:
        pass
    hostname = socket.gethostname()
    if re.fullmatch(r"[0-9a-f]{12}", hostname):
        found.append(hostname)
    return found
