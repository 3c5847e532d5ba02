"""``fiberrl submit`` on Kubernetes: a run's master as a pod that outlives
the process that submitted it (never cleaned up with its owner), and
describe, logs and cancel by the pod's name."""
from __future__ import annotations

import re
import time
import uuid

from ..base import JobSpec, decode_text
from .api import api_message, close_streamed, consume, read_json
from .deletion import delete_matching, delete_pod
from .names import CONTAINER, PROCESS_LABEL, RUN_LABEL, SUBMITTED_LABEL, label_value, secret_name
from .pod_state import UNRECOVERABLE, _PodState, exit_code_of, update_state
from .run_secret import secret_of


class _SubmittedRuns:
    """The submit half of ``KubernetesBackend``, which gives it ``_connect()``,
    ``_secrets`` and ``_pod_body()``."""

    def submit(self, spec: JobSpec) -> str:
        connection = self._connect()
        secret = secret_of(spec)
        labels = {RUN_LABEL: spec.run, SUBMITTED_LABEL: "1"}
        self._secrets.ensure(connection, spec.run, secret, dict(labels), None)
        process = label_value(spec.name)
        if process:
            labels[PROCESS_LABEL] = process
        name = f"fiberrl-{spec.run}-master-{uuid.uuid4().hex[:6]}"
        body = self._pod_body(spec, name, labels, None)
        try:
            connection.create(connection.api.create_namespaced_pod, connection.namespace, body)
        except connection.client_module.ApiException as exc:
            raise RuntimeError(f"the kubernetes backend cannot create pod {name} in namespace "
                               f"{connection.namespace}: {api_message(exc)}") from None
        return name

    def _read_pod(self, name: str) -> dict | None:
        connection = self._connect()
        try:
            return read_json(connection.api.read_namespaced_pod(name, connection.namespace, _preload_content=False))
        except connection.client_module.ApiException as exc:
            if exc.status == 404:
                return None
            raise RuntimeError(f"cannot read pod {name}: {api_message(exc)}") from None

    def describe(self, job_id: str) -> dict:
        pod = self._read_pod(job_id)
        namespace = self._connect().namespace
        if pod is None:
            return {"id": job_id, "state": "unknown", "exit_code": None, "where": None}
        status = pod.get("status") or {}
        containers = status.get("containerStatuses") or []
        mine = [c for c in containers if c.get("name") == CONTAINER] or containers
        terminated = ((mine or [{}])[0].get("state") or {}).get("terminated")
        phase = status.get("phase")
        state = {"Pending": "pending", "Running": "running", "Succeeded": "exited", "Failed": "exited"}.get(
            phase, "unknown")
        exit_code = exit_code_of(terminated) if terminated else None
        node = (pod.get("spec") or {}).get("nodeName")
        where = f"pod {namespace}/{job_id}" + (f" on node {node}" if node else "")
        return {"id": job_id, "state": state, "exit_code": exit_code, "where": where}

    def logs(self, job_id: str, follow: bool = False):
        connection = self._connect()
        ApiException = connection.client_module.ApiException

        def missing():
            return LookupError(f"no pod {job_id} in namespace {connection.namespace}")

        def chunks():
            while True:
                try:
                    response = connection.api.read_namespaced_pod_log(
                        job_id, connection.namespace, follow=follow, _preload_content=False)
                    break
                except ApiException as exc:
                    if exc.status == 404:
                        raise missing() from None
                    if exc.status != 400:
                        raise RuntimeError(f"cannot read the log of pod {job_id}: {api_message(exc)}") from None
                    # 400: the container has not started yet
                    if not follow:
                        return
                    pod = self._read_pod(job_id)
                    if pod is None:
                        raise missing() from None
                    state = _PodState()
                    update_state(state, pod)
                    if state.waiting and state.waiting.split(":")[0] in UNRECOVERABLE:
                        raise RuntimeError(f"pod {job_id} cannot start: {state.waiting}") from None
                    time.sleep(1.0)
            try:
                chunks = response.stream(amt=None, decode_content=True) if follow else [response.data]
                yield from decode_text(chunks)
            finally:
                close_streamed(response)

        return chunks()

    def cancel(self, job_id: str) -> None:
        connection = self._connect()
        ApiException = connection.client_module.ApiException
        pod = self._read_pod(job_id)
        if pod is not None:
            run = (pod["metadata"].get("labels") or {}).get(RUN_LABEL)
        else:
            found = re.fullmatch(r"fiberrl-([0-9a-f]+)-master-[0-9a-f]+", job_id)
            run = found.group(1) if found else None
        # the master first, so it starts no more pods, then the rest of its run
        delete_pod(connection, connection.namespace, job_id, 0)
        if not run:
            return
        try:
            delete_matching(connection, "pod", f"{RUN_LABEL}={run}")
        except ApiException as exc:
            raise RuntimeError(f"cannot remove the pods of run {run}: {api_message(exc)}") from None
        try:
            consume(connection.api.delete_namespaced_secret(secret_name(run), connection.namespace,
                                                             _preload_content=False))
        except ApiException as exc:
            if exc.status != 404:
                raise RuntimeError(f"cannot remove the Secret of run {run}: {api_message(exc)}") from None
