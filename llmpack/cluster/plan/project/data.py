"""Measured gangs in: the finetune gangs of MLflow run groups, or of kubectl dumps.

Both sources give, per gang (one run's TrainJob): its path, each node pod's times from its
creation (ready = container started, queue = scheduled, provision = its new node Ready, pull),
the run's fixed overhead before the gang's pods exist (submit -> node pods created; from dumps,
the run's first pod -> node pods created), the gang-ready -> first optimizer step time and the
training time after it, the GPUs per node and the price per GPU-hour. Per-run records come from
:func:`llmpack.report.facts.runs_from_mlflow`; dumps from :func:`llmpack.cluster.k8s.timeline.timeline_from_files`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components.errors import InputError

_NODE_EVENT = re.compile(r"^(pod_created|pod_scheduled|node_ready|container_started)\.node(\d+)$")
_RANK_EVENT = re.compile(r"^first_step\.rank\d+$")


@dataclass(frozen=True, kw_only=True)
class NodeTimes:
    """One node pod of a gang, seconds from the pod's creation (None: not recorded)."""

    ready_s: float
    queue_s: float | None = None
    provision_s: float | None = None
    pull_s: float | None = None
    billed_s: float = 0.0  # node Ready -> container started: spin-up on a node already billed


@dataclass(frozen=True, kw_only=True)
class MeasuredGang:
    """One run's finetune gang as measured."""

    path: str
    run: str
    nodes: tuple[NodeTimes, ...]
    overhead_s: float | None
    first_step_s: float | None
    train_s: float | None
    gpus_per_node: int | None
    price_per_gpu_hour: float | None


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else float(a) - float(b)


def _node(created: float | None, scheduled: float | None, node_ready: float | None, started: float | None,
          pull_s: float | None) -> NodeTimes | None:
    ready = _minus(started, created)
    if ready is None:
        return None
    billed = _minus(started, node_ready)
    return NodeTimes(ready_s=ready, queue_s=_minus(scheduled, created), provision_s=_minus(node_ready, created),
                     pull_s=pull_s, billed_s=max(0.0, billed) if billed is not None else 0.0)


