"""A stand-in Kubernetes API server on 127.0.0.1, for the real ``kubernetes`` Python client.

It speaks the wire protocol the client uses (JSON over HTTP/1.1, bearer tokens, ``Status``
objects for errors, chunked newline-delimited watch streams) for the few resources llmpack needs:

- ``GET /api/v1/namespaces/{ns}/pods`` (and ``/api/v1/pods``): a ``PodList`` with
  ``metadata.resourceVersion``; ``labelSelector``, ``fieldSelector``, ``limit``/``continue``.
  With ``watch=true``: ``{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": ...}`` lines
  from ``resourceVersion`` on, until ``timeoutSeconds``. A too-old ``resourceVersion`` gets an
  ``ERROR`` event carrying a ``Status`` with code 410 ``Expired``, as the real API server sends.
- ``GET /api/v1/namespaces/{ns}/pods/{name}``, ``GET /api/v1/nodes[/{name}]``,
  ``GET /api/v1/namespaces/{ns}/events`` (``fieldSelector`` on the whole event; with
  ``watch=true`` a watch as for pods: :meth:`KubeAPIStandIn.add_event` and
  :meth:`~KubeAPIStandIn.delete_event`, the TTL running out, are its events),
  ``GET /api/v1/namespaces[/{ns}]`` (404 for unknown).
- ``POST/GET /apis/batch/v1/namespaces/{ns}/jobs``, ``GET/DELETE .../jobs/{name}``,
  ``GET .../jobs/{name}/status``: Jobs are stored and returned; every request is recorded.
- Custom resources (:data:`CUSTOM_RESOURCES`: Kubeflow Trainer ``trainjobs``, Kueue ``workloads``;
  pass ``custom_resources=`` to serve others, or none, as a cluster without the CRD):
  ``POST/GET /apis/{group}/{version}/namespaces/{ns}/{plural}`` (create; list with
  ``labelSelector``/``fieldSelector``, or ``watch=true``), ``GET/PATCH/DELETE .../{plural}/{name}``
  and ``GET/PATCH .../{name}/status``, as a CRD with a status subresource behaves: create sets
  ``uid``, ``creationTimestamp``, ``resourceVersion``, ``generation`` and drops ``status``; PATCH is
  ``application/merge-patch+json`` (the main resource ignores ``status``, ``/status`` takes only
  ``status``); DELETE honours ``preconditions.uid`` (409 Conflict) and records the
  ``propagationPolicy``; 409 ``AlreadyExists`` / 404 ``NotFound`` are ``Status`` objects naming
  ``{plural}.{group}``. Each change is a watch event, as for pods. :attr:`on_custom_object_created`
  lets a fake cluster react; :meth:`set_trainjob_condition` plays the Trainer controller.
- Built-in objects stored as the custom resources are (:data:`BUILTIN_OBJECTS`: Secrets, ConfigMaps,
  PersistentVolumeClaims, ServiceAccounts under ``/api/v1/namespaces/{ns}/...``, Roles and
  RoleBindings under ``rbac.authorization.k8s.io/v1``), cluster-scoped custom objects
  (``GET /apis/{group}/{version}/{plural}/{name}``, e.g. :data:`CLUSTER_TRAINING_RUNTIMES`), and
  ``POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews``, allowed unless ``forbidden``
  names the verb or resource (:meth:`KubeAPIStandIn.allows`). Namespaces carry the labels given
  to :meth:`KubeAPIStandIn.add_namespace` (Pod Security levels). What ``llmpack doctor`` reads.
- A wrong or missing bearer token gets 401; resources named in ``forbidden`` get 403 (a resource
  name such as ``"jobs"``, ``"trainjobs"`` or ``"trainjobs.trainer.kubeflow.org"`` forbids every
  verb on it; ``"delete trainjobs"`` forbids one verb).

Tests script it: :meth:`KubeAPIStandIn.apply_pod` / :meth:`delete_pod` change state (each change is
a watch event), :meth:`expire` compacts history so open watches get 410 and must re-list, and
:meth:`play` feeds a timeline from a thread. :func:`pod_states` builds the successive states of a
realistic pod. ``python -m standins.k8s_api --synthetic PODS,EVENTS`` serves a synthetic run group
from a separate process (the benchmark measures the client alone); with ``--burst`` the events are
rendered before serving (:meth:`KubeAPIStandIn.burst`) and reach the watch as one backlog, so making
them does not bound what the client is measured at.
"""

from __future__ import annotations

import argparse
import bisect
import copy
import hashlib
import heapq
import json
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any

from standins import base
from standins.base import StandInHandler, StandInServer

# --------------------------------------------------------------------------- selectors

