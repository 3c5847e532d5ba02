"""What this machine says of its own network without asking any cluster: its
address on the route to a host, an interface's address, whether an address
is its own.  The backends find the address their jobs reach them at with
these (no packet is sent by any of them)."""
from __future__ import annotations

import ipaddress
import socket


def route_source(host: str, port: int = 9) -> str | None:
    """This machine's address on the route to ``host``, an IP address; None when it is
    loopback, not an address, or has no route."""
    try:
        if not host or ipaddress.ip_address(host).is_loopback:
            return None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
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


def is_local_address(address: str) -> bool:
    """Whether ``address`` is loopback or one of this machine's."""
    try:
        if ipaddress.ip_address(address).is_loopback:
            return True
    except ValueError:
        return False
    return can_bind(address)
