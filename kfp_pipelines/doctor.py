"""What ``llmpack doctor`` reads of the KFP backend's compiled pipeline: its executors' security contexts.

The pods are in the platform spec (kfp-kubernetes' ``deploymentSpec.executors``); KFP's own driver
and launcher containers are not in the artifact and are not judged.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from components.compiled_pods import PodSpec


def compiled_pods(docs: list[Any]) -> Iterator[PodSpec]:
    """Each executor of the platform spec, its container's ``securityContext`` (KFP sets no pod-level one)."""
    platform = next((d for d in docs if isinstance(d, dict) and "platforms" in d), {})
    kubernetes = (platform.get("platforms") or {}).get("kubernetes") or {}
    executors = (kubernetes.get("deploymentSpec") or {}).get("executors") or {}
    for name, executor in sorted(executors.items()):
        context = dict(executor.get("securityContext") or {})  # kfp-kubernetes: the executor container's
        yield PodSpec(f"kfp {name}", {}, (("main", context),))
