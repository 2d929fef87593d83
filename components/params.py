"""Pipeline parameters: what one is (:class:`Param`), and the ones the record adds to every task.

:data:`TELEMETRY_PARAMS` (every task gets them, to measure against the client's submit time),
:data:`RUNTIME_PARAMS` (filled by each orchestrator) and :data:`CLOSE_TASK` (the summarizing
task every compiled pipeline ends with) belong to the record (docs/internals/record.md), not to the
authoring model in :mod:`components.dsl`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Param:
    name: str
    type: type
    default: Any = inspect.Parameter.empty

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty


# Every task receives these, so every step can measure against the client's submit time.
TELEMETRY_PARAMS: dict[str, Param] = {
    "submitted_at": Param(name="submitted_at", type=float, default=0.0),
    "run_group": Param(name="run_group", type=str, default=""),
    "pipeline_run": Param(name="pipeline_run", type=str, default=""),
    "orchestrator": Param(name="orchestrator", type=str, default="direct"),
    "mode": Param(name="mode", type=str, default="local"),
}

# The summarizing task every compiled path ends with (components.record): no step may take its name.
CLOSE_TASK = "close-record"

# Filled by each orchestrator, not by users: its own id of the run (KFP job id, Argo workflow
# name, MLflow run id), which an empty ``pipeline_run`` falls back to.
RUNTIME_PARAMS: dict[str, Param] = {
    "orchestrator_run_id": Param(name="orchestrator_run_id", type=str, default=""),
}
