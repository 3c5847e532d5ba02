"""The stand-in's request handler: authentication, injected faults, the
record of every request, and routing to the store."""
from __future__ import annotations

import copy
import re
import time
from urllib.parse import parse_qs, urlparse

from .objects import ApiError, status_object
from .plumbing import _truthy
from .label_selector import parse_selector
from .streams import _Streams

_PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>pods|secrets)(?:/(?P<name>[^/]+)(?:/(?P<sub>log))?)?$")


class _Handler(_Streams):
    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def _dispatch(self, method: str) -> None:
        s = self.server_standin
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = self._body()
        with s.lock:
            s.requests.append({"method": method, "path": url.path, "query": query, "body": body, "time": time.time()})
        if self.headers.get("Authorization") != f"Bearer {s.token}":
            self._send(401, status_object(401, "Unauthorized", "Unauthorized"))
            return
        self._drop = False
        fault = s._fault(method, url.path)
        if fault is not None and fault["code"] is not None:
            self._send(fault["code"], status_object(fault["code"], "ServiceUnavailable", "injected fault"))
            return
        self._drop = fault is not None
        try:
            self._route(method, url.path, query, body)
        except ApiError as exc:
            self._send(exc.code, status_object(exc.code, exc.reason, exc.message))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(self, method, path, query, body) -> None:
        s = self.server_standin
        if method == "GET" and path == "/version":
            self._send(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fiberrl-standin",
                             "platform": "linux/amd64"})
            return
        if method == "GET" and path == "/api":
            self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
            return
        if method == "GET" and path == "/api/v1/namespaces":
            with s.lock:
                names = sorted({"default", s.namespace} | {ns for ns, _ in s.pods} | {ns for ns, _ in s.secrets})
            self._send(200, {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {"resourceVersion": str(s.rv)},
                             "items": [{"metadata": {"name": n}, "status": {"phase": "Active"}} for n in names]})
            return
        match = re.fullmatch(r"/api/v1/namespaces/([^/]+)", path)
        if method == "GET" and match:
            self._send(200, {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": match.group(1)},
                             "status": {"phase": "Active"}})
            return
        match = _PATH.match(path)
        if not match:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        ns, kind, name, sub = match.group("ns", "kind", "name", "sub")
        grace = query.get("gracePeriodSeconds")
        if grace is None and isinstance(body, dict):
            grace = body.get("gracePeriodSeconds")
        grace = None if grace is None else int(grace)
        if kind == "pods":
            if sub == "log" and method == "GET":
                self._log(ns, name, _truthy(query.get("follow")))
            elif name is None and method == "GET":
                if _truthy(query.get("watch")):
                    self._watch(ns, query)
                else:
                    s.stats["list"] += 1
                    self._send(200, s.list_pods(ns, query.get("labelSelector")))
            elif name is None and method == "POST":
                self._send(201, s.create_pod(ns, body or {}))
            elif name is None and method == "DELETE":
                deleted = []
                for pod_name in s.pod_names(query.get("labelSelector")):
                    with s.lock:
                        if (ns, pod_name) not in s.pods:
                            continue
                    try:
                        deleted.append(s.delete_pod(ns, pod_name, grace))
                    except ApiError:
                        pass
                self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": deleted})
            elif name is not None and sub is None and method == "GET":
                pod = s.pod(name, ns)
                if pod is None:
                    raise ApiError(404, "NotFound", f'pods "{name}" not found')
                self._send(200, pod)
            elif name is not None and sub is None and method == "DELETE":
                self._send(200, s.delete_pod(ns, name, grace))
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path} by the stand-in")
        else:
            if name is None and method == "POST":
                self._send(201, s.create_secret(ns, body or {}))
            elif name is None and method in ("GET", "DELETE"):
                match_labels = parse_selector(query.get("labelSelector"))
                with s.lock:
                    keys = [k for k, v in s.secrets.items() if k[0] == ns and match_labels(v["metadata"].get("labels"))]
                    items = [copy.deepcopy(s.secrets[k]) for k in keys]
                    if method == "DELETE":
                        for k in keys:
                            del s.secrets[k]
                    rv = s.rv
                self._send(200, {"kind": "SecretList", "apiVersion": "v1",
                                 "metadata": {"resourceVersion": str(rv)}, "items": items})
            elif name is not None and method in ("GET", "DELETE"):
                with s.lock:
                    secret = s.secrets.get((ns, name))
                    if secret is None:
                        raise ApiError(404, "NotFound", f'secrets "{name}" not found')
                    if method == "DELETE":
                        del s.secrets[(ns, name)]
                    secret = copy.deepcopy(secret)
                self._send(200, secret if method == "GET" else status_object(200, "", "") | {"status": "Success"})
            else:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path} by the stand-in")
