"""The stand-in API server's routes: which path is which resource, RBAC as ``forbidden`` says,
and one handler method per route (:func:`make_handler`). Split from :mod:`standins.k8s_api`,
whose :class:`~standins.k8s_api.KubeAPIStandIn` holds the state these read and change.
"""

from __future__ import annotations

import copy
import re
import socket
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from standins.base import StandInHandler
from standins.k8s_objects import namespace_object, status_object

if TYPE_CHECKING:
    from standins.k8s_api import KubeAPIStandIn

_ROUTES = [
    ("pods", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")),
    ("pods_all", re.compile(r"^/api/v1/pods$")),
    ("pod", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")),
    ("pod_eviction", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/eviction$")),
    ("nodes", re.compile(r"^/api/v1/nodes$")),
    ("node", re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$")),
    ("events", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events$")),
    ("namespaces", re.compile(r"^/api/v1/namespaces$")),
    ("namespace", re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)$")),
    ("jobs", re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs$")),
    ("job", re.compile(r"^/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs/(?P<name>[^/]+)(?P<status>/status)?$")),
    ("version", re.compile(r"^/version/?$")),
    ("core_object", re.compile(r"^/api/(?P<version>v1)/namespaces/(?P<ns>[^/]+)/(?P<plural>secrets|configmaps|"
                               r"persistentvolumeclaims|serviceaccounts|resourcequotas|limitranges)(?:/(?P<name>[^/]+)(?P<status>/status)?)?$")),
    ("access_review", re.compile(r"^/apis/authorization\.k8s\.io/v1/selfsubjectaccessreviews$")),
    ("custom", re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)"
                          r"(?:/(?P<name>[^/]+)(?P<status>/status)?)?$")),
    ("custom_all", re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/(?P<plural>[^/]+)$")),
    ("custom_cluster", re.compile(r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/(?P<plural>[^/]+)/(?P<name>[^/]+)$")),
]

_RESOURCE = {
    "pods": "pods",
    "pods_all": "pods",
    "pod": "pods",
    "pod_eviction": "pods/eviction",
    "nodes": "nodes",
    "node": "nodes",
    "events": "events",
    "namespaces": "namespaces",
    "namespace": "namespaces",
    "jobs": "jobs",
    "job": "jobs",
}


def make_handler(api: KubeAPIStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(StandInHandler):
        server_version = "kube-apiserver-standin/1.31"
        unrecorded_headers = ("authorization",)

        def setup(self) -> None:
            super().setup()
            # As the real API server (Go sets TCP_NODELAY): without it Nagle's algorithm and the
            # client's delayed ACKs hold each small watch chunk back for tens of milliseconds.
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def handle(self) -> None:
            try:
                super().handle()
            except (ConnectionResetError, BrokenPipeError):  # the client went away: not an error here
                self.close_connection = True

        def _status(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
            self._json(code, status_object(code, reason, message, details))

        def do_DELETE(self) -> None:
            self._handle("DELETE")

        def do_PATCH(self) -> None:
            self._handle("PATCH")

        def do_PUT(self) -> None:
            self._handle("PUT")

        def _handle(self, method: str) -> None:
            parts, query, body, authorized = self._receive(api, method)
            if not authorized:
                self._status(401, "Unauthorized", "Unauthorized")
                return
            route = next(((n, m) for n, pattern in _ROUTES if (m := pattern.match(parts.path))), None)
            if route is None:
                self._status(404, "NotFound", "the server could not find the requested resource")
                return
            name, match = route
            groups = match.groupdict()
            custom = name in ("custom", "custom_all", "custom_cluster", "core_object")
            if name == "core_object":
                groups["group"] = ""
            if method in ("PATCH", "PUT") and not custom:
                return self._not_allowed(method)
            resource = groups["plural"] if custom else _RESOURCE.get(name)
            collection = name in ("pods", "pods_all", "nodes", "events", "namespaces", "jobs", "custom_all") or (
                custom and not groups.get("name"))
            verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(
                method, "list" if collection else "get")
            if query.get("watch", "").lower() in ("true", "1"):
                verb = "watch"
            names = (resource, f"{resource}.{groups['group']}") if custom and groups["group"] else (resource,)
            if any(n in api.forbidden or f"{verb} {n}" in api.forbidden for n in names):
                scope = f'in the namespace "{groups["ns"]}"' if groups.get("ns") else "at the cluster scope"
                group = groups["group"] if custom else "batch" if resource == "jobs" else ""
                subject = f"{resource}.{group}" if custom and group else resource
                if custom and groups.get("name"):
                    subject += f' "{groups["name"]}"'
                rbac_resource = f"{resource}/status" if groups.get("status") else resource
                self._status(
                    403,
                    "Forbidden",
                    f'{subject} is forbidden: User "system:serviceaccount:llmpack:llmpack-runner" cannot {verb} '
                    f'resource "{rbac_resource}" in API group "{group}" {scope}',
                    {"group": group, "kind": resource, **({"name": groups["name"]} if groups.get("name") else {})}
                    if custom else {"kind": resource},
                )
                return
            try:
                getattr(self, f"_r_{name}")(method, query, body, **groups)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        # -------------------------------------------------------------- routes

        def _not_allowed(self, method: str) -> None:
            self._status(405, "MethodNotAllowed",
                         f"the server does not allow this method on the requested resource ({method})")

        def _r_pods(self, method: str, query: dict[str, str], body: Any, ns: str | None = None) -> None:
            if method != "GET":
                return self._not_allowed(method)
            if query.get("watch", "").lower() in ("true", "1"):
                return api._watch(self, query, ns)
            self._json(200, api._list(api._pods, query, ns, "Pod"))

        def _r_pods_all(self, method: str, query: dict[str, str], body: Any) -> None:
            self._r_pods(method, query, body, None)

        def _r_pod(self, method: str, query: dict[str, str], body: Any, ns: str, name: str) -> None:
            with api._cond:
                obj = copy.deepcopy(api._pods.get((ns, name)))
            if obj is None:
                return self._status(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
            self._json(200, obj)

        def _r_pod_eviction(self, method: str, query: dict[str, str], body: Any, ns: str, name: str) -> None:
            from standins.preemption import evict  # what the API server does for an Eviction

            if method != "POST":
                return self._not_allowed(method)
            self._json(*evict(api, ns, name))

        def _r_nodes(self, method: str, query: dict[str, str], body: Any) -> None:
            self._json(200, api._list(api._nodes, query, None, "Node"))

        def _r_node(self, method: str, query: dict[str, str], body: Any, name: str) -> None:
            with api._cond:
                obj = copy.deepcopy(api._nodes.get(name))
            if obj is None:
                return self._status(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
            self._json(200, obj)

        def _r_events(self, method: str, query: dict[str, str], body: Any, ns: str) -> None:
            if query.get("watch", "").lower() in ("true", "1"):
                return api._watch(self, query, ns, "events")
            self._json(200, api._list(api._events, query, ns, "Event"))

        def _r_namespaces(self, method: str, query: dict[str, str], body: Any) -> None:
            items = [namespace_object(n, api.namespace_labels.get(n)) for n in sorted(api.namespaces)]
            self._json(200, {"kind": "NamespaceList", "apiVersion": "v1",
                             "metadata": {"resourceVersion": str(api._rv)}, "items": items})

        def _r_namespace(self, method: str, query: dict[str, str], body: Any, ns: str) -> None:
            if ns not in api.namespaces:
                return self._status(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
            self._json(200, namespace_object(ns, api.namespace_labels.get(ns)))

        def _r_jobs(self, method: str, query: dict[str, str], body: Any, ns: str) -> None:
            if method == "POST":
                if ns not in api.namespaces:
                    return self._status(404, "NotFound", f'namespaces "{ns}" not found',
                                        {"name": ns, "kind": "namespaces"})
                if not isinstance(body, dict):
                    return self._status(400, "BadRequest", "the body of the request was in an unknown format")
                code, obj = api._create_job(ns, body)
                return self._json(code, obj)
            if method != "GET":
                return self._not_allowed(method)
            self._json(200, api._list({k: v for k, v in api.jobs.items()}, query, ns, "Job")
                       | {"apiVersion": "batch/v1"})

        def _r_job(self, method: str, query: dict[str, str], body: Any, ns: str, name: str, status: str | None) -> None:
            with api._cond:
                job = api.jobs.get((ns, name))
                if job is not None and method == "DELETE":
                    del api.jobs[(ns, name)]
                job = copy.deepcopy(job)
            if job is None:
                return self._status(404, "NotFound", f'jobs.batch "{name}" not found',
                                    {"name": name, "group": "batch", "kind": "jobs"})
            if method == "DELETE":
                return self._json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                        "details": {"name": name, "group": "batch", "kind": "jobs",
                                                    "uid": job["metadata"]["uid"]}})
            self._json(200, job)

        def _r_version(self, method: str, query: dict[str, str], body: Any) -> None:
            self._json(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.5-standin", "platform": "linux/amd64"})

        def _r_custom(self, method: str, query: dict[str, str], body: Any, group: str, version: str, plural: str,
                      ns: str | None = None, name: str | None = None, status: str | None = None) -> None:
            res = api.custom_resources.get((group, version, plural))
            if res is None:  # no such CRD (or version) installed
                return self._status(404, "NotFound", "the server could not find the requested resource")
            if name is None:
                if method == "POST" and ns is not None:
                    if ns not in api.namespaces:
                        return self._status(404, "NotFound", f'namespaces "{ns}" not found',
                                            {"name": ns, "kind": "namespaces"})
                    if not isinstance(body, dict):
                        return self._status(400, "BadRequest", "the body of the request was in an unknown format")
                    # the record keeps what was sent
                    return self._json(*api._create_custom(res, ns, copy.deepcopy(body)))
                if method != "GET":
                    return self._not_allowed(method)
                if query.get("watch", "").lower() in ("true", "1"):
                    return api._watch(self, query, ns, res.resource)
                listed = api._list(api.custom_objects[res.resource], query, ns, res.kind)
                for item in listed.get("items") or ():  # served at the version asked for (an identity conversion here)
                    item["apiVersion"] = res.api_version
                return self._json(200, listed | {"apiVersion": res.api_version})
            if method == "GET":
                with api._cond:
                    obj = copy.deepcopy(api.custom_objects[res.resource].get((ns or "", name)))
                if obj is not None:
                    obj["apiVersion"] = res.api_version
                return self._json(200, obj) if obj is not None else self._json(*api._not_found(res, name))
            if method == "PATCH":
                content_type = self.headers.get("Content-Type") or ""
                return self._json(*api._patch_custom(res, ns, name, body, content_type, bool(status)))
            if method == "DELETE" and not status:
                return self._json(*api._delete_custom(res, ns, name, body, query))
            self._not_allowed(method)

        def _r_custom_all(self, method: str, query: dict[str, str], body: Any, group: str, version: str,
                          plural: str) -> None:
            self._r_custom(method, query, body, group, version, plural)

        def _r_custom_cluster(self, method: str, query: dict[str, str], body: Any, group: str, version: str,
                              plural: str, name: str) -> None:
            res = api.custom_resources.get((group, version, plural))
            if res is None or res.namespaced or method != "GET":  # only reads of cluster-scoped objects
                return self._status(404, "NotFound", "the server could not find the requested resource")
            self._r_custom(method, query, body, group, version, plural, None, name)

        def _r_core_object(self, method: str, query: dict[str, str], body: Any, version: str, ns: str, plural: str,
                           name: str | None = None, status: str | None = None, group: str = "") -> None:
            self._r_custom(method, query, body, "", version, plural, ns, name, status)

        def _r_access_review(self, method: str, query: dict[str, str], body: Any) -> None:
            """``SelfSubjectAccessReview``: allowed unless :attr:`KubeAPIStandIn.forbidden` names the resource or
            verb."""
            if method != "POST" or not isinstance(body, dict):
                return self._not_allowed(method)
            attrs = (body.get("spec") or {}).get("resourceAttributes") or {}
            allowed = api.allows(attrs.get("verb", ""), attrs.get("resource", ""), attrs.get("group", ""))
            status = {"allowed": allowed, **({} if allowed else {"reason": "no RBAC rule allows it"})}
            self._json(201, {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                             "metadata": {"creationTimestamp": None}, "spec": body.get("spec") or {}, "status": status})

    return Handler
