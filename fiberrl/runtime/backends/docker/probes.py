"""What this machine says about itself without the Docker API: whether this
process runs in a container (and which ids that container may have), its
address on the route to a host or on an interface, and whether it can bind
an address."""
from __future__ import annotations

import ipaddress
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


def route_source(host: str) -> str | None:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    try:
        if not host or ipaddress.ip_address(host).is_loopback:
            return None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0]
    except (OSError, ValueError):
        return None


def interface_address(name: str) -> str | None:
    """The IPv4 address of network interface ``name`` (Linux), or None."""
    try:
        import fcntl
        import struct
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        return socket.inet_ntoa(packed[20:24])
    except (OSError, ImportError):
        return None


def can_bind(address: str) -> bool:
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False
