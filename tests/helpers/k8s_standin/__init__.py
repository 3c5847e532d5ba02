"""A stand-in Kubernetes API server, for testing the kubernetes backend where
no cluster can run.

It speaks the part of the core/v1 REST API the official ``kubernetes``
client uses for pods, pod logs and secrets -- create, get, list with label
selectors, watch (newline-delimited WatchEvents with resource versions,
bookmarks, and ``410 Gone`` for a version it no longer holds), delete one,
delete a collection -- and it really runs each pod's command as a process on
this machine, as a one-node kubelet would:

* env from the container's ``env`` only (``value``, ``secretKeyRef``,
  ``fieldRef`` of the pod's name, namespace, uid, ``status.podIP`` =
  127.0.0.1), plus ``PATH`` from this server's environment; ``$(VAR)``
  references are expanded and ``$$`` unescaped as Kubernetes does;
* cwd = ``workingDir``; stdout and stderr into the pod's log;
* phases Pending -> Running -> Succeeded/Failed, the container's
  ``terminated.exitCode`` (128+signal when a signal killed it);
* deleting a pod SIGTERMs its process, SIGKILLs the process group after the
  grace period (at once for grace 0), then removes it; deleting an owner
  deletes its dependents (``ownerReferences``), cascading;
* an image named ``missing/...`` never pulls (waiting ErrImagePull, then
  ImagePullBackOff); a pod asking for more than the node has
  (``capacity``) stays Pending, PodScheduled=False Unschedulable;
  ``set_quota(pods=N)`` makes creating a pod past N answer 403 exceeded quota;
  ``inject()`` makes chosen requests fail, or succeed with the answer lost;
  ``force_gone()`` makes watches end with 410 Gone so clients must re-list.

Every request is recorded (method, path, query, parsed body) so tests can
check the exact specs the backend sent.  Mounts are recorded, not made.

The modules: ``server`` (``StandIn``: the HTTP server, kubeconfig, recorded
requests, injected faults) over ``store`` (pods, Secrets, resource versions,
deletion and garbage collection); ``handler`` routes requests, ``streams``
answers watches and logs, ``plumbing`` writes HTTP; ``kubelet`` runs pods,
``container_env`` builds their environment; ``scheduling`` (capacity,
quota), ``label_selector`` and ``objects`` (timestamps, Status, ApiError).
"""
from __future__ import annotations

from .container_env import expand
from .kubelet import UNSCHEDULABLE_IMAGE_PREFIX
from .objects import NODE, POD_IP, ApiError, status_object
from .scheduling import quantity
from .label_selector import parse_selector
from .server import StandIn

__all__ = ["StandIn", "ApiError", "status_object", "parse_selector", "expand", "quantity", "NODE", "POD_IP",
           "UNSCHEDULABLE_IMAGE_PREFIX"]
