"""Kubernetes backend: each job is a pod.

One pod per job (``restartPolicy: Never``), in the configured namespace,
from the configured image (else the image of the pod this process runs in).
The run's secret lives in one Kubernetes Secret per run (``fiberrl-<run>``)
and reaches pods as ``FIBERRL_RUN_SECRET`` through a ``secretKeyRef``, never
as a plain value in a pod spec.  Every pod also gets its own name, namespace
and IP through the downward API, so a process in it can find its pod: the
pods it starts then carry an ``ownerReference`` to it, and deleting a pod
deletes every pod below it.  A process outside the cluster has no pod to own
its jobs; a reaper process deletes them by label if it is killed.

Job states come from one list+watch of this process's pods (label selector,
resource versions, a re-list after ``410 Gone``) into a cache, so
``status()`` costs no request however often a Pool polls it.

The modules:

* ``backend``: ``KubernetesBackend``, jobs as pods, this process's own pod, cleanup;
* ``submitted``: ``fiberrl submit``, describe, logs and cancel of a run's master pod;
* ``connection``: the API client (kubeconfig or in-cluster), namespace and own pod;
* ``watch``: the list+watch that feeds ``cache`` (``PodCache``);
* ``pod_state``: what a pod's status says (``_PodState``, exit codes);
* ``jobs``: the handle on one pod and the verdict on its job;
* ``pod_spec``: a JobSpec as a pod spec;
* ``run_secret``: the run's Secret;
* ``deletion``: deleting one pod, or everything matching a selector;
* ``api``: API errors, create retries, reading responses;
* ``names``: environment variables, labels and names the pods share.
"""
from __future__ import annotations

from .api import CREATE_ATTEMPTS, api_message
from .backend import KubernetesBackend
from .connection import SERVICE_ACCOUNT_DIR, _Connection, route_source
from .deletion import delete_matching
from .names import (CONFIG_ENV, CONTAINER, OWNER_LABEL, POD_IP_ENV, POD_NAME_ENV, POD_NAMESPACE_ENV, POD_SET_ENV,
                    PROCESS_LABEL, RUN_LABEL, SECRET_ENV, SECRET_FILE_ENV, SECRET_KEY, SUBMITTED_LABEL, label_value,
                    secret_name)
from .pod_spec import TERMINATE_GRACE, cpu_quantity, escape_expansion, pod_config
from .pod_state import UNRECOVERABLE, exit_code_of
from .watch import WATCH_READ_TIMEOUT, WATCH_SECONDS

__all__ = [
    "KubernetesBackend", "_Connection", "route_source", "label_value", "secret_name", "escape_expansion",
    "pod_config", "cpu_quantity", "exit_code_of", "api_message", "delete_matching",
    "SERVICE_ACCOUNT_DIR", "POD_NAME_ENV", "POD_NAMESPACE_ENV", "POD_IP_ENV", "SECRET_ENV", "SECRET_FILE_ENV",
    "POD_SET_ENV", "CONFIG_ENV", "RUN_LABEL", "OWNER_LABEL", "PROCESS_LABEL", "SUBMITTED_LABEL", "CONTAINER",
    "SECRET_KEY", "TERMINATE_GRACE", "UNRECOVERABLE", "CREATE_ATTEMPTS", "WATCH_SECONDS", "WATCH_READ_TIMEOUT",
]
