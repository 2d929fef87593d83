"""Kubernetes side of the telemetry: pod phases from dumps or from a live watch.

- :mod:`llmpack.cluster.k8s.objects`: what every reader of pod/node/event objects (plain dicts, the JSON
  of ``kubectl get ... -o json``) shares: label names, time parsing, field access, shape checks.
- :mod:`llmpack.cluster.k8s.podphases`: pure analysis of those objects into one row per pod, and the
  telemetry records of a run's pods; no ``kubernetes`` import.
- :mod:`llmpack.cluster.k8s.dumps` and :mod:`llmpack.cluster.k8s.timeline`: ``llmpack cluster timeline``.
- :mod:`llmpack.cluster.k8s.slim`: objects trimmed to what the analysis and node billing read (the watcher keeps these).
- :mod:`llmpack.cluster.k8s.billing`: pods and nodes billed (GPU-seconds per pod, node spans, node cost).
- :mod:`llmpack.cluster.k8s.api`: the Kubernetes API client (host and token, kubeconfig or in-cluster) and its
  errors in one line.
- :mod:`llmpack.cluster.k8s.watcher`: :class:`~llmpack.cluster.k8s.watcher.PodWatcher`, one watch per run group
  with the real ``kubernetes`` client, feeding the same analysis.

Nothing heavy is imported here, so ``import llmpack.cluster.k8s`` stays fast.
"""

from __future__ import annotations

# Pod labels the pack sets on every step pod (docs/telemetry-and-cost.md: pod labels use the llmpack.io/ prefix).
from components.labels import (
    LABEL_PREFIX,
    MODE_LABEL,
    ORCHESTRATOR_LABEL,
    PIPELINE_RUN_LABEL,
    RUN_GROUP_LABEL,
    STEP_LABEL,
)

__all__ = [
    "LABEL_PREFIX",
    "MODE_LABEL",
    "ORCHESTRATOR_LABEL",
    "PIPELINE_RUN_LABEL",
    "RUN_GROUP_LABEL",
    "STEP_LABEL",
]
