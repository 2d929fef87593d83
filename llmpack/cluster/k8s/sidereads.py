"""What the pod watcher reads beside its watch: the nodes its pods ran on, and their image-pull events.

Nodes are read, not watched (get on the few we use, several at a time: :data:`NODE_READERS`),
once when a pod lands and again periodically and at the end, to see a node's removal for node
billing. Image-pull events are listed once and then watched (the API server keeps events an hour),
listed again at the end only where the watch left a gap; a 403 degrades to one warning.
:attr:`SideReads.version` moves only when what was read changed. Thread-safe; ``kubernetes`` is
imported inside the functions. Each choice and why: docs/internals/pod-watcher.md.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from llmpack.cluster.k8s.api import is_network_error, read_json
from llmpack.cluster.k8s.resumable import ResumableWatch
from llmpack.cluster.k8s.slim import node_facts, slim_event, slim_node

NODE_READERS = 8  # node reads in flight at once

PULL_REASONS = ("Pulling", "Pulled")
PENDING_EVENTS = 4096  # pull events of pods the pod watch has not delivered yet, at most
EVENT_SELECTOR = "involvedObject.kind=Pod"

PodKey = tuple[str, str]  # (namespace, name)


class SideReads:
    """Nodes and image-pull events of the watched pods, for :class:`~llmpack.cluster.k8s.watcher.PodWatcher`.

    ``core`` makes a ``CoreV1Api``; ``timeout`` gives the ``_request_timeout`` of a call; messages
    for the user go to ``warnings`` (the watcher's list); ``is_ours(namespace, pod)`` says whether
    the pod watch has delivered that pod; ``relisting`` is held during a re-list after a 410.
    """

    def __init__(
        self,
        core: Callable[[], Any],
        namespace: str,
        timeout: Callable[[], Any],
        warnings: list[str],
        is_ours: Callable[[str, str], bool],
        relisting: threading.Lock | None = None,
    ) -> None:
        self._core = core
        self._is_ours = is_ours
        self._relisting = relisting or threading.Lock()  # shared with the pod watch's re-lists: one at a time
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
        self._pulled: set[PodKey] = set()  # pods with a Pulled event kept
        self._pending: OrderedDict[str, tuple[PodKey, dict[str, Any]]] = OrderedDict()
        self._events_denied = False
        self._event_watch: ResumableWatch | None = None
        self._events_live = False
        self._stopping = False
        self.event_stats = {"watches": 0, "expired": 0, "events": 0, "listings": 0}

    # ------------------------------------------------------------------ what was read

    def want(self, node: str) -> None:
        """A pod landed on ``node``: read it at the next :meth:`fetch_nodes` (cheap; called per event)."""
        if node not in self._nodes:
            with self._lock:
                self._wanted.add(node)

    def settle(self) -> int:
        """Take in the held events of pods the pod watch has delivered since; the :attr:`version` after."""
        with self._lock:
            self._promote_pending_locked()
            return self.version

    def snapshot(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(slim nodes, slim events) as read so far."""
        with self._lock:
            self._promote_pending_locked()
            return list(self._nodes.values()), list(self._events.values())

    def facts(self) -> list[dict[str, Any]]:
        """:func:`~llmpack.cluster.k8s.slim.node_facts` of every node read, ``removed`` filled in from a re-read
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
                    self.warnings.append("not allowed to read nodes: instance type, GPU product and node_ready "
                                         "are unknown")
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
            names = sorted(n for n, node in self._nodes.items()
                           if n not in self._gone and node_facts(node)["removed"] is None)
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

    @property
    def events_watched(self) -> bool:
        """Whether the event watch runs, or ran until :meth:`stop` (else events are listed periodically)."""
        return self._events_live

    def events_complete(self, started: Iterable[PodKey]) -> bool:
        """Whether the watched events leave nothing for a last listing: the watch ran to the end
        and each pod in ``started`` (pods that started a container) has its ``Pulled`` event."""
        if self._events_denied:
            return True
        if not self.events_watched:
            return False
        with self._lock:
            self._promote_pending_locked()
            return all(key in self._pulled for key in started)

    def watch_events(self, *, window_s: int, request_timeout: tuple[float, float], max_failures: int) -> None:
        """List the pull events now, then watch them in a background thread until :meth:`stop`.

        A 403 on the watch (RBAC gave ``list`` without ``watch``) or a watch that gives up
        leaves the periodic listing (:meth:`refresh_events`) to the caller, with one warning.
        """
        rv = self.refresh_events()
        if rv is None or self._events_denied:
            return
        loop = ResumableWatch(
            list_func=self._core().list_namespaced_event,
            namespace=self._namespace,
            selectors={"field_selector": EVENT_SELECTOR},
            window_s=window_s,
            request_timeout=request_timeout,
            apply=self._apply_event,
            relist=self._relist_events,
            stopping=lambda: self._stopping,
            max_failures=max_failures,
            stats=self.event_stats,
        )

        def target() -> None:
            error = loop.run(rv)
            if error is not None:
                self._events_live = False
                status = getattr(error, "status", None)
                why = f"{status} {getattr(error, 'reason', '')}".strip() if status else type(error).__name__
                self.warnings.append(f"watching events failed ({why}): listing them every few minutes instead")

        self._event_watch = loop
        self._events_live = True
        threading.Thread(target=target, name="event-watch", daemon=True).start()

    def stop(self) -> None:
        """Stop the event watch (its thread is a daemon, blocked at most until the server's window ends)."""
        self._stopping = True
        if self._event_watch is not None:
            self._event_watch.stop()

    def _relist_events(self) -> str:
        with self._relisting:
            rv = self.refresh_events()
        if rv is None:
            raise RuntimeError("events could not be listed after the watch expired")
        return rv

    def _apply_event(self, etype: str, ev: dict[str, Any]) -> None:
        """One watched event: kept if a pull of ours, kept too when the server deletes it (expired)."""
        self.event_stats["events"] += 1
        self._take_event(etype, ev)

    def _take_event(self, etype: str, ev: dict[str, Any]) -> None:
        if etype == "DELETED" or ev.get("reason") not in PULL_REASONS:
            return  # DELETED: expired on the server; what we kept (or hold pending) stays
        obj = ev.get("involvedObject") or {}
        pod = (obj.get("namespace") or "", obj.get("name") or "")
        meta = ev.get("metadata") or {}
        key = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"
        slim = slim_event(ev)
        with self._lock:
            if self._is_ours(*pod):
                self._keep_locked(key, pod, slim)
            else:  # the pod watch may deliver this pod a moment later
                self._pending[key] = (pod, slim)
                self._pending.move_to_end(key)
                while len(self._pending) > PENDING_EVENTS:
                    self._pending.popitem(last=False)

    def _keep_locked(self, key: str, pod: PodKey, slim: dict[str, Any]) -> None:
        if self._events.get(key) != slim:
            self._events[key] = slim
            self.version += 1
        if slim["reason"] == "Pulled":
            self._pulled.add(pod)

    def _promote_pending_locked(self) -> None:
        for key in [k for k, (pod, _) in self._pending.items() if self._is_ours(*pod)]:
            pod, slim = self._pending.pop(key)
            self._keep_locked(key, pod, slim)

    def refresh_events(self) -> str | None:
        """List the Pulling/Pulled events of our pods page by page; the list's resourceVersion,
        or None when it could not be read (denied, unreachable, or a continue token expired)."""
        from kubernetes.client.exceptions import ApiException

        if self._events_denied:
            return None
        token, rv = None, None
        try:
            while True:
                kwargs: dict[str, Any] = {"field_selector": EVENT_SELECTOR, "limit": 500}
                if token:
                    kwargs["_continue"] = token
                resp = self._core().list_namespaced_event(
                    self._namespace, _preload_content=False, _request_timeout=self._timeout(), **kwargs
                )
                data = read_json(resp)
                for ev in data.get("items") or ():
                    self._take_event("ADDED", ev)
                meta = data.get("metadata") or {}
                rv = meta.get("resourceVersion") or rv
                token = meta.get("continue")
                if not token:
                    self.event_stats["listings"] += 1
                    return rv or ""
        except ApiException as exc:
            if exc.status == 403:
                self._events_denied = True
                self.warnings.append("not allowed to list events: image pull times are unknown")
                return None
            if exc.status == 410:
                return None  # continue token expired; the next refresh starts over
            self.warnings.append(f"events: {exc.status} {exc.reason}")
        except Exception as exc:
            if not is_network_error(exc):
                raise
        return None
