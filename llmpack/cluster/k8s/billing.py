"""Pods and nodes billed: a cluster run's GPU time and cost from the pod watcher's rows.

Container billing (:func:`cluster_cost`): every GPU pod (retries too) from its main container's
start to its finish, plus node provisioning when a node was brought up for it; the pods before a
step's last one are its retried attempts (:func:`retried_pods`). Node billing (:func:`pod_spans`,
:func:`node_spans`, :func:`node_cost`, with :func:`components.record.cost.bill_nodes`): each GPU
node from Ready or first scheduling to its removal or the last pod plus the scale-down delay,
shared between runs by pod GPU-seconds; :func:`llmpack.report.rebill.rebill` re-bills recorded runs with
another delay.
The rules are in :mod:`llmpack.cluster.compare.cluster`'s module doc.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from components.record import cost, telemetry
from llmpack.backends import runs_in_one_pod


def pod_billed_s(row: Mapping[str, Any]) -> float | None:
    """A pod row's GPU seconds as billed: container start to finish, plus its node's provisioning
    when the node was brought up for it. A disrupted pod whose end the watcher never saw (its
    node went away, the pod was deleted with it) is billed to its disruption, as the preemption
    accounting counts it (:mod:`llmpack.cluster.k8s.preemption`); no end at all: None (not billed here)."""
    start, end = row.get("container_started"), row.get("finished") or row.get("disrupted_at")
    if start is None or end is None:
        return None
    billed = end - start
    created, ready = row.get("created"), row.get("node_ready")
    if created is not None and ready is not None and ready > created:
        billed += ready - created
    return billed


def pod_gpus_by_step(uses: Iterable[cost.GpuUse], fused: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, int]:
    """GPUs by the ``llmpack.io/step`` a pod carries: each step's, and a fused task's (its members share its pod)."""
    gpus = {u.step: u.gpus for u in uses}
    for task, members in (fused or {}).items():
        gpus[task] = max((gpus.get(m, 0) for m in members), default=0)
    return gpus


def cluster_cost(
    steps: Mapping[str, telemetry.StepTimes],
    rows: Iterable[Mapping[str, Any]],
    uses: list[cost.GpuUse],
    orchestrator: str,
    price: cost.Price | None,
    gang: tuple[int, int] | None = None,
    fused: Mapping[str, tuple[str, ...]] | None = None,
    wall_s: float | None = None,
) -> dict[str, float | None]:
    """gpu_hours, cost_usd, usd_per_1m_tokens, goodput from the run's GPU pods (see the module doc).

    ``gang`` (nodes, GPUs per node): finetune is a TrainJob gang; ``uses`` are the compiled
    pipeline's (its launcher holds no GPU), each gang pod bills its own GPUs. ``fused``
    (:func:`~llmpack.cluster.compare.pods.fused_tasks`): a fused pod bills its GPUs once for all of its member steps.
    """
    rows = list(rows)
    fused = fused or {}
    gpus_by_step = pod_gpus_by_step(uses, fused)
    job_gpus = max(gpus_by_step.values(), default=0)
    gpu_seconds, retry_seconds, billed_steps = 0.0, 0.0, set()
    attempts = pod_attempts(rows)
    retried = 0
    for row in rows:
        if row.get("role") == "driver":
            continue
        step = row.get("step")
        was_retried = not attempts.get(id(row), (0, True))[1]
        retried += was_retried
        if row.get("gang"):
            gpus, covers = _pod_gpus(row, gpus_by_step, gang), {step}
        elif runs_in_one_pod(orchestrator, step):
            gpus, covers = job_gpus, {s for s, g in gpus_by_step.items() if g > 0}
        elif step in fused:
            gpus, covers = gpus_by_step[step], set(fused[step])
        else:
            gpus, covers = gpus_by_step.get(step or "", 0), {step}
        billed = pod_billed_s(row) if gpus > 0 else None
        if billed is None:
            continue
        gpu_seconds += gpus * billed
        retry_seconds += gpus * billed if was_retried else 0.0
        billed_steps |= covers
    for use in uses:
        if use.gpus > 0 and use.step not in billed_steps and use.step in steps:
            retried += len(steps[use.step].retried)
            for attempt in steps[use.step].all_attempts:
                billed = cost.billed_seconds(attempt)
                if billed is not None:
                    gpu_seconds += use.gpus * billed
                    retry_seconds += use.gpus * billed if attempt in steps[use.step].retried else 0.0
    train_gpus = gang[0] * gang[1] if gang else gpus_by_step.get(telemetry.TRAIN_STEP, 0)
    return cost.bill_metrics(gpu_seconds=gpu_seconds, train=steps.get(telemetry.TRAIN_STEP), train_gpus=train_gpus,
                             price=price, retries=retried, retry_gpu_hours=retry_seconds / 3600.0,
                             wall_s=wall_s, held_gpus=max(job_gpus, train_gpus))


def pod_attempts(rows: Iterable[Mapping[str, Any]]) -> dict[int, tuple[int, bool]]:
    """Per executor pod row (by ``id``): its attempt (the step's pods numbered by creation, as
    :func:`~llmpack.cluster.k8s.step_records.to_step_records` numbers them) and whether it is the step's last.
    A TrainJob's node pods (``gang``) are not attempts: they are left out (never retries)."""
    by_step: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("role") != "driver" and row.get("step") and not row.get("gang"):
            by_step.setdefault(row["step"], []).append(row)
    out: dict[int, tuple[int, bool]] = {}
    for mine in by_step.values():
        mine.sort(key=lambda r: (math.inf if r.get("created") is None else float(r["created"]),
                                 str(r.get("pod") or "")))
        for n, row in enumerate(mine):
            out[id(row)] = (n, n == len(mine) - 1)
    return out


