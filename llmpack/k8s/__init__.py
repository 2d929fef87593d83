"""Kubernetes side of the telemetry: pod phases from dumps or from a live watch.

- :mod:`llmpack.k8s.podphases`: pure analysis of pod/node/event objects (plain dicts, the JSON
  of ``kubectl get ... -o json``), no ``kubernetes`` import; also the loaders for ``llmpack timeline``.
- :mod:`llmpack.k8s.watcher`: :class:`~llmpack.k8s.watcher.PodWatcher`, one watch per run group
  with the real ``kubernetes`` client, feeding the same analysis.

Nothing heavy is imported here, so ``import llmpack.k8s`` stays fast.
"""

from __future__ import annotations

# Pod labels the pack sets on every step pod (DESIGN.md: "Pod labels use the llmpack.io/ prefix").
LABEL_PREFIX = "llmpack.io/"
RUN_GROUP_LABEL = "llmpack.io/run-group"
PIPELINE_RUN_LABEL = "llmpack.io/pipeline-run"
ORCHESTRATOR_LABEL = "llmpack.io/orchestrator"
MODE_LABEL = "llmpack.io/mode"
STEP_LABEL = "llmpack.io/step"

__all__ = [
    "LABEL_PREFIX",
    "MODE_LABEL",
    "ORCHESTRATOR_LABEL",
    "PIPELINE_RUN_LABEL",
    "RUN_GROUP_LABEL",
    "STEP_LABEL",
]
