"""Where the jobs run and reach this process: the Docker network of the jobs
(configured, this process's container's, or ``bridge``) and this process's
address on it (its container's address there, or the network's gateway on
the host)."""
from __future__ import annotations

import ipaddress
import os

from ... import env_names
from ..probes import can_bind, interface_address, route_source
from .common import DockerError


class NetworkMixin:
    """The DockerBackend's network and listen host; caches the host in
    ``_hosts`` by the docker_network setting."""

    def _network(self) -> str:
        from ...config import get_config
        configured = get_config().docker_network
        if configured:
            return configured
        me = self._me_container()
        if me is None:
            return "bridge"
        mode = me["HostConfig"].get("NetworkMode") or "default"
        networks = list(me["NetworkSettings"].get("Networks") or {})
        if mode == "host":
            return "host"
        if mode in networks:
            return mode
        return networks[0] if networks else "bridge"

    def listen_host(self) -> str:
        from ...config import get_config
        key = get_config().docker_network
        host = self._hosts.get(key)
        if host is None:
            host = self._hosts[key] = self._find_listen_host()
        return host

    def _find_listen_host(self) -> str:
        parent = os.environ.get(env_names.PARENT_ADDRESS)
        if parent:
            # a job: its jobs share its network, and its address there is the one
            # it reaches its own parent from (no Docker API needed to find it)
            address = route_source(parent.rpartition(":")[0].strip("[]"))  # its address is "host:port"
            if address:
                return address
        network = self._network()
        if network == "host":
            return "127.0.0.1"
        me = self._me_container()
        if me is not None:
            networks = me["NetworkSettings"].get("Networks") or {}
            address = (networks.get(network) or {}).get("IPAddress")
            if not address:
                name = me["Name"].lstrip("/")
                raise DockerError(f"this container ({name}) is not on the Docker network {network!r} of its jobs: "
                                  f"connect it (`docker network connect {network} {name}`) or set docker_network "
                                  f"to one of its networks ({', '.join(networks) or 'none'})")
            return address
        return self._gateway(network)

    def _gateway(self, network: str) -> str:
        """This host's address on a Docker network (docker0 for bridge)."""
        import docker
        try:
            info = self._client().inspect_network(network)
        except docker.errors.NotFound:
            raise DockerError(f"no Docker network {network!r}: create it (`docker network create {network}`) or "
                              f"fix the docker_network setting") from None
        configs = (info.get("IPAM") or {}).get("Config") or []
        candidates = [c["Gateway"].split("/")[0] for c in configs if c.get("Gateway")]
        # the default bridge often names no gateway: its interface (docker0) has it
        bridge = (info.get("Options") or {}).get("com.docker.network.bridge.name")
        if info.get("Driver") == "bridge":
            candidates.append(interface_address(bridge or f"br-{info['Id'][:12]}"))
        for config in configs:
            try:
                subnet = ipaddress.ip_network(config.get("Subnet", ""), strict=False)
            except ValueError:
                continue
            # the address this machine sends from into the subnet, if it lies in it
            source = route_source(str(subnet.network_address + 2))
            if source and ipaddress.ip_address(source) in subnet:
                candidates.append(source)
        candidates = sorted((c for c in candidates if c), key=lambda c: ":" in c)  # IPv4 first
        for address in candidates:
            if can_bind(address):
                return address
        raise DockerError(f"this machine has no address on the Docker network {network!r} "
                          f"(is DOCKER_HOST a remote daemon?): set `host` to an "
                          f"address of this machine that containers on {network!r} can reach")
