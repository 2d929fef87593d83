"""What the pod watcher reads beside its watch: the nodes its pods ran on, and their image-pull events.

Nodes are read, not watched: a node watch needs list/watch on every node of the cluster, a read
needs get on the few we use. Each node is read once, when a pod lands on it (a GPU node may be
scaled away before the run ends), and re-read periodically and at the end to see its removal for
node billing: its ``deletionTimestamp`` or the autoscaler's ``ToBeDeletedByClusterAutoscaler``
taint, or, when a re-read finds it gone (404), the time of that re-read (an upper bound). A run
group of a thousand pods lands on a hundred nodes or more, so reads go out several at a time
(:data:`NODE_READERS`): one after the other, the round trips alone would outlast the watch.

Image-pull events are listed periodically and at the end (events expire after an hour), keeping
only ``Pulling``/``Pulled`` of our pods. A 403 on either degrades to one warning.

:attr:`SideReads.version` moves only when what was read changed, so the watcher's rows, cached
on it, are not recomputed for a re-read that found the same node. Thread-safe; ``kubernetes``
is imported inside the functions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from llmpack.k8s.api import is_network_error, read_json
from llmpack.k8s.slim import node_facts, slim_event, slim_node

NODE_READERS = 8  # node reads in flight at once

PULL_REASONS = ("Pulling", "Pulled")


class SideReads:
    """Nodes and image-pull events of the watched pods, for :class:`~llmpack.k8s.watcher.PodWatcher`.

    ``core`` makes a ``CoreV1Api``; ``timeout`` gives the ``_request_timeout`` of a call; messages
    for the user go to ``warnings`` (the watcher's list).
    """

    def __init__(self, core: Callable[[], Any], namespace: str, timeout: Callable[[], Any], warnings: list[str]) -> None:
        self._core = core
        self._namespace = namespace
        self._timeout = timeout
        self.warnings = warnings
        self.version = 0
        self._lock = threading.Lock()
        self._nodes: dict[str, dict[str, Any]] = {}
        self._wanted: set[str] = set()
        self._gone: dict[str, float] = {}
        self._nodes_denied = False
        self._events: dict[str, dict[str, Any]] = {}
        self._events_denied = False

    # ------------------------------------------------------------------ what was read

    def want(self, node: str) -> None:
        """A pod landed on ``node``: read it at the next :meth:`fetch_nodes` (cheap; called per event)."""
        if node not in self._nodes:
            with self._lock:
                self._wanted.add(node)

    def snapshot(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(slim nodes, slim events) as read so far."""
        with self._lock:
            return list(self._nodes.values()), list(self._events.values())

    def facts(self) -> list[dict[str, Any]]:
        """:func:`~llmpack.k8s.slim.node_facts` of every node read, ``removed`` filled in from a re-read
        that found the node gone."""
        with self._lock:
            nodes = list(self._nodes.values())
            gone = dict(self._gone)
        out = []
        for node in nodes:
            facts = node_facts(node)
            if facts["removed"] is None and facts["name"] in gone:
                facts["removed"] = gone[facts["name"]]
            out.append(facts)
        return out

    # ------------------------------------------------------------------ nodes

    def fetch_nodes(self) -> None:
        """Read the nodes pods landed on that were not read yet."""
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            wanted = sorted(self._wanted - set(self._nodes))
        if not wanted or self._nodes_denied:
            return
        for name, node in self._read_nodes(wanted):
            if isinstance(node, ApiException):
                if node.status == 403:
                    self._nodes_denied = True
                    self.warnings.append("not allowed to read nodes: instance type, GPU product and node_ready are unknown")
                    return
                if node.status == 404:  # scaled away already
                    with self._lock:
                        self._wanted.discard(name)
                    continue
                self.warnings.append(f"node {name}: {node.status} {node.reason}")
                continue
            if node is not None:  # None: unreachable, try again on the next round
                self._store_node(name, node)

    def recheck_nodes(self) -> None:
        """Re-read the nodes already read, to see them being removed (see the module doc)."""
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            names = sorted(n for n, node in self._nodes.items() if n not in self._gone and node_facts(node)["removed"] is None)
        for name, node in self._read_nodes(names):
            if isinstance(node, ApiException):
                if node.status == 404:
                    with self._lock:
                        if name not in self._gone:
                            self._gone[name] = time.time()
                            self.version += 1
                continue  # 403 and others: keep what was read
            if node is not None:
                self._store_node(name, node)

    def _store_node(self, name: str, node: dict[str, Any]) -> None:
        with self._lock:
            if self._nodes.get(name) != node:
                self._nodes[name] = node
                self.version += 1

    def _read_nodes(self, names: list[str]) -> list[tuple[str, Any]]:
        """(name, slim node | None when unreachable | the ApiException) per name, up to :data:`NODE_READERS` at once."""
        from kubernetes.client.exceptions import ApiException

        def one(name: str) -> tuple[str, Any]:
            try:
                return name, self._read_node(name)
            except ApiException as exc:
                return name, exc

        if len(names) < 2:
            return [one(name) for name in names]
        with ThreadPoolExecutor(max_workers=min(NODE_READERS, len(names)), thread_name_prefix="node-read") as pool:
            return list(pool.map(one, names))

    def _read_node(self, name: str) -> dict[str, Any] | None:
        """The node, slimmed; None when the API could not be reached (an API error is raised)."""
        try:
            resp = self._core().read_node(name, _preload_content=False, _request_timeout=self._timeout())
            return slim_node(read_json(resp))
        except Exception as exc:
            if is_network_error(exc):  # an ApiException is none: raised for the caller
                return None
            raise

    # ------------------------------------------------------------------ events

    def refresh_events(self, ours: Iterable[tuple[str, str]]) -> None:
        """Pulling/Pulled events of the pods ``ours`` ((namespace, name) pairs), listed page by page."""
        from kubernetes.client.exceptions import ApiException

        ours = set(ours)
        if self._events_denied or not ours:
            return
        token = None
        try:
            while True:
                kwargs: dict[str, Any] = {"field_selector": "involvedObject.kind=Pod", "limit": 500}
                if token:
                    kwargs["_continue"] = token
                resp = self._core().list_namespaced_event(
                    self._namespace, _preload_content=False, _request_timeout=self._timeout(), **kwargs
                )
                data = read_json(resp)
                kept = {}
                for ev in data.get("items") or ():
                    obj = ev.get("involvedObject") or {}
                    if ev.get("reason") in PULL_REASONS and (obj.get("namespace") or "", obj.get("name")) in ours:
                        meta = ev.get("metadata") or {}
                        kept[meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"] = slim_event(ev)
                with self._lock:
                    changed = {k: v for k, v in kept.items() if self._events.get(k) != v}
                    if changed:
                        self._events.update(changed)
                        self.version += 1
                token = (data.get("metadata") or {}).get("continue")
                if not token:
                    return
        except ApiException as exc:
            if exc.status == 403:
                self._events_denied = True
                self.warnings.append("not allowed to list events: image pull times are unknown")
                return
            if exc.status == 410:
                return  # continue token expired; the next refresh starts over
            self.warnings.append(f"events: {exc.status} {exc.reason}")
        except Exception as exc:
            if not is_network_error(exc):
                raise
