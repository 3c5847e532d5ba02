"""Docker backend: each job is a container on one Docker daemon.

A job's container runs the job's command in the configured image (or, from
a process that itself runs in a container, that container's image), on the
configured network (or that container's, or ``bridge``), with the working
directory and the ``volumes`` setting mounted at the same paths, and is
removed by the daemon when it exits (``auto_remove``).

Because exited containers disappear, the daemon's event stream is the
source of truth: one watcher thread per process follows the events of the
containers this process labelled as its own and keeps each job's state and
exit code in memory, so ``status`` costs nothing (the Pool asks it twice a
second for every worker still starting).  ``create_job`` creates the
container (bad images and mounts fail there, at once) and hands the start
to a few starter threads, so starting 256 pool workers does not wait for
256 sequential ``docker start`` calls.

Docker reports a container whose process died of signal N as exit code
128+N; jobs report -N, as ``multiprocessing`` does (137 -> -9, 143 -> -15;
a job that itself exits with 129..159 reads as a signal too).

Jobs reach this process at its address on their network: on the host, the
network's gateway (docker0's 172.17.0.1 for ``bridge``); in a container, its
own address there.  A job that starts processes itself needs the Docker API:
mount the socket with the ``volumes`` setting.  Whoever can use the Docker
API is root on the Docker host, so the run's secret travels in the job's
environment.

The parts: ``backend`` (DockerBackend: create, status, wait, terminate,
cleanup), ``events`` (the watcher), ``tracking`` (each job's state and how it
ends), ``starting`` (the starter threads), ``containers`` (a JobSpec as a
container: image, mounts, limits, GPUs), ``network`` (the jobs' network and
where they reach this process), ``daemon`` (the API client, this process's
container, removing containers), ``probes`` (what this machine says without
the API), ``submit`` (``fiberrl submit``), ``common`` (labels, exit codes,
DockerError).
"""
from .backend import DockerBackend
from .common import (CONTAINER_ID, DOCKER_SOCKET, LABEL_OWNER, LABEL_PROCESS, LABEL_RUN, LABEL_SUBMITTED,
                     SOCKET_VOLUME, STARTERS, DockerError, docker_host, exit_code)
from ..probes import can_bind, interface_address, route_source
from .probes import in_container, own_container_candidates

__all__ = ["CONTAINER_ID", "DOCKER_SOCKET", "LABEL_OWNER", "LABEL_PROCESS", "LABEL_RUN", "LABEL_SUBMITTED",
           "SOCKET_VOLUME", "STARTERS", "DockerBackend", "DockerError", "can_bind", "docker_host", "exit_code",
           "in_container", "interface_address", "own_container_candidates", "route_source"]
