"""Talking to the Docker daemon: the API client (and a clear error when there
is no daemon), the container this process runs in, and killing and removing
containers."""
from __future__ import annotations

import logging
import socket
import threading

from .common import CONTAINER_ID, SOCKET_VOLUME, STARTERS, DockerError, docker_host
from .probes import in_container, own_container_candidates

log = logging.getLogger("fiberrl")


class DaemonMixin:
    """The DockerBackend's connection to the daemon; uses its ``_api``,
    ``_version``, ``_client_lock`` and ``_me``."""

    def _client(self, fresh: bool = False):
        """The low-level API client (``fresh``: a new one, e.g. for the event stream)."""
        if self._api is not None and not fresh:
            return self._api
        with self._client_lock:
            if self._api is not None and not fresh:
                return self._api
            try:
                import docker
            except ImportError:
                raise DockerError("the docker backend needs the docker Python package: pip install docker") from None
            try:
                api = docker.APIClient(**docker.utils.kwargs_from_env(), version=self._version or "auto",
                                       timeout=120, max_pool_size=4 * STARTERS)
            except docker.errors.DockerException as exc:
                raise DockerError(self._unreachable(exc)) from None
            if fresh:
                return api
            self._version = api.api_version
            self._api = api
            return api

    @staticmethod
    def _unreachable(exc) -> str:
        message = f"cannot reach the Docker daemon at {docker_host()} (DOCKER_HOST): {exc}. "
        if in_container():
            return message + (f"This process runs in a container: to start jobs from it, mount the Docker socket "
                              f"into it, e.g. add {SOCKET_VOLUME} to the `volumes` setting (FIBERRL_VOLUMES or "
                              f"configure(volumes=...)) of the jobs that start processes")
        return message + "Start the daemon (`dockerd &`, or `systemctl start docker`) or point DOCKER_HOST at it"

    def _me_container(self) -> dict | None:
        """``docker inspect`` of the container this process runs in, or None on a host."""
        if self._me is False:
            api = self._client()
            import docker
            me = None
            for candidate in own_container_candidates():
                try:
                    info = api.inspect_container(candidate)
                except docker.errors.APIError:
                    continue
                if info["Id"].startswith(candidate) and (
                        CONTAINER_ID.fullmatch(candidate) or info["Config"].get("Hostname") == socket.gethostname()):
                    me = info
                    break
            self._me = me
        return self._me

    def _kill(self, container_id: str, sig) -> None:
        import docker
        try:
            self._client().kill(container_id, signal=int(sig))
        except docker.errors.NotFound:
            pass  # gone already
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: not running (any more)
                raise

    def _remove_quietly(self, container_id: str) -> None:
        import docker
        try:
            self._client().remove_container(container_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                log.warning("could not remove container %s: %s", container_id[:12], exc)

    def _remove_all(self, filters: dict) -> list[str]:
        """Force-remove every container matching ``filters`` (in parallel)."""
        try:
            containers = self._client().containers(all=True, filters=filters)
        except Exception as exc:  # at exit: say it, do not raise
            log.warning("could not list containers to remove (%s): %s", filters, exc)
            return []
        ids = [c["Id"] for c in containers]
        threads = []
        for container_id in ids[1:]:
            thread = threading.Thread(target=self._remove_quietly, args=(container_id,), daemon=True)
            try:
                thread.start()
            except RuntimeError:  # interpreter shutting down: one at a time
                self._remove_quietly(container_id)
                continue
            threads.append(thread)
        if ids:
            self._remove_quietly(ids[0])
        for thread in threads:
            thread.join(60)
        return ids