def gang_of_run(run: Mapping[str, Any]) -> MeasuredGang | None:
    """The finetune gang of one run record (``compare``'s, or rebuilt from MLflow); None without one."""
    if run.get("status") not in (None, "succeeded"):
        return None
    ev = (run.get("events") or {}).get("finetune") or {}
    per_node: dict[int, dict[str, float]] = {}
    for key, value in ev.items():
        m = _NODE_EVENT.match(key)
        if m:
            per_node.setdefault(int(m.group(2)), {})[m.group(1)] = float(value)
    if not per_node:
        return None
    nodes = [_node(e.get("pod_created"), e.get("pod_scheduled"), e.get("node_ready"), e.get("container_started"), None)
             for _, e in sorted(per_node.items())]
    if any(n is None for n in nodes):
        return None
    created = min((e["pod_created"] for e in per_node.values() if "pod_created" in e), default=None)
    ready = max(e["container_started"] for e in per_node.values())
    ranks = sum(1 for k in ev if _RANK_EVENT.match(k))
    tags = run.get("tags") or {}
    try:
        price = float(tags["llmpack.price_per_gpu_hour"])
    except (KeyError, ValueError):
        price = None
    return MeasuredGang(path=str(run.get("orchestrator") or "unknown"), run=str(run.get("pipeline_run") or ""),
                        nodes=tuple(n for n in nodes if n is not None),
                        overhead_s=_minus(created, run.get("submitted_at")),
                        first_step_s=_minus(ev.get("first_step"), ready),
                        train_s=_minus(ev.get("finished"), ev.get("first_step")),
                        gpus_per_node=ranks // len(per_node) if ranks else None, price_per_gpu_hour=price)


def gangs_from_runs(runs: Iterable[Mapping[str, Any]]) -> list[MeasuredGang]:
    return [g for g in (gang_of_run(r) for r in runs) if g is not None]


def gangs_from_rows(rows: Iterable[Mapping[str, Any]], price_per_gpu_hour: float | None = None) -> list[MeasuredGang]:
    """Gangs of timeline rows (kubectl dumps): node pods grouped by TrainJob; the overhead from the
    run's first pod (its pipeline run's earliest) to the node pods' creation; training = the node
    pods' run time (dumps hold no in-container events, so no first-step split)."""
    rows = list(rows)
    first_pod: dict[str, float] = {}
    for r in rows:
        if r.get("pipeline_run") and r.get("created") is not None and not r.get("gang"):
            first_pod[r["pipeline_run"]] = min(first_pod.get(r["pipeline_run"], r["created"]), r["created"])
    by_gang: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("gang") and r.get("phase") == "Succeeded":
            by_gang.setdefault(r["gang"], []).append(r)
    gangs = []
    for name, mine in sorted(by_gang.items()):
        nodes = [_node(r.get("created"), r.get("scheduled"), r.get("node_ready"), r.get("container_started"),
                       r.get("image_pull_s")) for r in mine]
        if any(n is None for n in nodes):
            continue
        created = min(r["created"] for r in mine)
        run = mine[0].get("pipeline_run")
        runs = [_minus(r.get("finished"), r.get("container_started")) for r in mine]
        gangs.append(MeasuredGang(
            path=str(mine[0].get("orchestrator") or "unknown"), run=str(run or name),
            nodes=tuple(n for n in nodes if n is not None),
            overhead_s=_minus(created, first_pod.get(run or "")), first_step_s=None,
            train_s=min((t for t in runs if t is not None), default=None),
            gpus_per_node=mine[0].get("gang_gpus"), price_per_gpu_hour=price_per_gpu_hour))
    return gangs


def from_mlflow(run_groups: Iterable[str], tracking_uri: str | None) -> list[MeasuredGang]:
    """Every succeeded gang of the run groups in the MLflow store."""
    from components.record import tracking
    from llmpack.report.facts import runs_from_mlflow

    mc = tracking.client(tracking_uri)
    gangs: list[MeasuredGang] = []
    for group in run_groups:
        found = gangs_from_runs(_with_node_events(mc, r) for r in runs_from_mlflow(mc, group))
        if not found:
            raise InputError(f"run group {group!r}: no finetune gang (runs with --nodes > 1) among its succeeded runs")
        gangs += found
    return gangs


def _with_node_events(mc: Any, run: dict[str, Any]) -> dict[str, Any]:
    """The run with finetune's every event, ``<event>.node<R>`` included (the report's rebuilt
    events keep the step's own events only)."""
    from components.record import tracking
    from components.record.telemetry import RunContext, group_by_step

    metrics = mc.get_run(run["artifacts"]["mlflow_run_id"]).data.metrics
    ctx = RunContext(run_group=run["run_group"], pipeline_run=run["pipeline_run"], orchestrator=run["orchestrator"],
                     mode=run["mode"], submitted_at=run["submitted_at"])
    step = group_by_step(tracking.records_from_run(metrics, ctx)).get("finetune")
    return {**run, "events": {**run["events"], "finetune": dict(step.events) if step else {}}}


def from_dumps(pods: str, nodes: str | None, events: str | None, price_flag: Any = None) -> list[MeasuredGang]:
    """Every succeeded gang in kubectl dumps; the price from the flag, else the nodes' GPU type."""
    from llmpack.cluster.k8s.timeline import timeline_from_files
    from llmpack.gpu_catalogue import node_gpu, resolve_node_price

    rows = timeline_from_files(pods, nodes=nodes, events=events)
    gang_rows = [r for r in rows if r.get("gang")]
    if not gang_rows:
        raise InputError(f"{pods}: no TrainJob node pods (label jobset.sigs.k8s.io/jobset-name): "
                         "no gang to project from")
    price = resolve_node_price(node_gpu(gang_rows[0], None), flag=price_flag)
    return gangs_from_rows(rows, price.per_gpu_hour if price else None)
