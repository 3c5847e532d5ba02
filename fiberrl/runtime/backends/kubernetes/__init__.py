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
* ``connection``: the API client (kubeconfig or in-cluster), namespace and own pod,
  creates retried over transient failures;
* ``watch``: the list+watch that feeds ``cache`` (``PodCache``);
* ``pod_state``: what a pod's status says (``_PodState``, exit codes);
* ``jobs``: the handle on one pod and the verdict on its job;
* ``pod_spec``: a JobSpec as a pod spec;
* ``run_secret``: the run's Secret;
* ``deletion``: deleting one pod, or everything matching a selector;
* ``api``: API errors, reading responses;
* ``names``: environment variables, labels and names the pods share.
"""
from .backend import KubernetesBackend

__all__ = ["KubernetesBackend"]
