"""A stand-in Argo Server (Workflows REST API) on 127.0.0.1, for Hera's ``WorkflowsService``.

It speaks what ``argo submit`` and Hera's ``WorkflowsService`` send to an Argo Server (the
gRPC gateway's JSON, camelCase Kubernetes objects, errors as ``{"code": <gRPC code>, "message"}``).

In full: docs/internals/stand-ins.md, "The Argo Server stand-in".
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import string
import threading
import uuid
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any

from standins.base import StandInHandler, StandInServer
from standins.base import utc_now as _now

INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED = 3, 5, 6, 7, 16
TERMINAL = {"Succeeded", "Failed", "Error"}
_PARAM_REF = re.compile(r"\{\{\s*workflow\.parameters\.([A-Za-z0-9_.-]+)\s*\}\}")


# Argo's util/resource/duration.go: each resource's request is counted in units of this much.
_DENOMINATORS = {"cpu": 1.0, "memory": 100 * 2**20, "storage": 10 * 2**30, "ephemeral-storage": 10 * 2**30}
_SUFFIXES = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(text: Any) -> float:
    """A Kubernetes resource quantity (``4``, ``500m``, ``16Gi``) as a number."""
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text).strip())
    if not match or (match.group(2) and match.group(2) not in _SUFFIXES):
        raise ValueError(f"not a quantity: {text!r}")
    return float(match.group(1)) * _SUFFIXES.get(match.group(2), 1.0)


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def resources_duration(pod: dict[str, Any]) -> dict[str, int]:
    """What Argo records for a pod (``DurationForPod``): per container, init containers too, each
    resource request (else limit; else Argo's defaults ``cpu: 100m``, ``memory: 100Mi``) in units
    of :data:`_DENOMINATORS` (1 for the rest, ``nvidia.com/gpu`` among them), times the whole
    seconds the container ran (terminated ``finishedAt - startedAt``; 0 while it runs), summed."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    states = {c["name"]: c.get("state") or {} for c in [*(status.get("initContainerStatuses") or []),
                                                       *(status.get("containerStatuses") or [])]}
    out: dict[str, int] = {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        res = container.get("resources") or {}
        requested = {"cpu": "100m", "memory": "100Mi", **(res.get("limits") or {}), **(res.get("requests") or {})}
        term = states.get(container["name"], {}).get("terminated") or {}
        if not term.get("startedAt") or not term.get("finishedAt"):
            continue
        age = int(_epoch(term["finishedAt"]) - _epoch(term["startedAt"]))
        for name, q in requested.items():
            out[name] = out.get(name, 0) + int(quantity(q) * age / _DENOMINATORS.get(name, 1.0))
    return out


def workflow_nodes(wf: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``status.nodes`` of a DAG Workflow from its pods: the root DAG node and a Pod node per pod."""
    name = wf["metadata"]["name"]
    nodes: dict[str, dict[str, Any]] = {}
    total: dict[str, int] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
        meta, status = pod["metadata"], pod.get("status") or {}
        node_name = (meta.get("annotations") or {}).get("workflows.argoproj.io/node-name") or meta["name"]
        term = [(c.get("state") or {}).get("terminated") or {} for c in status.get("containerStatuses") or []]
        node_id = f"{name}-{meta['name'].rsplit('-', 1)[-1]}"
        used = resources_duration(pod)
        for k, v in used.items():
            total[k] = total.get(k, 0) + v
        nodes[node_id] = {
            "id": node_id, "name": node_name, "displayName": node_name.split(".", 1)[-1], "type": "Pod",
            "templateName": meta["name"][len(name) + 1:].rsplit("-", 1)[0], "boundaryID": name,
            "phase": {"Succeeded": "Succeeded", "Failed": "Failed",
                      "Running": "Running"}.get(status.get("phase"), "Pending"),
            "startedAt": meta.get("creationTimestamp"),
            "finishedAt": max((t["finishedAt"] for t in term if t.get("finishedAt")), default=None),
            "hostNodeName": (pod.get("spec") or {}).get("nodeName"), "resourcesDuration": used, "progress": "1/1",
        }
    nodes[name] = {"id": name, "name": name, "displayName": name, "type": "DAG",
                   "templateName": wf["spec"]["entrypoint"],
                   "phase": (wf.get("status") or {}).get("phase") or "Running",
                   "children": [k for k in nodes if k != name],
                   "resourcesDuration": dict(total)}
    return nodes


def error_body(code: int, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}


def validate_workflow(wf: Any) -> str | None:
    """The server-side checks a compiled Workflow can fail; returns the server's message or None."""
    if not isinstance(wf, dict):
        return "workflow is required"
    if wf.get("apiVersion") != "argoproj.io/v1alpha1" or wf.get("kind") != "Workflow":
        return ("invalid workflow: apiVersion/kind must be argoproj.io/v1alpha1/Workflow, "
                f"got {wf.get('apiVersion')}/{wf.get('kind')}")
    meta = wf.get("metadata") or {}
    if not meta.get("name") and not meta.get("generateName"):
        return "workflow must have a name or generateName"
    spec = wf.get("spec") or {}
    templates = {t.get("name"): t for t in spec.get("templates") or []}
    entry = spec.get("entrypoint")
    if not entry:
        return "spec.entrypoint is required"
    if entry not in templates:
        return f"spec.entrypoint template '{entry}' not found"
    names = [p.get("name") for p in (spec.get("arguments") or {}).get("parameters") or []]
    if len(names) != len(set(names)):
        return "spec.arguments.parameters: duplicate parameter names"
    declared = set(names)
    for tmpl in templates.values():
        for task in (tmpl.get("dag") or {}).get("tasks") or []:
            if task.get("template") not in templates:
                return f"templates.{tmpl['name']}.tasks.{task.get('name')} template '{task.get('template')}' not found"
    for ref in _PARAM_REF.findall(json.dumps(spec)):
        if ref not in declared:
            return f"failed to resolve {{{{workflow.parameters.{ref}}}}}"
    return None


class ArgoServerStandIn(StandInServer):
    """The stand-in Argo Server. Use as a context manager, or ``start()`` / ``close()``."""

    thread_name = "argo-standin"

    def __init__(
        self,
        *,
        token: str | None = "argo-standin-token",
        namespaces: Iterable[str] = ("argo", "llmpack"),
        forbidden_namespaces: Iterable[str] = (),
        phases: Iterable[str] = ("Pending", "Running", "Succeeded"),
        version: str = "v3.6.2",
    ) -> None:
        super().__init__(token=token)
        self.namespaces = set(namespaces)
        self.forbidden_namespaces = set(forbidden_namespaces)
        self.phases = list(phases)
        self.version = version
        self.workflows: dict[tuple[str, str], dict[str, Any]] = {}
        self._reads: dict[tuple[str, str], int] = {}
        self._rv = 5000
        self._lock = threading.Lock()
        self._kube: Any = None  # a standins.k8s_api.KubeAPIStandIn whose pods fill status.nodes

    def watch_pods(self, kube: Any) -> None:
        """Fill each Workflow's ``status.nodes`` from ``kube``'s pods on every read (see the module doc)."""
        self._kube = kube

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _make_handler(self)

    # ------------------------------------------------------------------ state

    def set_phase(self, namespace: str, name: str, phase: str, message: str | None = None) -> None:
        with self._lock:
            key = (namespace, name)
            self._set_phase(self.workflows[key], phase, message)
            self._reads[key] = len(self.phases)

    def _set_phase(self, wf: dict[str, Any], phase: str, message: str | None = None) -> None:
        status = wf.setdefault("status", {})
        if status.get("phase") == phase and message is None:
            return
        now = _now()
        status["phase"] = phase
        status.setdefault("startedAt", now)
        n_tasks = sum(len((t.get("dag") or {}).get("tasks") or []) for t in wf["spec"].get("templates") or [])
        done = n_tasks if phase == "Succeeded" else 0
        status["progress"] = f"{done}/{n_tasks}"
        if phase in TERMINAL:
            status["finishedAt"] = now
        if message:
            status["message"] = message
        wf["metadata"].setdefault("labels", {})["workflows.argoproj.io/phase"] = phase
        if phase in TERMINAL:
            wf["metadata"]["labels"]["workflows.argoproj.io/completed"] = "true"
        self._rv += 1
        wf["metadata"]["resourceVersion"] = str(self._rv)

    def _create(self, namespace: str, body: Any) -> tuple[int, dict[str, Any]]:
        if namespace in self.forbidden_namespaces:
            return 403, error_body(
                PERMISSION_DENIED,
                f'workflows.argoproj.io is forbidden: User "system:serviceaccount:argo:argo-server" cannot create '
                f'resource "workflows" in API group "argoproj.io" in the namespace "{namespace}"',
            )
        if namespace not in self.namespaces:
            return 404, error_body(NOT_FOUND, f'namespaces "{namespace}" not found')
        if not isinstance(body, dict):
            return 400, error_body(INVALID_ARGUMENT, "the request body is not a WorkflowCreateRequest")
        wf = copy.deepcopy(body.get("workflow"))
        problem = validate_workflow(wf)
        if problem:
            return 400, error_body(INVALID_ARGUMENT, problem)
        meta = wf["metadata"]
        if meta.get("namespace") and meta["namespace"] != namespace:
            return 400, error_body(INVALID_ARGUMENT,
                                   f"workflow namespace {meta['namespace']} does not match {namespace}")
        if not meta.get("name"):
            alphabet = string.ascii_lowercase + string.digits
            meta["name"] = meta["generateName"] + "".join(secrets.choice(alphabet) for _ in range(5))
        key = (namespace, meta["name"])
        with self._lock:
            if key in self.workflows:
                return 409, error_body(ALREADY_EXISTS, f'workflows.argoproj.io "{meta["name"]}" already exists')
            self._rv += 1
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), resourceVersion=str(self._rv), generation=1,
                        creationTimestamp=_now())
            meta.setdefault("labels", {})["workflows.argoproj.io/creator"] = "system-serviceaccount-argo-argo-server"
            if body.get("serverDryRun"):
                return 200, wf
            self.workflows[key] = wf
            self._reads[key] = 0
            return 200, copy.deepcopy(wf)

    def _read(self, namespace: str, name: str) -> dict[str, Any] | None:
        key = (namespace, name)
        with self._lock:
            wf = self.workflows.get(key)
            if wf is None:
                return None
            n = self._reads[key]
            if n < len(self.phases):
                self._set_phase(wf, self.phases[n])
            self._reads[key] = n + 1
            if self._kube is not None:
                with self._kube._cond:
                    pods = [copy.deepcopy(p) for (ns, _), p in self._kube._pods.items() if ns == namespace
                            and (p["metadata"].get("labels") or {}).get("workflows.argoproj.io/workflow") == name]
                if pods:
                    wf.setdefault("status", {})["nodes"] = workflow_nodes(wf, pods)
                    wf["status"]["resourcesDuration"] = wf["status"]["nodes"][name]["resourcesDuration"]
            return copy.deepcopy(wf)


