"""The connection to the API server: the client configured from a kubeconfig
or a pod's service account, the namespace, the pod this process runs in,
and creates retried over transient failures."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time

from .. import probes
from .api import api_message, consume, read_json
from .names import POD_NAME_ENV, POD_NAMESPACE_ENV

log = logging.getLogger("fiberrl")

CREATE_ATTEMPTS = 4
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def route_source(host: str, port: int) -> str:
    """The local address the route to ``host`` (a name or an address) leaves from."""
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)
        address = infos[0][4][0]
    except (OSError, IndexError):
        address = None
    if address is None or address.startswith("127."):
        return "127.0.0.1"
    return probes.route_source(address, port) or socket.gethostbyname(socket.gethostname())


class _Connection:
    """The API client, namespace and this process's own pod, for one kubeconfig."""

    def __init__(self, kubeconfig: str, namespace: str):
        try:
            from kubernetes import client, config as kconfig
        except ImportError as exc:
            raise RuntimeError("the kubernetes backend needs the kubernetes client: pip install kubernetes") from exc
        self.client_module = client
        configuration = client.Configuration()
        in_cluster_env = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        path = os.path.expanduser(kubeconfig) if kubeconfig else ""
        # a kubeconfig named on a workstation does not exist in the pods it starts: they use their own account
        self.in_cluster = in_cluster_env and (not path or not os.path.exists(path))
        context_namespace = None
        if self.in_cluster:
            try:
                kconfig.load_incluster_config(client_configuration=configuration)
            except kconfig.ConfigException as exc:
                raise RuntimeError(f"the kubernetes backend cannot use this pod's service account: {exc}") from None
        else:
            if not path:
                path = (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
            if not os.path.exists(path):
                raise RuntimeError(
                    f"the kubernetes backend found no cluster: no kubeconfig at {path} and not inside a pod; "
                    f"set kubernetes_config (FIBERRL_KUBERNETES_CONFIG) to a kubeconfig file")
            try:
                kconfig.load_kube_config(config_file=path, client_configuration=configuration)
                _, active = kconfig.list_kube_config_contexts(config_file=path)
                context_namespace = (active or {}).get("context", {}).get("namespace")
            except (kconfig.ConfigException, OSError, ValueError, KeyError) as exc:
                raise RuntimeError(f"the kubernetes backend cannot use the kubeconfig {path}: {exc}") from None
        self.host = configuration.host
        self.api = client.CoreV1Api(client.ApiClient(configuration))
        self.namespace = (namespace or os.environ.get(POD_NAMESPACE_ENV)
                          or (self._service_account_namespace() if self.in_cluster else None)
                          or context_namespace or self._service_account_namespace() or "default")
        self._pod: dict | None = None
        self._pod_read = False
        self._lock = threading.Lock()
        self.route_source: str | None = None  # the local address the route to the API server leaves from

    @staticmethod
    def _service_account_namespace() -> str | None:
        try:
            with open(os.path.join(SERVICE_ACCOUNT_DIR, "namespace")) as fh:
                return fh.read().strip() or None
        except OSError:
            return None

    @staticmethod
    def own_pod_name() -> str | None:
        """The pod this process runs in: named by the backend that started it,
        else (a pod someone else started) its hostname."""
        name = os.environ.get(POD_NAME_ENV)
        if not name and os.environ.get("KUBERNETES_SERVICE_HOST"):
            name = os.environ.get("HOSTNAME") or socket.gethostname()
        return name or None

    def own_pod(self) -> dict | None:
        """This process's pod as the API shows it, or None outside a pod."""
        with self._lock:
            if not self._pod_read:
                name = self.own_pod_name()
                if name:
                    namespace = (os.environ.get(POD_NAMESPACE_ENV) or self._service_account_namespace()
                                 or self.namespace)
                    try:
                        self._pod = read_json(self.api.read_namespaced_pod(name, namespace, _preload_content=False))
                    except self.client_module.ApiException as exc:
                        log.warning("kubernetes backend: cannot read this process's pod %s/%s (%s); its jobs will "
                                    "not be owned by it", namespace, name, api_message(exc))
                self._pod_read = True
            return self._pod

    def create(self, call, *args) -> None:
        """A create request, retried over transient failures (a lost connection,
        429, 5xx); a retry answered 409 found the object an earlier try made."""
        import urllib3
        ApiException = self.client_module.ApiException
        for attempt in range(CREATE_ATTEMPTS):
            last = attempt == CREATE_ATTEMPTS - 1
            try:
                consume(call(*args, _preload_content=False))
                return
            except ApiException as exc:
                if exc.status == 409 and attempt > 0:
                    return
                if exc.status not in (429, 500, 502, 503, 504) or last:
                    raise
            except (OSError, urllib3.exceptions.HTTPError) as exc:
                if last:
                    raise RuntimeError(f"the kubernetes API server at {self.host} is unreachable: {exc!r}") from None
            time.sleep(0.5 * 2 ** attempt)
