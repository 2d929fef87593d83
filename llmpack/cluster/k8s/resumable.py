"""One watch that resumes: the loop the pod watcher runs per selector, and its event watch runs too.

``Watch().stream(list_func, namespace, ...)`` from a list's ``resourceVersion``, window after
window (the server ends each after ``timeoutSeconds``; the next resumes from the last version
seen, bookmarks included). An expired version (an ``ERROR`` event or HTTP 410 Gone) is
survived by the caller's re-list, which gives a fresh version. A network error or another API
error is retried with backoff, up to ``max_failures`` in a row; 401 and 403 are not retried.
What the loop gives up on is returned, not raised: the caller decides whether that fails the
whole watch (pods) or only degrades it (events).

``kubernetes`` is imported inside :meth:`ResumableWatch.run`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmpack.cluster.k8s.api import is_network_error


@dataclass(kw_only=True)
class ResumableWatch:
    """``list_func`` (e.g. ``CoreV1Api(...).list_namespaced_pod``) watched in ``namespace`` with
    ``selectors`` (``label_selector=`` / ``field_selector=``); each event but a bookmark goes to
    ``apply(type, raw_object)``; ``relist()`` re-reads the collection after a 410 and returns its
    ``resourceVersion``. ``stats`` counts ``watches`` (requests) and ``expired`` (410s)."""

    list_func: Callable[..., Any]
    namespace: str
    selectors: Mapping[str, str]
    window_s: int
    request_timeout: tuple[float, float]
    apply: Callable[[str, dict[str, Any]], None]
    relist: Callable[[], str]
    stopping: Callable[[], bool]
    max_failures: int = 5
    stats: dict[str, int] = field(default_factory=lambda: {"watches": 0, "expired": 0})
    watch: Any = None  # the kubernetes Watch, once run() made it: stop() it from another thread

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()

    def run(self, rv: str) -> BaseException | None:
        """Watch from ``rv`` until ``stopping()``: None then, else the exception given up on."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        # Watch takes the event type from the function's docstring and builds a model (V1Pod...) for
        # every event. We read only event["raw_object"] (the JSON as sent), so hand it the same
        # function through a partial, which has no typed docstring: Watch then skips the per-event
        # model building, as documented ("If it cannot be determined, 'object' value will be the
        # same as 'raw_object'"). We track the resourceVersion ourselves.
        list_func = functools.partial(self.list_func)
        self.watch = w = watch.Watch()
        failures = 0
        while not self.stopping():
            try:
                self.stats["watches"] += 1
                stream = w.stream(
                    list_func,
                    self.namespace,
                    **self.selectors,
                    resource_version=rv,
                    timeout_seconds=self.window_s,
                    allow_watch_bookmarks=True,
                    _request_timeout=self.request_timeout,
                )
                for event in stream:
                    failures = 0
                    obj = event["raw_object"]
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion") if isinstance(obj, dict) else None
                    if event["type"] != "BOOKMARK":
                        self.apply(event["type"], obj)
                    rv = new_rv or rv
                    if self.stopping():
                        w.stop()
            except ApiException as exc:
                if self.stopping():
                    return None
                if exc.status == 410:  # Expired / Gone: the resourceVersion is too old
                    self.stats["expired"] += 1
                    try:
                        rv = self.relist()
                    except Exception as relist_exc:
                        failures += 1
                        if failures > self.max_failures:
                            return relist_exc
                        self._backoff(failures)
                    continue
                failures += 1
                if exc.status in (401, 403) or failures > self.max_failures:
                    return exc
                self._backoff(failures)
            except Exception as exc:
                if self.stopping():
                    return None
                failures += 1
                if not is_network_error(exc) or failures > self.max_failures:
                    return exc
                self._backoff(failures)
        return None

    @staticmethod
    def _backoff(failures: int) -> None:
        time.sleep(min(5.0, 0.1 * 2**failures))
