"""What ``llmpack doctor`` reads of the MLflow backend's compiled Kubernetes Job: its pod template."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from components.compiled_pods import PodSpec, pod_specs_in


def compiled_pods(docs: list[Any]) -> Iterator[PodSpec]:
    """The Job template's pod spec (and any inside it), named as the MLflow Job's."""
    spec = ((((docs[0] if docs else {}).get("spec") or {}).get("template") or {}).get("spec")) or {}
    for found in pod_specs_in(spec):
        yield PodSpec(f"mlflow Job {found.where}", found.pod, found.containers, found.host_path)
