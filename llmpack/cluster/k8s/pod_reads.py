"""The pod watcher's reads of the API (:class:`~llmpack.cluster.k8s.watcher.PodWatcher` is a :class:`PodReads`):
the namespace checked, pods listed page by page (each slimmed as its page arrives), every request bounded.

``kubernetes`` is imported inside the methods; an error a user can act on is one line
(:func:`~llmpack.cluster.k8s.api.api_error`).
"""

from __future__ import annotations

import time
from typing import Any

from components.errors import InputError
from llmpack.cluster.k8s.api import api_error, is_network_error, read_json
from llmpack.cluster.k8s.slim import slim_pod


class PodReads:
    """What the watcher reads of the API server; the watcher holds ``api_client``, ``namespace``,
    ``request_timeout_s`` and ``stats``."""

    api_client: Any
    namespace: str
    request_timeout_s: float
    stats: dict[str, int]

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    def _timeout(self, read_s: float | None = None) -> tuple[float, float]:
        connect_s, read_s = self.request_timeout_s, read_s if read_s is not None else self.request_timeout_s
        by = getattr(self, "_prepare_by", None)
        if by is not None:  # a slow server must not hold the first reads past the run's deadline
            left = max(0.5, by - time.monotonic())
            connect_s, read_s = min(connect_s, left), min(read_s, left)
        return (connect_s, read_s)

    def _check_namespace(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            read_json(self._core().read_namespace(self.namespace, _preload_content=False,
                                                  _request_timeout=self._timeout()))
        except ApiException as exc:
            if exc.status == 404:
                host = self.api_client.configuration.host
                raise InputError(f"namespace {self.namespace!r} not found on the Kubernetes API at {host}") from None
            if exc.status == 403:  # namespaced credentials often cannot read Namespace objects: go on
                return
            raise api_error(exc, self.api_client, f"read namespace {self.namespace!r}") from None
        except Exception as exc:
            if is_network_error(exc):
                raise api_error(exc, self.api_client, f"read namespace {self.namespace!r}") from None
            raise

    def _list_pods(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        """All pods for a selector (paged, each slimmed as its page arrives), and the list's resourceVersion."""
        from kubernetes.client.exceptions import ApiException

        items: list[dict[str, Any]] = []
        token, rv = None, ""
        while True:
            kwargs: dict[str, Any] = {"label_selector": selector, "limit": 500}
            if token:
                kwargs["_continue"] = token
            try:
                resp = self._core().list_namespaced_pod(
                    self.namespace, _preload_content=False, _request_timeout=self._timeout(), **kwargs
                )
            except ApiException as exc:
                if exc.status == 410 and token:  # the continue token expired: start over
                    items, token = [], None
                    continue
                raise
            data = read_json(resp)
            # Slimmed page by page: a first list of 10,000 raw pods held whole peaked at 214 MiB.
            items.extend(slim_pod(obj) for obj in data.get("items") or ())
            meta = data.get("metadata") or {}
            rv = meta.get("resourceVersion") or rv
            token = meta.get("continue")
            if not token:
                self.stats["lists"] += 1
                return items, rv
