"""A Docker container standing in for a host, cut off from its network or stalled, then healed:
for the host-fault tests and bench_host_faults.py."""
import time

from docker.errors import APIError, NotFound
from docker.types import IPAMConfig, IPAMPool


def make_network(api, name: str, subnet: str, gateway: str) -> None:
    """A network of its own, where a healed container gets its address back (on the default bridge
    it may get another, which no partition does)."""
    api.create_network(name, driver="bridge", ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=subnet, gateway=gateway)]))


def cut(api, container: str, how: str, network: str) -> str | None:
    """Cut ``container`` off ``network`` (``partition``) or stall it (``pause``); its address, to heal it with."""
    if how == "pause":
        pause(api, container)
        return None
    address = api.inspect_container(container)["NetworkSettings"]["Networks"][network]["IPAddress"]
    api.disconnect_container_from_network(container, network)
    return address


def pause(api, container: str, tries: int = 10) -> None:
    """``docker pause``, tried again while cgroup v1's freezer cannot catch the container's busy
    processes: runc gives up after its own short loop ("unable to freeze") on a loaded machine and
    leaves retrying to its caller (opencontainers/runc#4388)."""
    for attempt in range(tries):
        try:
            api.pause(container)
            return
        except APIError as exc:
            if "unable to freeze" not in str(exc) or attempt == tries - 1:
                raise
            time.sleep(0.2)


def heal(api, container: str, how: str, network: str, address: str | None) -> None:
    try:
        if how == "pause":
            api.unpause(container)
        else:
            api.connect_container_to_network(container, network, ipv4_address=address)
    except NotFound:
        pass  # given up and killed meanwhile: nothing to heal
    except APIError:
        if running(api, container):
            raise
        # being killed as it is healed: nothing to heal


def running(api, container: str) -> bool:
    try:
        return api.inspect_container(container)["State"]["Running"]
    except NotFound:
        return False