_REQ = re.compile(
    r"^\s*(?P<not>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9_.-]*)|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_label_selector(selector: str | None) -> Callable[[Mapping[str, str]], bool]:
    """A predicate on labels for a Kubernetes label selector (equality- and set-based)."""
    reqs = []
    for part in _split_selector(selector or ""):
        m = _REQ.match(part)
        if not m:
            raise ValueError(f"unable to parse requirement: {part!r}")
        key = m.group("key")
        if m.group("not"):
            reqs.append(lambda labels, k=key: k not in labels)
        elif m.group("op") in ("=", "=="):
            reqs.append(lambda labels, k=key, v=m.group("value"): labels.get(k) == v)
        elif m.group("op") == "!=":
            reqs.append(lambda labels, k=key, v=m.group("value"): labels.get(k) != v)
        elif m.group("setop"):
            values = {v.strip() for v in m.group("values").split(",") if v.strip()}
            if m.group("setop") == "in":
                reqs.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                reqs.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        else:
            reqs.append(lambda labels, k=key: k in labels)
    return lambda labels: all(r(labels or {}) for r in reqs)


def parse_field_selector(selector: str | None) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate on an object for ``a.b=v`` / ``a.b!=v`` field selectors."""
    reqs = []
    for part in _split_selector(selector or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise ValueError(f"unable to parse field selector requirement: {part!r}")
        path, op, value = m.group(1).split("."), m.group(2), m.group(3)

        def get(obj: Mapping[str, Any], path: list[str] = path) -> str:
            for key in path:
                obj = obj.get(key) if isinstance(obj, Mapping) else None
            return "" if obj is None else str(obj)

        if op == "!=":
            reqs.append(lambda obj, g=get, v=value: g(obj) != v)
        else:
            reqs.append(lambda obj, g=get, v=value: g(obj) == v)
    return lambda obj: all(r(obj) for r in reqs)


# --------------------------------------------------------------------------- objects


def status_object(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        obj["details"] = details
    return obj


def _uid_for(*parts: str) -> str:
    return str(uuid.UUID(hashlib.md5("/".join(parts).encode()).hexdigest()))


@dataclass
class RecordedRequest(base.RecordedRequest):
    """One request the stand-in received (the Authorization header is never kept)."""

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch", "").lower() in ("true", "1")


@dataclass
class _Entry:
    rv: int
    type: str
    namespace: str
    labels: dict[str, str]
    line: bytes  # the watch event, serialized once
    resource: str = "pods"  # "pods", "events", or a custom resource's "{plural}.{group}"
    name: str = ""
    obj: dict[str, Any] | None = None  # events only: what a field selector reads


@dataclass(frozen=True)
class CustomResource:
    """A custom resource with a status subresource, as its CRD declares it (namespaced unless said).

    Built-in kinds the stand-in stores the same way (Secrets, PVCs, Roles...) are declared with
    their own group (``""`` for the core API): see :data:`BUILTIN_OBJECTS`.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """``{plural}.{group}``: the name kubectl, RBAC messages and ``Status`` errors use."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


TRAINJOBS = CustomResource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
WORKLOADS = CustomResource("kueue.x-k8s.io", "v1beta1", "workloads", "Workload")
WORKLOADS_V1BETA2 = CustomResource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
# Kueue 0.15-0.19 serves Workloads at both versions, one store (Kueue before 0.15: v1beta1 only).
CUSTOM_RESOURCES = (TRAINJOBS, WORKLOADS, WORKLOADS_V1BETA2)
# More CRDs a cluster may have (pass them in ``custom_resources``): Kueue LocalQueues and the
# Trainer's cluster-scoped runtimes (what ``llmpack doctor`` reads).
LOCALQUEUES = CustomResource("kueue.x-k8s.io", "v1beta1", "localqueues", "LocalQueue")
LOCALQUEUES_V1BETA2 = CustomResource("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
CLUSTER_TRAINING_RUNTIMES = CustomResource("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes",
                                           "ClusterTrainingRuntime", namespaced=False)
# Built-in kinds every API server serves, stored and routed as the custom resources are
# (``/api/v1/namespaces/{ns}/{plural}[/{name}]``, ``/apis/rbac.authorization.k8s.io/v1/...``).
BUILTIN_OBJECTS = (
    CustomResource("", "v1", "secrets", "Secret"),
    CustomResource("", "v1", "configmaps", "ConfigMap"),
    CustomResource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
    CustomResource("", "v1", "serviceaccounts", "ServiceAccount"),
    CustomResource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    CustomResource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch of ``target`` (a new object; ``null`` removes a key)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class KubeAPIStandIn(StandInServer):
    """The stand-in API server. Use as a context manager, or ``start()`` / ``close()``."""

    thread_name = "k8s-standin"
    poll_interval_s = 0.05
    request_type = RecordedRequest

    def __init__(
        self,
        *,
        token: str | None = "standin-token",
        namespaces: Iterable[str] = ("default", "llmpack"),
        forbidden: Iterable[str] = (),
        compacted_rv: int = 0,
        start_rv: int = 1000,
        bookmarks: bool = True,
        custom_resources: Iterable[CustomResource] = CUSTOM_RESOURCES,
    ) -> None:
        super().__init__(token=token)
        self.namespaces = set(namespaces)
        self.forbidden = set(forbidden)  # resource names: "pods", "nodes", "events", "namespaces", "jobs"
        self.namespace_labels: dict[str, dict[str, str]] = {}  # labels beyond kubernetes.io/metadata.name
        self.bookmarks = bookmarks
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.on_job_created: Callable[[dict[str, Any]], None] | None = None
        # Served custom resources by (group, version, plural); their objects by "{plural}.{group}", then (ns, name).
        self.custom_resources = {(r.group, r.version, r.plural): r for r in (*custom_resources, *BUILTIN_OBJECTS)}
        self.custom_objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            r.resource: {} for r in self.custom_resources.values()
        }
        # Called (outside the lock, before the response) with a copy of each object a client creates.
        self.on_custom_object_created: Callable[[dict[str, Any]], None] | None = None
        self.expired_sent = 0  # 410 ERROR events sent
        self._cond = threading.Condition()
        self._rv = start_rv
        self._compacted = compacted_rv
        self._expire_gen = 0
        self._expire_next = 0
        self._expire_next_http = 0
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        self._events: dict[tuple[str, str], dict[str, Any]] = {}
        self._log: list[_Entry] = []
        self._log_rvs: list[int] = []
        self._open_watches = 0
        self._closing = False
        self._players: list[threading.Thread] = []
        self.player_errors: list[BaseException] = []

    # ------------------------------------------------------------------ lifecycle

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _make_handler(self)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        super().close()

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    @property
    def open_watches(self) -> int:
        with self._cond:
            return self._open_watches

    # ------------------------------------------------------------------ state changes (each is a watch event)

    @staticmethod
    def _entry(rv: int, etype: str, obj: dict[str, Any], resource: str = "pods") -> _Entry:
        meta = obj["metadata"]
        line = (json.dumps({"type": etype, "object": obj}, separators=(",", ":")) + "\n").encode()
        return _Entry(rv, etype, meta.get("namespace", ""), dict(meta.get("labels") or {}),
                      line, resource, meta.get("name", ""), obj if resource == "events" else None)

    def _append(self, etype: str, obj: dict[str, Any], resource: str = "pods") -> None:
        self._log.append(self._entry(self._rv, etype, obj, resource))
        self._log_rvs.append(self._rv)
        self._cond.notify_all()

    @staticmethod
    def _pod_copy(pod: Mapping[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(dict(pod))
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", _uid_for("pod", meta["namespace"], meta["name"]))
        meta.setdefault("creationTimestamp", base.utc_now())
        obj.setdefault("kind", "Pod")
        obj.setdefault("apiVersion", "v1")
        return obj

    def apply_pod(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a pod (ADDED or MODIFIED). Returns the stored copy with its resourceVersion."""
        obj = self._pod_copy(pod)
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        with self._cond:
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            etype = "MODIFIED" if key in self._pods else "ADDED"
            self._pods[key] = obj
            self._append(etype, obj)
        return obj

    def burst(self, pods: Iterable[Mapping[str, Any]]) -> Callable[[], None]:
        """Pod states rendered now, logged later all at once: the returned step (for :meth:`play`) logs them.

        Every copy and watch line is made here, numbered on from the current resourceVersion, so
        logging them costs almost nothing and an open watch receives them as one backlog, as fast
        as the wire and the client go: a benchmark of the client then measures the client, not
        this server making events. Nothing else may change state between this call and the step.
        """
        rv, known, known_events = self._rv, set(self._pods), set(self._events)
        entries, latest, latest_events = [], {}, {}
        for pod in pods:
            if pod.get("kind") == "Event":  # a kubelet event among the pod states (synthetic_run_group)
                obj = self._event_copy(pod)
                meta = obj["metadata"]
                key = (meta["namespace"], meta["name"])
                rv += 1
                meta["resourceVersion"] = str(rv)
                entries.append(self._entry(rv, "MODIFIED" if key in known_events else "ADDED", obj, "events"))
                known_events.add(key)
                latest_events[key] = obj
                continue
            obj = self._pod_copy(pod)
            meta = obj["metadata"]
            key = (meta["namespace"], meta["name"])
            rv += 1
            meta["resourceVersion"] = str(rv)
            entries.append(self._entry(rv, "MODIFIED" if key in known else "ADDED", obj))
            known.add(key)
            latest[key] = obj
        first = self._rv

        def log() -> None:
            with self._cond:
                if self._rv != first:
                    raise RuntimeError(f"state changed between burst() and its step (resourceVersion {first} -> {self._rv})")
                self._rv = rv
                self._pods.update(latest)
                self._events.update(latest_events)
                self._log.extend(entries)
                self._log_rvs.extend(e.rv for e in entries)
                self._cond.notify_all()

        return log

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._cond:
            obj = self._pods.pop((namespace, name), None)
            if obj is None:
                return
            obj = copy.deepcopy(obj)
            self._rv += 1
            obj["metadata"]["resourceVersion"] = str(self._rv)
            obj["metadata"].setdefault("deletionTimestamp", base.utc_now())
            self._append("DELETED", obj)

    def add_node(self, node: Mapping[str, Any]) -> None:
        obj = copy.deepcopy(dict(node))
        obj.setdefault("kind", "Node")
        obj.setdefault("apiVersion", "v1")
        with self._cond:
            self._rv += 1
            obj["metadata"]["resourceVersion"] = str(self._rv)
            self._nodes[obj["metadata"]["name"]] = obj

    @staticmethod
    def _event_copy(event: Mapping[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(dict(event))
        obj.setdefault("kind", "Event")
        obj.setdefault("apiVersion", "v1")
        obj["metadata"].setdefault("namespace", (obj.get("involvedObject") or {}).get("namespace", "default"))
        return obj

    def add_event(self, event: Mapping[str, Any]) -> None:
        obj = self._event_copy(event)
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        with self._cond:
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            etype = "MODIFIED" if key in self._events else "ADDED"
            self._events[key] = obj
            self._append(etype, obj, "events")

    def delete_event(self, namespace: str, name: str) -> None:
        """Remove an event (a DELETED watch event), as the API server does when its TTL (1 h) runs out."""
        with self._cond:
            obj = self._events.pop((namespace, name), None)
            if obj is not None:
                obj = copy.deepcopy(obj)
                self._rv += 1
                obj["metadata"]["resourceVersion"] = str(self._rv)
                self._append("DELETED", obj, "events")

    def add_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Serve namespace ``name``, with ``labels`` (e.g. ``pod-security.kubernetes.io/enforce``) if given."""
        self.namespaces.add(name)
        if labels is not None:
            self.namespace_labels[name] = dict(labels)

    def install(self, *resources: CustomResource) -> None:
        """Serve more custom resources from now on, as applying their CRDs does."""
        with self._cond:
            for res in resources:
                self.custom_resources[(res.group, res.version, res.plural)] = res
                self.custom_objects.setdefault(res.resource, {})

    def remove_namespace(self, name: str) -> None:
        """Stop serving namespace ``name`` (its objects stay stored, unreachable through it)."""
        self.namespaces.discard(name)
        self.namespace_labels.pop(name, None)

    def allows(self, verb: str, resource: str, group: str = "") -> bool:
        """Whether a request ``verb`` on ``resource`` (in API ``group``) passes :attr:`forbidden`."""
        names = (resource, f"{resource}.{group}") if group else (resource,)
        return not any(n in self.forbidden or f"{verb} {n}" in self.forbidden for n in names)

    def expire(self) -> None:
        """Compact history now: open watches get ERROR 410 Expired, older resourceVersions are refused.

        Events logged after this call are not delivered to the watches it ends: a client only sees
        them by re-listing (as after a real etcd compaction).
        """
        with self._cond:
            self._rv += 1
            self._compacted = self._rv
            self._expire_gen += 1
            self._cond.notify_all()

    def expire_next_watches(self, count: int = 1, *, as_http_status: bool = False) -> None:
        """The next ``count`` watch requests get an immediate 410, whatever resourceVersion they ask.

        As an ``ERROR`` watch event (what the API server sends for a too-old resourceVersion), or
        with ``as_http_status`` as the HTTP status of the response itself (410 Gone + ``Status``).
        """
        with self._cond:
            if as_http_status:
                self._expire_next_http += count
            else:
                self._expire_next += count

    # ------------------------------------------------------------------ scripted timelines

    def play(
        self,
        steps: Iterable[Any],
        *,
        wait_for_watches: int = 0,
        wait_timeout: float = 10.0,
        delay: float = 0.0,
    ) -> threading.Thread:
        """Feed a timeline from a thread. Steps:

        ``("apply", pod)``, ``("delete", (namespace, name))``, ``("expire", None)``,
        ``("sleep", seconds)``, ``("node", node)``, ``("event", event)``, ``("wait_watches", n)``,
        a bare pod dict (apply), or a callable (called in order: a synchronisation point). ``delay`` sleeps between steps; ``wait_for_watches`` waits
        first until that many watch streams are open, so the client sees the changes live.
        """

        def run() -> None:
            try:
                if wait_for_watches:
                    self.wait_for_watches(wait_for_watches, wait_timeout)
                for step in steps:
                    if self._closing:
                        return
                    self._do(step)
                    if delay:
                        time.sleep(delay)
            except BaseException as exc:  # surfaced by join_players()
                self.player_errors.append(exc)

        thread = threading.Thread(target=run, name="k8s-standin-play", daemon=True)
        self._players.append(thread)
        thread.start()
        return thread

    def _do(self, step: Any) -> None:
        if callable(step):  # a synchronisation point, e.g. wait until the client has seen something
            step()
            return
        if isinstance(step, Mapping):
            self.add_event(step) if step.get("kind") == "Event" else self.apply_pod(step)
            return
        action, arg = step
        if action == "apply":
            self.apply_pod(arg)
        elif action == "delete":
            self.delete_pod(*arg)
        elif action == "expire":
            self.expire()
        elif action == "sleep":
            time.sleep(arg)
        elif action == "node":
            self.add_node(arg)
        elif action == "event":
            self.add_event(arg)
        elif action == "wait_watches":
            self.wait_for_watches(arg)
        else:
            raise ValueError(f"unknown step {action!r}")

    def wait_for_watches(self, count: int, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        with self._cond:
            while self._open_watches < count:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self._open_watches} watch(es) open, waited for {count}")
                self._cond.wait(left)

    def join_players(self, timeout: float = 10.0) -> None:
        for thread in self._players:
            thread.join(timeout)
        if self.player_errors:
            raise self.player_errors[0]

    # ------------------------------------------------------------------ request handling (server threads)

    def _list(self, store: Mapping[Any, dict[str, Any]], query: Mapping[str, str], namespace: str | None, kind: str):
        match_labels = parse_label_selector(query.get("labelSelector"))
        match_fields = parse_field_selector(query.get("fieldSelector"))
        with self._cond:
            rv = self._rv
            items = [
                o
                for o in store.values()
                if (namespace is None or o["metadata"].get("namespace") == namespace)
                and match_labels(o["metadata"].get("labels") or {})
                and match_fields(o)
            ]
            items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
            start = int(query.get("continue") or 0)
            limit = int(query.get("limit") or 0)
            # a snapshot of this page only: copying every match for each page made a paged list
            # of 2,000 events cost this server ~0.1 s a page (benchmarks/watcher_bench.py)
            page = json.loads(json.dumps(items[start : start + limit] if limit else items[start:]))
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and start + limit < len(items):
            meta["continue"] = str(start + limit)
            meta["remainingItemCount"] = len(items) - start - limit
        return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": meta, "items": page}

    def _watch(
        self, handler: BaseHTTPRequestHandler, query: Mapping[str, str], namespace: str | None, resource: str = "pods"
    ) -> None:
        match_labels = parse_label_selector(query.get("labelSelector"))
        custom = self._custom_by_resource(resource) if resource not in ("pods", "events") else None
        store = self._pods if resource == "pods" else self._events if resource == "events" else self.custom_objects[resource]
        match_object: Callable[[Mapping[str, Any] | None], bool] = lambda obj: True  # noqa: E731
        if resource == "pods":  # as before, no field selector on pod watches
            bookmark_type = {"kind": "Pod", "apiVersion": "v1"}

            def match_name(ns: str, name: str) -> bool:
                return True
        elif resource == "events":  # involvedObject.kind=Pod, reason=...: on the whole event
            bookmark_type = {"kind": "Event", "apiVersion": "v1"}
            match_object = parse_field_selector(query.get("fieldSelector"))

            def match_name(ns: str, name: str) -> bool:
                return True
        else:  # custom objects: metadata.name / metadata.namespace (what a watch of one object sends)
            bookmark_type = {"kind": custom.kind, "apiVersion": custom.api_version}
            by_field = parse_field_selector(query.get("fieldSelector"))

            def match_name(ns: str, name: str) -> bool:
                return by_field({"metadata": {"name": name, "namespace": ns}})
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = self.bookmarks and query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        requested = query.get("resourceVersion") or ""
        with self._cond:
            gone = self._expire_next_http > 0
            self._expire_next_http -= 1 if gone else 0
        if gone:
            self.expired_sent += 1
            handler._status(410, "Expired", f"too old resource version: {requested} ({self._compacted})")
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def send(lines: list[bytes]) -> None:
            if lines:
                handler.wfile.write(b"".join(b"%x\r\n%s\r\n" % (len(line), line) for line in lines))
                handler.wfile.flush()

        def expired(rv: str) -> bytes:
            self.expired_sent += 1
            status = status_object(410, "Expired", f"too old resource version: {rv} ({self._compacted})")
            return (json.dumps({"type": "ERROR", "object": status}) + "\n").encode()

        deadline = time.monotonic() + timeout
        pos = 0
        with self._cond:
            self._open_watches += 1
            self._cond.notify_all()
            gen = self._expire_gen
            initial: list[bytes] = []
            refused = False
            if self._expire_next > 0:
                self._expire_next -= 1
                initial.append(expired(requested or "0"))
                refused = True
            elif requested in ("", "0"):  # "most recent": synthetic ADDED for the current state
                for obj in store.values():
                    if (namespace is None or obj["metadata"].get("namespace") == namespace) and match_labels(
                        obj["metadata"].get("labels") or {}
                    ) and match_name(obj["metadata"].get("namespace", ""), obj["metadata"]["name"]) and match_object(obj):
                        initial.append((json.dumps({"type": "ADDED", "object": obj}) + "\n").encode())
                pos = len(self._log)
            elif int(requested) < self._compacted:
                initial.append(expired(requested))
                refused = True
            else:
                pos = bisect.bisect_right(self._log_rvs, int(requested))
        try:
            send(initial)
            if refused:
                return
            while True:
                with self._cond:
                    while (
                        pos >= len(self._log)
                        and not self._closing
                        and gen == self._expire_gen
                        and time.monotonic() < deadline
                    ):
                        self._cond.wait(max(0.0, min(0.5, deadline - time.monotonic())))
                    if self._closing:
                        return
                    if gen != self._expire_gen:
                        lines = [expired(str(self._log_rvs[pos - 1] if pos else requested or 0))]
                        done = True
                    else:
                        batch = self._log[pos : pos + 256]
                        pos += len(batch)
                        lines = [
                            e.line
                            for e in batch
                            if e.resource == resource
                            and (namespace is None or e.namespace == namespace)
                            and match_labels(e.labels)
                            and match_name(e.namespace, e.name)
                            and (e.obj is None or match_object(e.obj))
                        ]
                        done = not batch and time.monotonic() >= deadline
                        if done and bookmarks:
                            bookmark = {**bookmark_type, "metadata": {"resourceVersion": str(self._rv)}}
                            lines.append((json.dumps({"type": "BOOKMARK", "object": bookmark}) + "\n").encode())
                send(lines)
                if done:
                    return
        finally:
            with self._cond:
                self._open_watches -= 1
                self._cond.notify_all()
            try:
                handler.wfile.write(b"0\r\n\r\n")
                handler.wfile.flush()
            except OSError:
                handler.close_connection = True

    def _create_job(self, namespace: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        meta = body.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            return 422, status_object(422, "Invalid", "Job.batch \"\" is invalid: metadata.name: Required value")
        key = (namespace, name)
        with self._cond:
            if key in self.jobs:
                return 409, status_object(
                    409, "AlreadyExists", f'jobs.batch "{name}" already exists', {"name": name, "group": "batch", "kind": "jobs"}
                )
            self._rv += 1
            meta.update(
                namespace=namespace,
                uid=str(uuid.uuid4()),
                resourceVersion=str(self._rv),
                creationTimestamp=base.utc_now(),
            )
            body.setdefault("apiVersion", "batch/v1")
            body.setdefault("kind", "Job")
            body.setdefault("status", {})
            self.jobs[key] = body
        if self.on_job_created is not None:
            self.on_job_created(copy.deepcopy(body))
        return 201, body

    def set_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        with self._cond:
            self._rv += 1
            job = self.jobs[(namespace, name)]
            job["status"] = dict(status)
            job["metadata"]["resourceVersion"] = str(self._rv)

    # ------------------------------------------------------------------ custom objects (TrainJobs, Kueue Workloads)

    def _custom_by_resource(self, resource: str) -> CustomResource:
        """The served resource named ``{plural}.{group}`` or, when unambiguous, ``{plural}``."""
        # one resource served at several versions shares one store: any of them will do
        found = list({r.resource: r for r in self.custom_resources.values() if resource in (r.resource, r.plural)}.values())
        if len(found) != 1:
            raise KeyError(f"custom resource {resource!r}: {'ambiguous' if found else 'not served'}")
        return found[0]

    @property
    def trainjobs(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The stored TrainJobs by (namespace, name) (the live store; {} when not served)."""
        return self.custom_objects.get(TRAINJOBS.resource, {})

    def custom_object(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A copy of one stored object (``resource``: ``trainjobs`` or ``trainjobs.trainer.kubeflow.org``), else None."""
        res = self._custom_by_resource(resource)
        with self._cond:
            return copy.deepcopy(self.custom_objects[res.resource].get((namespace, name)))

    def _bump(self, res: CustomResource, obj: dict[str, Any], etype: str) -> dict[str, Any]:
        """Give ``obj`` the next resourceVersion and log the watch event (lock held)."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._append(etype, obj, res.resource)
        return copy.deepcopy(obj)

    def apply_custom_object(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an object as a controller would (status kept). Returns the stored copy."""
        body = copy.deepcopy(dict(obj))
        group, _, version = str(body.get("apiVersion", "")).rpartition("/")
        res = next((r for r in self.custom_resources.values() if (r.group, r.version, r.kind) == (group, version, body.get("kind"))),
                   None)
        if res is None:
            raise KeyError(f"{body.get('apiVersion')} {body.get('kind')}: not a served custom resource")
        meta = body.setdefault("metadata", {})
        if res.namespaced:
            meta.setdefault("namespace", "default")
        key = (meta.get("namespace", ""), meta["name"])
        with self._cond:
            store = self.custom_objects[res.resource]
            old = store.get(key)
            meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", old["metadata"]["creationTimestamp"] if old else base.utc_now())
            meta.setdefault("generation", 1)
            store[key] = body
            return self._bump(res, body, "MODIFIED" if old else "ADDED")

    def set_custom_object_status(self, resource: str, namespace: str, name: str, status: Mapping[str, Any],
                                 *, merge: bool = True) -> dict[str, Any]:
        """Set (``merge``: merge-patch) an object's ``status``, as its controller does. A MODIFIED event."""
        res = self._custom_by_resource(resource)
        with self._cond:
            obj = self.custom_objects[res.resource][(namespace, name)]
            obj["status"] = merge_patch(obj.get("status") or {}, dict(status)) if merge else copy.deepcopy(dict(status))
            return self._bump(res, obj, "MODIFIED")

    def set_trainjob_condition(self, namespace: str, name: str, type: str = "Complete", status: str = "True",
                               reason: str = "", message: str = "") -> dict[str, Any]:
        """Set one ``status.conditions`` entry of a TrainJob as the Trainer controller does (metav1.Condition).

        ``type``: ``Complete``, ``Failed`` or ``Suspended``; ``reason`` defaults to the type
        (JobSet's ``AllJobsCompleted`` / ``FailedJobs`` are what a real cluster shows). The
        ``lastTransitionTime`` moves only when the status changes (``meta.SetStatusCondition``).
        """
        with self._cond:
            obj = self.custom_objects[TRAINJOBS.resource][(namespace, name)]
            conditions = list((obj.get("status") or {}).get("conditions") or [])
            old = next((c for c in conditions if c.get("type") == type), None)
            new = {
                "type": type,
                "status": status,
                "observedGeneration": obj["metadata"].get("generation", 1),
                "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status else base.utc_now(),
                "reason": reason or type,
                "message": message,
            }
            conditions = [new if c is old else c for c in conditions] if old else [*conditions, new]
            obj.setdefault("status", {})["conditions"] = conditions
            return self._bump(TRAINJOBS, obj, "MODIFIED")

    def delete_custom_object(self, resource: str, namespace: str, name: str) -> None:
        """Remove an object (a DELETED event), as garbage collection finishing would."""
        res = self._custom_by_resource(resource)
        with self._cond:
            obj = self.custom_objects[res.resource].pop((namespace, name), None)
            if obj is not None:
                obj["metadata"].setdefault("deletionTimestamp", base.utc_now())
                self._bump(res, obj, "DELETED")

    def _not_found(self, res: CustomResource, name: str) -> tuple[int, dict[str, Any]]:
        return 404, status_object(404, "NotFound", f'{res.resource} "{name}" not found',
                                  {"name": name, "group": res.group, "kind": res.plural})

    def _create_custom(self, res: CustomResource, namespace: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("apiVersion") != res.api_version or body.get("kind") != res.kind:
            return 400, status_object(400, "BadRequest", f"the API version in the data ({body.get('apiVersion')}) does not "
                                      f"match the expected API version ({res.api_version}), or the kind "
                                      f"({body.get('kind')}) is not {res.kind}")
        meta = body.setdefault("metadata", {})
        if meta.get("namespace") not in (None, "", namespace):
            return 400, status_object(400, "BadRequest", "the namespace of the provided object does not match the "
                                      "namespace sent on the request")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            return 422, status_object(422, "Invalid", f'{res.kind}.{res.group} "" is invalid: metadata.name: Required value')
        key = (namespace, name)
        with self._cond:
            store = self.custom_objects[res.resource]
            if key in store:
                return 409, status_object(409, "AlreadyExists", f'{res.resource} "{name}" already exists',
                                          {"name": name, "group": res.group, "kind": res.plural})
            body.pop("status", None)  # the status subresource: create resets it
            for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(field, None)
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=base.utc_now(), generation=1)
            store[key] = body
            created = self._bump(res, body, "ADDED")
        if self.on_custom_object_created is not None:
            self.on_custom_object_created(copy.deepcopy(created))
        return 201, created

    def _patch_custom(self, res: CustomResource, namespace: str, name: str, patch: Any, content_type: str,
                      status_only: bool) -> tuple[int, dict[str, Any]]:
        if content_type.split(";")[0].strip().lower() != "application/merge-patch+json":
            return 415, status_object(415, "UnsupportedMediaType",
                                      f"the body of the request was in an unknown format - accepted media types include: "
                                      f"application/merge-patch+json (got {content_type or 'none'})")
        if not isinstance(patch, dict):
            return 400, status_object(400, "BadRequest", "the body of the request was in an unknown format")
        with self._cond:
            obj = self.custom_objects[res.resource].get((namespace, name))
            if obj is None:
                return self._not_found(res, name)
            wanted_rv = ((patch.get("metadata") or {}).get("resourceVersion"))
            if wanted_rv and wanted_rv != obj["metadata"]["resourceVersion"]:
                return 409, status_object(409, "Conflict", f'Operation cannot be fulfilled on {res.resource} "{name}": the '
                                          "object has been modified; please apply your changes to the latest version "
                                          "and try again", {"name": name, "group": res.group, "kind": res.plural})
            merged = merge_patch(obj, patch)
            if status_only:  # /status: only status changes
                new = copy.deepcopy(obj)
                new["status"] = merged.get("status") or {}
            else:  # the main resource: status and the server's metadata fields stay
                new = merged
                new["status"] = copy.deepcopy(obj.get("status") or {})
                for field in ("name", "namespace", "uid", "creationTimestamp", "generation", "deletionTimestamp"):
                    if field in obj["metadata"]:
                        new["metadata"][field] = obj["metadata"][field]
                    else:
                        new["metadata"].pop(field, None)
                new["apiVersion"], new["kind"] = obj["apiVersion"], obj["kind"]
                if new.get("spec") != obj.get("spec"):
                    new["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
            if not new["status"]:
                new.pop("status")
            self.custom_objects[res.resource][(namespace, name)] = new
            return 200, self._bump(res, new, "MODIFIED")

    def _delete_custom(self, res: CustomResource, namespace: str, name: str, options: Any,
                       query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        options = options if isinstance(options, dict) else {}
        want_uid = (options.get("preconditions") or {}).get("uid")
        with self._cond:
            store = self.custom_objects[res.resource]
            obj = store.get((namespace, name))
            if obj is None:
                return self._not_found(res, name)
            if want_uid and want_uid != obj["metadata"]["uid"]:
                return 409, status_object(409, "Conflict", f'Operation cannot be fulfilled on {res.resource} "{name}": '
                                          f"Precondition failed: UID in precondition: {want_uid}, UID in object meta: "
                                          f"{obj['metadata']['uid']}", {"name": name, "group": res.group, "kind": res.plural})
            del store[(namespace, name)]
            obj["metadata"]["deletionTimestamp"] = base.utc_now()
            policy = options.get("propagationPolicy") or query.get("propagationPolicy")
            if policy == "Foreground":  # what the API server answers before the garbage collector finishes
                obj["metadata"]["finalizers"] = [*obj["metadata"].get("finalizers", []), "foregroundDeletion"]
            return 200, self._bump(res, obj, "DELETED")


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
                               r"persistentvolumeclaims|serviceaccounts)(?:/(?P<name>[^/]+)(?P<status>/status)?)?$")),
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


def _make_handler(api: KubeAPIStandIn) -> type[BaseHTTPRequestHandler]:
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
            self._status(405, "MethodNotAllowed", f"the server does not allow this method on the requested resource ({method})")

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
            items = [_namespace_object(n, api.namespace_labels.get(n)) for n in sorted(api.namespaces)]
            self._json(200, {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {"resourceVersion": str(api._rv)}, "items": items})

        def _r_namespace(self, method: str, query: dict[str, str], body: Any, ns: str) -> None:
            if ns not in api.namespaces:
                return self._status(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
            self._json(200, _namespace_object(ns, api.namespace_labels.get(ns)))

        def _r_jobs(self, method: str, query: dict[str, str], body: Any, ns: str) -> None:
            if method == "POST":
                if ns not in api.namespaces:
                    return self._status(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
                if not isinstance(body, dict):
                    return self._status(400, "BadRequest", "the body of the request was in an unknown format")
                code, obj = api._create_job(ns, body)
                return self._json(code, obj)
            if method != "GET":
                return self._not_allowed(method)
            self._json(200, api._list({k: v for k, v in api.jobs.items()}, query, ns, "Job") | {"apiVersion": "batch/v1"})

        def _r_job(self, method: str, query: dict[str, str], body: Any, ns: str, name: str, status: str | None) -> None:
            with api._cond:
                job = api.jobs.get((ns, name))
                if job is not None and method == "DELETE":
                    del api.jobs[(ns, name)]
                job = copy.deepcopy(job)
            if job is None:
                return self._status(404, "NotFound", f'jobs.batch "{name}" not found', {"name": name, "group": "batch", "kind": "jobs"})
            if method == "DELETE":
                return self._json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                        "details": {"name": name, "group": "batch", "kind": "jobs", "uid": job["metadata"]["uid"]}})
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
                        return self._status(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
                    if not isinstance(body, dict):
                        return self._status(400, "BadRequest", "the body of the request was in an unknown format")
                    return self._json(*api._create_custom(res, ns, copy.deepcopy(body)))  # the record keeps what was sent
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
            """``SelfSubjectAccessReview``: allowed unless :attr:`KubeAPIStandIn.forbidden` names the resource or verb."""
            if method != "POST" or not isinstance(body, dict):
                return self._not_allowed(method)
            attrs = (body.get("spec") or {}).get("resourceAttributes") or {}
            allowed = api.allows(attrs.get("verb", ""), attrs.get("resource", ""), attrs.get("group", ""))
            status = {"allowed": allowed, **({} if allowed else {"reason": "no RBAC rule allows it"})}
            self._json(201, {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                             "metadata": {"creationTimestamp": None}, "spec": body.get("spec") or {}, "status": status})

    return Handler


def _namespace_object(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {"name": name, "uid": _uid_for("ns", name),
                     "labels": {"kubernetes.io/metadata.name": name, **(labels or {})}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


# --------------------------------------------------------------------------- realistic pod states


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_states(name: str, **kwargs: Any) -> list[dict[str, Any]]:
    """The successive states of one pod (see :func:`iter_pod_states`), as a list."""
    return list(iter_pod_states(name, **kwargs))


def iter_pod_states(
    name: str,
    *,
    namespace: str = "llmpack",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    created: float,
    scheduled: float | None = None,
    node: str | None = None,
    sandbox: float | None = None,
    initialized: float | None = None,
    started: float | None = None,
    finished: float | None = None,
    failed: bool = False,
    main: str = "main",
    argo: bool = True,
    image: str = "ghcr.io/llmpack/llmpack:0.1.0-cuda12.4",
    extra_running_updates: int = 0,
) -> Iterator[dict[str, Any]]:
    """The successive states of one pod, as the API server would publish them (each a full object).

    Pending, then scheduled, initialized, running (plus ``extra_running_updates`` status-only
    updates) and terminated, as far as the given times go. ``argo`` adds Argo's init/wait
    containers; otherwise the single container is named ``main`` (pass ``main=`` to rename it).
    After termination the sandbox is torn down, so PodReadyToStartContainers turns False.
    """
    uid = _uid_for("pod", namespace, name)
    containers: list[dict[str, Any]] = []
    if argo:
        containers.append({"name": "wait", "image": "quay.io/argoproj/argoexec:v3.5.10", "command": ["argoexec", "wait"]})
    containers.append(
        {
            "name": main,
            "image": image,
            "command": ["python", "-m", "components.runtime"],
            "env": [{"name": "LLMPACK_STEP", "value": (labels or {}).get("llmpack.io/step", "")}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "4", "memory": "16Gi"}},
        }
    )
    base: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "creationTimestamp": _iso(created),
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "containers": containers,
            "initContainers": [{"name": "init", "image": "quay.io/argoproj/argoexec:v3.5.10"}] if argo else [],
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable", "conditions": []},
    }

    def cond(ctype: str, status: bool, t: float, reason: str | None = None) -> dict[str, Any]:
        c = {"type": ctype, "status": "True" if status else "False", "lastProbeTime": None, "lastTransitionTime": _iso(t)}
        if reason:
            c["reason"] = reason
        return c

    def snapshot(
        conditions: list[dict[str, Any]], phase: str, statuses: list[dict[str, Any]] | None, counter: int = 0
    ) -> dict[str, Any]:
        obj = copy.deepcopy(base)
        if node and any(c["type"] == "PodScheduled" for c in conditions):
            obj["spec"]["nodeName"] = node
        obj["status"]["phase"] = phase
        obj["status"]["conditions"] = conditions
        if statuses is not None:
            obj["status"]["containerStatuses"] = statuses
        if counter:
            obj["metadata"]["annotations"]["llmpack.io/progress"] = str(counter)
        return obj

    def cstatus(cname: str, state: dict[str, Any], ready: bool) -> dict[str, Any]:
        return {"name": cname, "image": image, "imageID": "", "ready": ready, "restartCount": 0, "started": ready, "state": state}

    yield snapshot([], "Pending", None)
    if scheduled is None:
        return
    sched = [cond("PodScheduled", True, scheduled)]
    yield snapshot(sched, "Pending", None)
    if initialized is None:
        return
    sb = sandbox if sandbox is not None else initialized
    waiting = {"waiting": {"reason": "PodInitializing"}}
    pre = [cond("PodReadyToStartContainers", True, sb), cond("Initialized", True, initialized), *sched]
    yield snapshot(pre, "Pending", [cstatus(c["name"], waiting, False) for c in containers])
    if started is None:
        return
    running = [
        cond("PodReadyToStartContainers", True, sb),
        cond("Initialized", True, initialized),
        cond("Ready", True, started),
        cond("ContainersReady", True, started),
        *sched,
    ]
    run_statuses = [cstatus(c["name"], {"running": {"startedAt": _iso(started)}}, True) for c in containers]
    yield snapshot(running, "Running", run_statuses)
    for k in range(extra_running_updates):
        yield snapshot(running, "Running", run_statuses, counter=k + 1)
    if finished is None:
        return
    done = [
        cond("PodReadyToStartContainers", False, finished + 1),
        cond("Initialized", True, initialized, "PodCompleted"),
        cond("Ready", False, finished + 1, "PodCompleted"),
        cond("ContainersReady", False, finished + 1, "PodCompleted"),
        *sched,
    ]
    term = {
        "terminated": {
            "exitCode": 1 if failed else 0,
            "reason": "Error" if failed else "Completed",
            "startedAt": _iso(started),
            "finishedAt": _iso(finished),
        }
    }
    yield snapshot(done, "Failed" if failed else "Succeeded", [cstatus(c["name"], term, False) for c in containers])


def node_object(name: str, *, created: float, ready: float, instance_type: str, gpu_product: str | None = None) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": instance_type,
        "topology.kubernetes.io/zone": "us-east-1a",
    }
    if gpu_product:
        labels.update({"nvidia.com/gpu.product": gpu_product, "nvidia.com/gpu.count": "8", "nvidia.com/gpu.present": "true"})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": _uid_for("node", name), "creationTimestamp": _iso(created), "labels": labels},
        "spec": {"providerID": f"aws:///us-east-1a/i-{hashlib.md5(name.encode()).hexdigest()[:17]}"},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "lastTransitionTime": _iso(created)},
                {"type": "Ready", "status": "True", "lastTransitionTime": _iso(ready), "reason": "KubeletReady"},
            ],
            "capacity": {"cpu": "192", "memory": "2097017968Ki", "nvidia.com/gpu": "8" if gpu_product else "0"},
        },
    }


def pull_events(
    pod: str,
    *,
    namespace: str = "llmpack",
    container: str = "main",
    image: str = "ghcr.io/llmpack/llmpack:0.1.0-cuda12.4",
    pulling: float,
    pulled: float,
    message_seconds: str | None = None,
) -> list[dict[str, Any]]:
    """A kubelet ``Pulling`` / ``Pulled`` pair for one container of a pod."""
    uid = _uid_for("pod", namespace, pod)
    field_path = f"spec.containers{{{container}}}"
    msg = f'Successfully pulled image "{image}"'
    if message_seconds:
        msg += f" in {message_seconds} ({message_seconds} including waiting). Image size: 9876543210 bytes."
    out = []
    for reason, t, text in (("Pulling", pulling, f'Pulling image "{image}"'), ("Pulled", pulled, msg)):
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{pod}.{hashlib.md5((pod + reason + container).encode()).hexdigest()[:16]}", "namespace": namespace},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace, "uid": uid, "fieldPath": field_path},
                "reason": reason,
                "message": text,
                "type": "Normal",
                "count": 1,
                "eventTime": None,
                "firstTimestamp": _iso(t),
                "lastTimestamp": _iso(t),
                "source": {"component": "kubelet"},
            }
        )
    return out


