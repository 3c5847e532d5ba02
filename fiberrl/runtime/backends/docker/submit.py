"""``fiberrl submit`` on Docker: a run's master as a detached container that
outlives the submitting command, its state and logs, and cancelling it with
every job of its run."""
from __future__ import annotations

import re

from ..base import JobSpec, decode_text
from .common import (DOCKER_SOCKET, LABEL_PROCESS, LABEL_RUN, LABEL_SUBMITTED, DockerError, docker_host,
                     exit_code)
from .containers import start_hint


class SubmitMixin:
    """The DockerBackend's submit, describe, logs and cancel."""

    def submit(self, spec: JobSpec) -> str:
        """The run's master as a detached container that stays (with its logs
        and exit code) until ``cancel``; it gets the Docker socket to start its
        jobs, which default to its image."""
        import docker
        if not spec.run:
            raise ValueError("a submitted job needs spec.run, the run id its jobs are labelled with")
        name = f"fiberrl-{spec.run}-{_slug(spec.name) or 'master'}"
        labels = {LABEL_RUN: spec.run, LABEL_SUBMITTED: "1", LABEL_PROCESS: spec.name}
        env = dict(spec.env)  # what the submitting command chose to pass
        extra = []
        host = docker_host()
        if host.startswith("unix://"):
            extra.append((host[len("unix://"):], DOCKER_SOCKET, False))
        else:
            env.setdefault("DOCKER_HOST", host)
        container_id = self._create(spec, name, env, labels, self._host_config(spec, auto_remove=False,
                                                                            extra_mounts=extra))
        try:
            self._client().start(container_id)
        except docker.errors.APIError as exc:
            self._remove_quietly(container_id)
            raise DockerError(f"Docker could not start the master container {name}: "
                              f"{exc.explanation or exc}{start_hint(exc)}") from None
        return name

    def describe(self, job_id: str) -> dict:
        import docker
        try:
            info = self._client().inspect_container(job_id)
        except docker.errors.NotFound:
            return {"id": job_id, "state": "unknown", "exit_code": None, "where": None}
        state = info["State"]
        status = state.get("Status", "")
        kind = {"created": "pending", "running": "running", "paused": "running", "restarting": "running",
                "exited": "exited", "dead": "exited", "removing": "exited"}.get(status, "unknown")
        code = exit_code(int(state.get("ExitCode", 0))) if kind == "exited" else None
        return {"id": job_id, "state": kind, "exit_code": code,
                "where": f"container {info['Name'].lstrip('/')} ({info['Id'][:12]}) on {docker_host()}"}

    def logs(self, job_id: str, follow: bool = False):
        import docker
        try:
            stream = self._client().logs(job_id, stdout=True, stderr=True, stream=True, follow=follow)
        except docker.errors.NotFound:
            raise DockerError(f"no container {job_id} on the Docker daemon at {docker_host()} "
                              f"(cancelled, or removed by hand)") from None
        yield from decode_text(stream)

    def cancel(self, job_id: str) -> None:
        import docker
        run = None
        try:
            run = (self._client().inspect_container(job_id)["Config"].get("Labels") or {}).get(LABEL_RUN)
        except docker.errors.NotFound:
            match = re.match(r"fiberrl-([0-9a-f]{12})-", job_id)
            run = match.group(1) if match else None
        self._remove_quietly(job_id)  # first, so it starts no more jobs
        if run:
            # jobs being started while the sweep runs show up in the next one
            for _ in range(3):
                if not self._remove_all({"label": f"{LABEL_RUN}={run}"}):
                    break


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text or "").strip("-.")[:40]
