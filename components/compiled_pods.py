"""The pods a compiled artifact asks for, as ``llmpack cluster doctor``'s Pod Security check reads them.

Each backend reads its own artifact's shape (:attr:`components.doctor_facts.DoctorFacts.compiled_pods`);
what they share is here: the security-relevant fields of one pod (:class:`PodSpec`) and every
pod spec found inside a document (:func:`pod_specs_in`), which is also how a backend's artifact
of no known shape, and the TrainJob's, are read (docs/first-run-on-a-cluster.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PodSpec:
    """One pod's security-relevant fields: where it comes from, its pod-level context, its containers' contexts."""

    where: str  # e.g. "argo template finetune"
    pod: Mapping[str, Any] = field(default_factory=dict)
    containers: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    host_path: bool = False


def pod_specs_in(doc: Any, where: str = "pod") -> Iterator[PodSpec]:
    """Every pod spec (a mapping with ``containers``) inside ``doc``."""
    if isinstance(doc, Mapping):
        if isinstance(doc.get("containers"), list):
            containers = tuple((str(c.get("name")), dict(c.get("securityContext") or {}))
                               for c in [*doc.get("initContainers", []), *doc["containers"]] if isinstance(c, Mapping))
            host_path = any(isinstance(v, Mapping) and "hostPath" in v for v in doc.get("volumes") or [])
            yield PodSpec(where, dict(doc.get("securityContext") or {}), containers, host_path)
            return
        for key, value in doc.items():
            yield from pod_specs_in(value, str(doc.get("name") or where) if key != "metadata" else where)
    elif isinstance(doc, list):
        for item in doc:
            yield from pod_specs_in(item, where)


def pods_of(docs: list[Any]) -> Iterator[PodSpec]:
    """Every pod spec in a compiled file's documents: the reader of a backend that declares none of its own."""
    for doc in docs:
        yield from pod_specs_in(doc)