# --------------------------------------------------------------------------- synthetic run group (benchmark)

SYNTHETIC_T0 = 1741946400.0  # 2025-03-14T10:00:00Z


def synthetic_run_group(
    pods: int,
    events: int,
    *,
    run_group: str = "bench",
    namespace: str = "llmpack",
    pods_per_node: int = 8,
    pulls_in_stream: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Iterator[dict[str, Any]]]:
    """Nodes, pull events, and a lazy time-ordered stream of ``events`` pod states for ``pods`` pods.

    Every pod goes Pending -> scheduled -> initialized -> running -> Succeeded (5 states); the
    rest of the ``events`` budget is spread as running-status updates, so the last state of every
    pod is terminal whatever the count. Half the nodes are created after their pods (autoscaled).
    Each pod's ``Pulling``/``Pulled`` events are returned apart, to be stored first, or, with
    ``pulls_in_stream``, come in the stream at their times (as a kubelet makes them: after the
    pod is initialized, before its container starts), and the list returned is empty.
    """
    if events < 5 * pods:
        raise ValueError(f"need at least 5 events per pod ({5 * pods}), got {events}")
    extra, remainder = divmod(events - 5 * pods, pods)
    n_nodes = max(1, -(-pods // pods_per_node))
    nodes, pulls, streams = [], [], []
    for n in range(n_nodes):
        first_created = SYNTHETIC_T0 + n * pods_per_node * 0.5
        autoscaled = n % 2 == 1
        created = first_created + 30 if autoscaled else SYNTHETIC_T0 - 86400
        nodes.append(
            node_object(
                f"ip-10-1-{n // 250}-{n % 250}.ec2.internal",
                created=created,
                ready=created + 90,
                instance_type="p5.48xlarge",
                gpu_product="NVIDIA-H100-80GB-HBM3",
            )
        )
    for i in range(pods):
        node = nodes[i // pods_per_node]
        node_ready = _parse_iso(node["status"]["conditions"][1]["lastTransitionTime"])
        created = SYNTHETIC_T0 + i * 0.5
        scheduled = max(created + 1, node_ready + 2)
        initialized = scheduled + 4
        started = initialized + 20
        finished = started + 600 + (i % 17)
        name = f"llm-finetune-b{i // 5:04d}-step{i % 5}-{1000000000 + i * 7919}"
        labels = {
            "llmpack.io/run-group": run_group,
            "llmpack.io/pipeline-run": f"argo-b{i // 5:04d}",
            "llmpack.io/orchestrator": "argo",
            "llmpack.io/step": ("prepare-data", "tokenize", "finetune", "evaluate", "register")[i % 5],
            "llmpack.io/mode": "cluster",
            "workflows.argoproj.io/workflow": f"llm-finetune-b{i // 5:04d}",
        }
        annotations = {"workflows.argoproj.io/node-name": f"llm-finetune-b{i // 5:04d}.{labels['llmpack.io/step']}"}
        n_extra = extra + (1 if i < remainder else 0)
        states = iter_pod_states(
            name,
            namespace=namespace,
            labels=labels,
            annotations=annotations,
            created=created,
            scheduled=scheduled,
            node=node["metadata"]["name"],
            sandbox=scheduled + 2,
            initialized=initialized,
            started=started,
            finished=finished,
            extra_running_updates=n_extra,
        )
        times = [created, scheduled, initialized, started] + [
            started + (finished - started) * (k + 1) / (n_extra + 1) for k in range(n_extra)
        ] + [finished]
        pod_stream: Iterable[tuple[tuple[float, int, float], dict[str, Any]]] = _keyed(i, times, states)
        pod_pulls = pull_events(name, namespace=namespace, pulling=initialized, pulled=started - 1, message_seconds="18.5s")
        if pulls_in_stream:  # Pulling just after the initialized state (k 2), Pulled a second before the start (k 3)
            pod_stream = heapq.merge(pod_stream, [((initialized, i, 2.5), pod_pulls[0]), ((started - 1, i, 2.7), pod_pulls[1])],
                                     key=lambda item: item[0])
        else:
            pulls.extend(pod_pulls)
        streams.append(pod_stream)
    merged = (state for _, state in heapq.merge(*streams, key=lambda item: item[0]))
    return nodes, pulls, merged


def _keyed(i: int, times: list[float], states: Iterable[dict[str, Any]]) -> Iterator[tuple[tuple[float, int, float], dict[str, Any]]]:
    """Pod ``i``'s states keyed (time, pod, index) for the merge (a function: ``i`` bound now, not late)."""
    for k, (t, state) in enumerate(zip(times, states, strict=True)):
        yield (t, i, k), state


def _parse_iso(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


# --------------------------------------------------------------------------- command line (a separate server process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a stand-in Kubernetes API on 127.0.0.1 until stdin closes.")
    parser.add_argument("--token", default="standin-token")
    parser.add_argument("--namespace", default="llmpack")
    parser.add_argument("--synthetic", metavar="PODS,EVENTS", help="play a synthetic run group once a watch is open")
    parser.add_argument("--run-group", default="bench")
    parser.add_argument("--watches", type=int, default=1, help="open watches to wait for before playing")
    parser.add_argument("--burst", action="store_true",
                        help="render the synthetic events before serving, log them at once when the watches are open")
    parser.add_argument("--pulls-in-stream", action="store_true",
                        help="the image-pull events come in the stream at their times, not stored before it")
    args = parser.parse_args(argv)
    api = KubeAPIStandIn(token=args.token, namespaces=("default", args.namespace)).start()
    if args.synthetic:
        n_pods, n_events = (int(x) for x in args.synthetic.split(","))
        nodes, pulls, stream = synthetic_run_group(n_pods, n_events, run_group=args.run_group, namespace=args.namespace,
                                                   pulls_in_stream=args.pulls_in_stream)
        for node in nodes:
            api.add_node(node)
        for event in pulls:
            api.add_event(event)
        api.play([api.burst(stream)] if args.burst else stream, wait_for_watches=args.watches, wait_timeout=60)
    print(api.url, flush=True)
    sys.stdin.read()
    api.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
