"""``compare --cluster --preempt``: take the step's GPU pod away at the chosen moment, as a preemption would.

llmpack evicts the pod (``POST .../pods/NAME/eviction``), as a drain or a chaos tool does, so the
record reads it as it reads a spot reclaim (:mod:`llmpack.cluster.k8s.preemption`). The moment is the step's
container start plus ``at_s`` (or a drawn rate), once per run; a refusing PodDisruptionBudget is
retried, a pod already gone skipped; a gang's node pod, never its launcher. Needs ``create`` on
``pods/eviction``. In full: docs/internals/pod-watcher.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from llmpack.cluster.k8s.preemption import PreemptSpec

Rows = list[dict[str, Any]]


class PreemptInjector:
    """Evicts the pods of ``spec.step`` (pods whose step is one of ``pod_steps``) of one run, from
    ``rows()`` (the run's watcher rows); :meth:`start`, then :meth:`stop` returns the evictions made."""

    def __init__(self, api_client: Any, spec: PreemptSpec, rows: Callable[[], Rows], *, pod_steps: Collection[str],
                 clock: Callable[[], float] = time.time, poll_s: float = 0.5, gang: bool = False) -> None:
        self.api_client, self.spec, self.rows = api_client, spec, rows
        self.pod_steps = frozenset(pod_steps)
        self.clock, self.poll_s = clock, poll_s
        self.gang = gang  # the step is a TrainJob gang: evict its newest node pod (JobSet restarts the gang whole)
        self.evictions: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PreemptInjector:
        self._thread = threading.Thread(target=self._loop, name="preempt-injector", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        return list(self.evictions)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                if self.step():
                    return
            except Exception as exc:  # noqa: BLE001 - the run is still measured without the preemption
                self.warnings.append(f"--preempt: {type(exc).__name__}: {exc}")
                return

    def step(self) -> bool:
        """One look at the rows: evict when due. True when there is nothing more to do."""
        mine = sorted((r for r in self.rows() if r.get("step") in self.pod_steps and r.get("role") != "driver"
                       and bool(r.get("gang")) == self.gang),
                      key=lambda r: (r.get("created") or 0.0, str(r.get("pod"))))
        evicted = {e["pod"] for e in self.evictions}
        preempted = [r for r in mine if r.get("disruption") or r.get("pod") in evicted]
        moments = self.spec.moments(float("inf")) if self.spec.rate_per_h is not None else [self.spec.at_s or 0.0]
        if len(preempted) >= len(moments):
            return True
        live = [r for r in mine if r.get("container_started") is not None
                and r.get("phase") not in ("Succeeded", "Failed")
                and not r.get("deleted") and r.get("pod") not in evicted]
        if not live:
            return bool(mine) and all(r.get("phase") == "Succeeded" for r in mine)  # the step finished unpreempted
        target = live[-1]
        due = float(target["container_started"]) + moments[len(preempted)]
        if self.clock() >= due:
            self._evict(target)
        return False

    def _evict(self, row: Mapping[str, Any]) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        ns, name = row.get("namespace") or "default", str(row["pod"])
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}
        try:
            client.CoreV1Api(self.api_client).create_namespaced_pod_eviction(name, ns, body, _preload_content=False,
                                                                             _request_timeout=15)
        except ApiException as exc:
            if exc.status == 429:  # a PodDisruptionBudget: try again on the next poll
                return
            if exc.status == 404:  # gone already
                self.evictions.append({"pod": name, "namespace": ns, "requested_at": self.clock(), "status": 404})
                return
            raise
        self.evictions.append({"pod": name, "namespace": ns, "requested_at": self.clock(), "status": 201})
