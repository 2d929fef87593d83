"""A stand-in Kubernetes API server on 127.0.0.1, for the real ``kubernetes`` Python client.

Five modules: this one (the server: state, scripted timelines), :mod:`standins.k8s_watch`
(lists and watches, expiry), :mod:`standins.k8s_routes` (paths, RBAC, one handler per route),
:mod:`standins.k8s_custom` (custom resources) and :mod:`standins.k8s_objects` (selectors and
realistic objects); the names tests use are importable from here.

It speaks the wire protocol the client uses (JSON over HTTP/1.1, bearer tokens, ``Status``
objects for errors, chunked newline-delimited watch streams) for the few resources llmpack needs:
pods, nodes, events, namespaces, Jobs, custom resources (TrainJobs, Kueue workloads), the objects
``llmpack doctor`` reads and SelfSubjectAccessReviews; 401 for a wrong token, 403 for what
``forbidden`` names. Tests script it (:meth:`KubeAPIStandIn.apply_pod`, :meth:`expire`,
:meth:`play`); ``python -m standins.k8s_api --synthetic PODS,EVENTS`` serves from its own process.

Each route and behaviour, in full: docs/internals/stand-ins.md, "The Kubernetes API stand-in".
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from standins import base
from standins.base import StandInServer
from standins.k8s_custom import BUILTIN_OBJECTS, CUSTOM_RESOURCES, CustomObjects
from standins.k8s_custom import CLUSTER_TRAINING_RUNTIMES as CLUSTER_TRAINING_RUNTIMES
from standins.k8s_custom import LOCALQUEUES as LOCALQUEUES
from standins.k8s_custom import LOCALQUEUES_V1BETA2 as LOCALQUEUES_V1BETA2
from standins.k8s_custom import TRAINJOBS as TRAINJOBS
from standins.k8s_custom import WORKLOADS as WORKLOADS
from standins.k8s_custom import WORKLOADS_V1BETA2 as WORKLOADS_V1BETA2
from standins.k8s_custom import CustomResource as CustomResource
from standins.k8s_custom import merge_patch as merge_patch
from standins.k8s_objects import _iso as _iso
from standins.k8s_objects import _uid_for
from standins.k8s_objects import iter_pod_states as iter_pod_states
from standins.k8s_objects import node_object as node_object
from standins.k8s_objects import parse_field_selector as parse_field_selector
from standins.k8s_objects import parse_label_selector as parse_label_selector
from standins.k8s_objects import pod_states as pod_states
from standins.k8s_objects import pull_events as pull_events
from standins.k8s_objects import status_object as status_object
from standins.k8s_objects import synthetic_run_group as synthetic_run_group
from standins.k8s_watch import ListWatch


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


class KubeAPIStandIn(ListWatch, CustomObjects, StandInServer):
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
        self._expire_resource = "pods"  # the resource whose next watches expire_next_watches refuses
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        self._events: dict[tuple[str, str], dict[str, Any]] = {}
        self._log: list[_Entry] = []
        self._log_rvs: list[int] = []
        self._open_watches = 0
        self.watch_selectors: list[str] = []  # each watch's labelSelector as asked, in order
        self._closing = False
        self._players: list[threading.Thread] = []
        self.player_errors: list[BaseException] = []

    # ------------------------------------------------------------------ lifecycle

    def handler(self) -> type[BaseHTTPRequestHandler]:
        from standins.k8s_routes import make_handler

        return make_handler(self)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        super().close()

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

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
                    raise RuntimeError("state changed between burst() and its step "
                                       f"(resourceVersion {first} -> {self._rv})")
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
        a bare pod dict (apply), or a callable (called in order: a synchronisation point). ``delay`` sleeps
        between steps; ``wait_for_watches`` waits first until that many watch streams are open, so the client
        sees the changes live.
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

    def join_players(self, timeout: float = 10.0) -> None:
        for thread in self._players:
            thread.join(timeout)
        if self.player_errors:
            raise self.player_errors[0]

    # ------------------------------------------------------------------ request handling (server threads)

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
                    409, "AlreadyExists", f'jobs.batch "{name}" already exists',
                    {"name": name, "group": "batch", "kind": "jobs"}
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


if __name__ == "__main__":  # the server's command line: standins.k8s_serve
    from standins.k8s_serve import main

    raise SystemExit(main())
