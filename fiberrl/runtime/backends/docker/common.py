"""What every part of the docker backend shares: the labels it puts on
containers, the Docker socket, exit codes as jobs report them, the daemon's
address and the error that says what to do."""
from __future__ import annotations

import os
import re

LABEL_RUN = "fiberrl.run"
LABEL_OWNER = "fiberrl.owner"
LABEL_PROCESS = "fiberrl.process"
LABEL_SUBMITTED = "fiberrl.submitted"
DOCKER_SOCKET = "/var/run/docker.sock"
SOCKET_VOLUME = f"{DOCKER_SOCKET}:{DOCKER_SOCKET}"
STARTERS = 8  # containers started at once
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


def exit_code(code: int) -> int:
    """A container's exit code as ``multiprocessing`` shows it: 128+N (the
    container's process died of signal N) becomes -N."""
    if 128 < code < 128 + 32:
        return -(code - 128)
    return code


def docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or f"unix://{DOCKER_SOCKET}"


class DockerError(RuntimeError):
    """The Docker daemon cannot be used, or refused a request; says what to do."""
