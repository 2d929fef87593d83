"""Lists and watches of the stand-in Kubernetes API (:class:`ListWatch`, a mixin of
:class:`~standins.k8s_api.KubeAPIStandIn`, which owns the lock, the stores and the watch log
these read): one page of a list, a chunked watch stream of the log from a ``resourceVersion``
on (selectors, BOOKMARKs), and the 410s a test scripts (:meth:`ListWatch.expire`,
:meth:`ListWatch.expire_next_watches`). Split from :mod:`standins.k8s_api`.

Each behaviour, in full: docs/internals/stand-ins.md, "The Kubernetes API stand-in".
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from standins.k8s_objects import parse_field_selector, parse_label_selector, status_object

if TYPE_CHECKING:
    from standins.k8s_api import _Entry


class ListWatch:
    """Lists and watches for :class:`~standins.k8s_api.KubeAPIStandIn` (the server's state is its)."""

    _cond: threading.Condition
    _rv: int
    _compacted: int
    _expire_gen: int
    _expire_next: int
    _expire_next_http: int
    _expire_resource: str
    _pods: dict[tuple[str, str], dict[str, Any]]
    _events: dict[tuple[str, str], dict[str, Any]]
    _log: list[_Entry]
    _log_rvs: list[int]
    _open_watches: int
    _closing: bool
    watch_selectors: list[str]
    custom_objects: dict[str, dict[tuple[str, str], dict[str, Any]]]
    bookmarks: bool
    expired_sent: int

    @property
    def open_watches(self) -> int:
        with self._cond:
            return self._open_watches

    # ------------------------------------------------------------------ history (each expiry a 410)

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

    def expire_next_watches(self, count: int = 1, *, as_http_status: bool = False, resource: str = "pods") -> None:
        """The next ``count`` watch requests of ``resource`` get an immediate 410, whatever resourceVersion they ask.

        As an ``ERROR`` watch event (what the API server sends for a too-old resourceVersion), or
        with ``as_http_status`` as the HTTP status of the response itself (410 Gone + ``Status``).
        """
        with self._cond:
            self._expire_resource = resource
            if as_http_status:
                self._expire_next_http += count
            else:
                self._expire_next += count

    # ------------------------------------------------------------------ open watches

    def wait_for_watches(self, count: int, timeout: float = 10.0, *, selecting: str = "") -> None:
        """Until ``count`` watches are open (with ``selecting``: until one was asked whose selector has it)."""
        end = time.monotonic() + timeout
        with self._cond:
            while (not any(selecting in s for s in self.watch_selectors) if selecting else self._open_watches < count):
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self._open_watches} watch(es) open, waited for {count} {selecting}")
                self._cond.wait(left)

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
        store = (self._pods if resource == "pods" else self._events if resource == "events"
                 else self.custom_objects[resource])
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
            gone = self._expire_next_http > 0 and resource == self._expire_resource
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
            self.watch_selectors.append(query.get("labelSelector") or "")
            self._cond.notify_all()
            gen = self._expire_gen
            initial: list[bytes] = []
            refused = False
            if self._expire_next > 0 and resource == self._expire_resource:
                self._expire_next -= 1
                initial.append(expired(requested or "0"))
                refused = True
            elif requested in ("", "0"):  # "most recent": synthetic ADDED for the current state
                for obj in store.values():
                    if (namespace is None or obj["metadata"].get("namespace") == namespace) and match_labels(
                        obj["metadata"].get("labels") or {}
                    ) and match_name(obj["metadata"].get("namespace", ""),
                                     obj["metadata"]["name"]) and match_object(obj):
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