def retried_pods(rows: Iterable[Mapping[str, Any]], uses: list[cost.GpuUse], orchestrator: str,
                 price: cost.Price | None, fused: Mapping[str, tuple[str, ...]] | None = None) -> list[dict[str, Any]]:
    """The run's retried attempts on the cluster: every executor pod but each step's last, with its
    container time, GPU-hours and cost (the shape of ``components.record.retried_attempts``)."""
    rows = list(rows)
    gpus_by_step = pod_gpus_by_step(uses, fused)
    attempts = pod_attempts(rows)
    out = []
    for row in rows:
        attempt, last = attempts.get(id(row), (0, True))
        if last:
            continue
        gpus = _pod_gpus(row, gpus_by_step)
        billed = pod_billed_s(row)
        hours = gpus * (billed or 0.0) / 3600.0
        out.append({"step": row["step"], "attempt": attempt, "billed_s": billed, "gpu_hours": hours,
                    "cost_usd": None if price is None else hours * price.per_gpu_hour, "pod": row.get("pod")})
    return sorted(out, key=lambda a: (a["step"], a["attempt"]))


def _pod_gpus(row: Mapping[str, Any], gpus_by_step: Mapping[str, int], gang: tuple[int, int] | None = None) -> int:
    """GPUs a pod row holds: its step's; the MLflow Job's one pod, the largest step's; a TrainJob
    node pod its own (``llmpack.io/gpu-count``, else the gang's GPUs per node)."""
    if row.get("role") == "driver":
        return 0
    if row.get("gang"):
        return int(row.get("gang_gpus") or (gang[1] if gang else 0))
    if runs_in_one_pod(row.get("orchestrator"), row.get("step")):
        return max(gpus_by_step.values(), default=0)
    return gpus_by_step.get(row.get("step") or "", 0)


def pod_spans(rows: Iterable[Mapping[str, Any]], gpus_by_step: Mapping[str, int],
              gang: tuple[int, int] | None = None) -> list[cost.PodSpan]:
    """The GPU pods among watcher rows (one per pod, by namespace and name), for node billing."""
    seen: dict[tuple[str, str], cost.PodSpan] = {}
    for row in rows:
        gpus = _pod_gpus(row, gpus_by_step, gang)
        if gpus <= 0 or not row.get("node") or not row.get("pipeline_run"):
            continue
        seen[(row.get("namespace") or "", row["pod"])] = cost.PodSpan(
            run=row["pipeline_run"], node=row["node"], gpus=gpus, created=row.get("created"),
            scheduled=row.get("scheduled"), started=row.get("container_started"), finished=row.get("finished"))
    return list(seen.values())


def node_spans(facts: Iterable[Mapping[str, Any]], pods: Iterable[cost.PodSpan]) -> dict[str, cost.NodeSpan]:
    """Nodes from the watchers' :meth:`~llmpack.cluster.k8s.watcher.PodWatcher.nodes`, several views merged
    (a removal any of them saw counts); GPU count unknown: the largest GPU request of its pods."""
    largest: dict[str, int] = {}
    for p in pods:
        largest[p.node] = max(largest.get(p.node, 0), p.gpus)
    merged: dict[str, dict[str, Any]] = {}
    for f in facts:
        name = f.get("name")
        if not name:
            continue
        have = merged.setdefault(name, dict(f))
        for key in ("gpus", "created", "ready", "removed"):
            if have.get(key) is None and f.get(key) is not None:
                have[key] = f[key]
    return {name: cost.NodeSpan(name=name, gpus=int(f.get("gpus") or largest.get(name, 0)), created=f.get("created"),
                                ready=f.get("ready"), removed=f.get("removed"))
            for name, f in merged.items()}


def _compute_gpu_seconds(events: Mapping[str, Mapping[str, float]], gpus_by_step: Mapping[str, int]) -> float:
    """GPU-seconds the GPU steps spent training or evaluating: ``model_loaded`` to ``finished``."""
    total = 0.0
    for step, gpus in gpus_by_step.items():
        ev = events.get(step) or {}
        if gpus > 0 and "model_loaded" in ev and "finished" in ev:
            total += gpus * max(0.0, ev["finished"] - ev["model_loaded"])
    return total


def node_cost(
    bill: cost.NodeBill,
    events: Mapping[str, Mapping[str, float]],
    gpus_by_step: Mapping[str, int],
    per_gpu_hour: float | None,
    *,
    train_s: float | None,
    train_tokens: float | None,
    wall_s: float | None = None,
) -> dict[str, float | None]:
    """The node-billed metrics of one run (see the module doc); costs None when the price is unknown."""
    node_s = bill.gpu_seconds
    usd = None if per_gpu_hour is None else node_s * per_gpu_hour / 3600.0
    compute = None if usd is None else min(usd, _compute_gpu_seconds(events, gpus_by_step) * per_gpu_hour / 3600.0)
    train_gpus = gpus_by_step.get(telemetry.TRAIN_STEP, 0)
    return {
        "node_gpu_hours": node_s / 3600.0,
        "node_tail_gpus": bill.tail_gpus,
        "cost_usd": usd,
        "cost_compute_usd": compute,
        "cost_overhead_usd": None if usd is None or compute is None else usd - compute,
        "usd_per_1m_tokens": None if usd is None or not train_tokens else usd / train_tokens * 1e6,
        "goodput": cost.goodput(train_gpu_s=None if train_s is None else train_s * train_gpus, billed_gpu_s=node_s,
                                held_gpus=max(gpus_by_step.values(), default=0), wall_s=wall_s),
    }
