"""The artifact types a step declares (``Input[Dataset]``, ``Output[Model]``...) and the parameter types it may take.

Part of the authoring model (:mod:`components.dsl` re-exports them, as ``kfp.dsl`` does its types).
"""

from __future__ import annotations

from typing import Generic, TypeVar


class Artifact:
    """A directory produced by one step and consumed by others."""

    kind = "artifact"

    def __init__(self, path: str) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"


class Dataset(Artifact):
    kind = "dataset"


class Model(Artifact):
    kind = "model"


class Metrics(Artifact):
    kind = "metrics"


ARTIFACT_TYPES: dict[str, type[Artifact]] = {c.kind: c for c in (Dataset, Model, Metrics)}
PARAM_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}

A = TypeVar("A", bound=Artifact)


class Input(Generic[A]):
    """Annotation: an artifact directory this step reads."""


class Output(Generic[A]):
    """Annotation: an artifact directory this step writes."""
