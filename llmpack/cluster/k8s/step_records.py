"""One run's pod rows as its record's cluster events: each step's attempts in creation order, a TrainJob gang's
node pods numbered by the launcher attempt before them (docs/internals/pod-watcher.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from components.record.telemetry import Record, RunContext, make_record

# Row field -> telemetry event name (components.record.telemetry.CLUSTER_EVENTS).
STEP_EVENT_FIELDS = (
    ("pod_created", "created"),
    ("pod_scheduled", "scheduled"),
    ("node_ready", "node_ready"),
    ("container_started", "container_started"),
)


def _row_matches(row: Mapping[str, Any], ctx: RunContext) -> bool:
    if row.get("run_group") and ctx.run_group and row["run_group"] != ctx.run_group:
        return False
    if row.get("pipeline_run"):
        return row["pipeline_run"] == ctx.pipeline_run
    return row.get("orchestrator") == ctx.orchestrator


# The MLflow Kubernetes Job runs the whole pipeline (the ``main`` entry point) in one pod, labelled
# ``llmpack.io/step=main``: its pod phases are the training step's spin-up.
DEFAULT_STEP_ALIASES = {"main": "finetune"}


def to_step_records(
    rows: Iterable[Mapping[str, Any]],
    ctx: RunContext,
    *,
    steps: Iterable[str] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> list[Record]:
    """Cluster events of one pipeline run as telemetry records, ready for the JSONL sink / MLflow.

    Rows are those of ``ctx``'s pipeline run (``pipeline_run``, from the ``llmpack.io/pipeline-run``
    label or, for KFP pods, from the ``runs`` given to :func:`analyze`; rows with none match on
    orchestrator). A pod's step is renamed through ``aliases`` (default
    :data:`DEFAULT_STEP_ALIASES`: the MLflow Job's ``main`` pod counts as ``finetune``). Per step
    (all, or ``steps``) every executor pod counts, numbered by creation: the first-created is
    attempt 0, a retried pod attempt 1, and so on (records keyed by attempt: a retry never moves
    the first pod's ``pod_created``, and every attempt is billed; see
    :mod:`components.record.telemetry`). A TrainJob's node pods (rows with ``gang``) are not attempts:
    they belong to the attempt of the launcher pod before them (:func:`gang_attempt`) and give
    ``<event>.node<rank>`` records (``node_ready.node1``), one set per node. On a cluster this
    numbering is the attempt's authority: a retry is a fresh pod whose step cannot count its
    attempts in its own JSONL. KFP driver pods are the
    orchestrator's overhead, not a step, and give no records; ``node_ready`` only appears when a
    node was provisioned for the pod.
    """
    aliases = DEFAULT_STEP_ALIASES if aliases is None else aliases
    wanted = None if steps is None else set(steps)
    pods: dict[str, list[Mapping[str, Any]]] = {}
    gangs: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        step = aliases.get(row.get("step") or "", row.get("step"))
        if not step or row.get("role") == "driver" or not _row_matches(row, ctx):
            continue
        if wanted is not None and step not in wanted:
            continue
        (gangs if row.get("gang") else pods).setdefault(step, []).append(row)
    ordered = {step: sorted(mine, key=_creation_order) for step, mine in pods.items()}
    records = []
    for step in sorted(ordered, key=lambda s: (ordered[s][0].get("created") or 0.0, s)):
        for attempt, row in enumerate(ordered[step]):
            for event, field in STEP_EVENT_FIELDS:
                if row.get(field) is not None:
                    records.append(make_record(ctx, "event", step, event, row[field], attempt))
    for step, mine in sorted(gangs.items()):
        launchers = ordered.get(step, [])
        for row in sorted(mine, key=_creation_order):
            node = row.get("gang_node")
            if node is None:
                continue
            attempt = gang_attempt(row, launchers)
            for event, field in STEP_EVENT_FIELDS:
                if row.get(field) is not None:
                    records.append(make_record(ctx, "event", step, f"{event}.node{node}", row[field], attempt))
    return records


def gang_attempt(row: Mapping[str, Any], launchers: Sequence[Mapping[str, Any]]) -> int:
    """The attempt a TrainJob node pod belongs to: that of the step's last pod (its launcher, or
    the MLflow Job's pod) created before it. A gang's pods are one attempt, never retries."""
    created = _creation_order(row)[0]
    before = [n for n, r in enumerate(launchers) if _creation_order(r)[0] <= created]
    return before[-1] if before else 0


def _creation_order(row: Mapping[str, Any]) -> tuple[float, str]:
    """Pods in the order they were created (one never seen created last), then by name."""
    created = row.get("created")
    return (math.inf if created is None else float(created), str(row.get("pod") or ""))