def _make_handler(api: ArgoServerStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(StandInHandler):
        server_version = "argo-server-standin/" + api.version

        def _handle(self, method: str) -> None:
            parts, query, body, authorized = self._receive(api, method)
            if not authorized:
                return self._json(401, error_body(UNAUTHENTICATED, "token not valid. see https://argo-workflows.readthedocs.io/en/latest/faq/"))
            rest = parts.path.strip("/").split("/")
            if rest[:2] != ["api", "v1"]:
                return self._json(404, error_body(NOT_FOUND, "Not Found"))
            rest = rest[2:]
            if rest == ["version"] and method == "GET":
                return self._json(200, {"version": api.version, "buildDate": "2025-01-01T00:00:00Z",
                                        "gitCommit": "0" * 40,
                                        "gitTag": api.version, "gitTreeState": "clean", "goVersion": "go1.23.4",
                                        "compiler": "gc", "platform": "linux/amd64"})
            if len(rest) == 2 and rest[0] == "workflows":
                ns = rest[1]
                if method == "POST":
                    return self._json(*api._create(ns, body))
                if ns not in api.namespaces:
                    return self._json(404, error_body(NOT_FOUND, f'namespaces "{ns}" not found'))
                with api._lock:
                    items = [copy.deepcopy(w) for (n, _), w in api.workflows.items() if n == ns]
                return self._json(200, {"metadata": {"resourceVersion": str(api._rv)}, "items": items})
            if len(rest) == 3 and rest[0] == "workflows" and method == "GET":
                wf = api._read(rest[1], rest[2])
                if wf is None:
                    return self._json(404, error_body(NOT_FOUND, f'workflows.argoproj.io "{rest[2]}" not found'))
                return self._json(200, wf)
            return self._json(404, error_body(NOT_FOUND, "Not Found"))

    return Handler
