"""The address this host's processes listen on so that jobs on the
cluster's nodes reach them."""
from __future__ import annotations

import ipaddress
import re
import socket
import subprocess

from ..probes import is_local_address, route_source
from .commands import SlurmError, run_command


def _resolve(name: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    addresses = []
    for family, *_, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in addresses:
            addresses.append(sockaddr[0])
    # IPv4 first: what cluster networks mostly route
    return sorted(addresses, key=lambda a: ":" in a)


def find_listen_host() -> str:
    """The source address of the route to the controller, or else to a
    compute node; when all of them are this host, its name's address, and
    loopback only when that is all it has."""
    targets = []
    try:
        done = run_command(["scontrol", "show", "config"], timeout=30)
        for line in done.stdout.splitlines():
            match = re.match(r"\s*(SlurmctldHost|ControlMachine|ControlAddr)\S*\s*=\s*(\S+)", line)
            if match:
                host, _, addr = match.group(2).partition("(")
                targets.append(addr.rstrip(")") or host)
        done = run_command(["sinfo", "-h", "-N", "-o", "%o"], timeout=30)
        targets += [name.strip() for name in done.stdout.split()[:16] if name.strip()]
    except (subprocess.TimeoutExpired, SlurmError):
        pass
    for target in targets:
        for address in _resolve(target):
            if is_local_address(address):
                continue
            source = route_source(address, 6817)
            if source and not ipaddress.ip_address(source.split("%")[0]).is_loopback:
                return source
    # the controller and the nodes are this host: its name's address, else loopback
    try:
        hostname = socket.gethostname()
    except OSError:
        hostname = ""
    for address in _resolve(hostname) if hostname else []:
        if not ipaddress.ip_address(address.split("%")[0]).is_loopback and is_local_address(address):
            return address
    return "127.0.0.1"
