"""One cluster run measured once it ended: its record read back, its metrics, cost, tags and trace.

:func:`measure` is the sequence; each job is its own function below: :func:`outcome` (status and
the one-line error), :func:`read_records` (the pods' phases logged to MLflow and the run's
records read back), :func:`run_gpu` (which GPU the run trained on and its price),
:func:`run_metrics` (derived timings, container and node cost, preemptions, the gang's waits),
:func:`run_tags` and :func:`close_run` (the summary logged, the run ended, the trace exported).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from typing import Any, Protocol

from components.record import cost, telemetry, tracking
from components.record.close import export_trace
from llmpack.backends import own_metrics
from llmpack.cluster.compare.pods import Plan, fused_tasks, gang_ready, kept_train_s, mine, pod_step_aliases, run_end
from llmpack.cluster.k8s.billing import (
    cluster_cost,
    node_cost,
    node_spans,
    pod_gpus_by_step,
    pod_spans,
    retried_pods,
)
from llmpack.gpu_catalogue import node_gpu, resolve_node_price
from llmpack.report.rebill import recorded_price

MODE = "cluster"


class Session(Protocol):
    """What measuring a run reads of :class:`llmpack.cluster.compare.session.Session` (which imports this module)."""

    run_group: str
    values: dict[str, Any]
    uri: str
    price_flag: Any
    price_file: str | None
    timeout_s: float
    scale_down_delay_s: float
    gang: tuple[int, int] | None

    def pipe_of(self, fuse: str) -> Any: ...
    def pod_uses(self, fuse: str = "none") -> list[cost.GpuUse]: ...
    def step_uses(self, fuse: str = "none") -> list[cost.GpuUse]: ...
    def pod_gpus(self, fuse: str) -> dict[str, int]: ...
    def api_client(self) -> Any: ...


def outcome(session: Session, orch: str, result: Mapping[str, Any]) -> tuple[str, str | None]:
    """The run's status and, when it did not succeed, one line saying why."""
    if result.get("status") == "succeeded":
        return "succeeded", None
    if result.get("status") == "timeout":
        return "failed", f"did not finish within {session.timeout_s:g} s (last state {result.get('state')})"
    return "failed", result.get("error") or f"{orch} run ended {result.get('state') or result.get('status')}"


def read_records(session: Session, ctx: telemetry.RunContext, summary: Mapping[str, Any],
                 k8s_records: list[Any], record: dict[str, Any]) -> tuple[Any, str | None, list[Any]]:
    """The pods' phases logged to the run's MLflow run, and all its records read back.

    Returns ``(client or None, run id or None, records)``; MLflow not answering is a warning, and
    the pods' own records are then all that is measured.
    """
    records = list(k8s_records)
    mc, run_id = None, summary.get("mlflow_run_id")
    try:
        mc = tracking.client(session.uri)
        if run_id is None:
            run_id = tracking.open_pipeline_run(mc, ctx)
        tracking.log_records(mc, run_id, k8s_records)
        records = tracking.records_from_run(mc.get_run(run_id).data.metrics, ctx)
    except Exception as exc:  # noqa: BLE001 - the pod events are still reported
        record["warnings"].append(f"MLflow at {session.uri}: {type(exc).__name__}: {exc}")
    return mc, run_id, records


def run_gpu(session: Session, pipe: Any, rows: list[dict[str, Any]],
            fused: Mapping[str, tuple[str, ...]]) -> tuple[Any, Any]:
    """The GPU the run trained on (its first training pod's node, else the pipeline's spec) and its price."""
    trains = {telemetry.TRAIN_STEP, "main", *(t for t, members in fused.items() if telemetry.TRAIN_STEP in members)}
    finetune_rows = [r for r in rows if r.get("step") in trains and r.get("role") != "driver"]
    finetune_rows = [r for r in finetune_rows if r.get("gang")] or finetune_rows  # the gang trains, not its launcher
    finetune_row = min(finetune_rows, key=lambda r: r.get("created") or 0.0) if finetune_rows else None
    spec_types = sorted({t.step.execution.resources.gpu_type for t in pipe.tasks.values()
                         if t.step.execution.resources.gpus > 0})
    gpu = node_gpu(finetune_row, spec_types[0] if spec_types else None)
    return gpu, resolve_node_price(gpu, flag=session.price_flag, price_file=session.price_file)


def kueue_waits(session: Session, rows: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, float | None]:
    """Quota wait and admission checks of the run's TrainJob from its Kueue Workload (llmpack.cluster.k8s.kueue)."""
    from llmpack.cluster.k8s import kueue

    gang_rows = sorted((r for r in rows if r.get("gang")), key=lambda r: r.get("created") or 0.0)
    if not gang_rows:
        return kueue.waits(None)
    last = gang_rows[-1]  # a retried launcher's newer TrainJob is the one that trained
    api_client = session.api_client()
    try:
        workload = kueue.find_workload(api_client, last.get("namespace") or "default", last["gang"])
        evicted = kueue.evicted(workload)
        if evicted is not None:  # the gang lost its quota: preempted as a whole, not failed
            record["kueue_eviction"] = {"trainjob": last["gang"], "reason": evicted[0], "at": evicted[1]}
            record["warnings"].append(f"Kueue evicted TrainJob {last['gang']} ({evicted[0]}): the gang was preempted")
        return kueue.waits(workload)
    except Exception as exc:  # noqa: BLE001 - the pods are still measured
        record["warnings"].append(f"Kueue Workload of TrainJob {last['gang']}: {type(exc).__name__}: {exc}")
        return kueue.waits(None)
    finally:
        api_client.close()


def preemptions(rows: list[dict[str, Any]], steps: Mapping[str, telemetry.StepTimes], uses: list[cost.GpuUse],
                fused: Mapping[str, tuple[str, ...]], price: Any,
                metrics: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Each attempt's outcome and each preemption's waste (:mod:`llmpack.cluster.k8s.preemption`). Goodput is
    then the kept training's (the container basis here; the node basis through :func:`kept_train_s`)."""
    from llmpack.cluster.k8s.preemption import preemption_metrics

    gpus = pod_gpus_by_step(uses, fused)
    gpus.setdefault("main", max(gpus.values(), default=0))  # the MLflow Job's one pod holds the largest step's
    out, attempts = preemption_metrics(rows, steps, gpus, None if price is None else price.per_gpu_hour,
                                       retry_gpu_hours=metrics.get("retry_gpu_hours"), aliases=pod_step_aliases(fused))
    train = steps.get(telemetry.TRAIN_STEP)
    last = train.metrics.get("train_s") if train else None
    if out["preemptions"] and out["kept_train_s"] and last and metrics.get("goodput") is not None:
        metrics["goodput"] = metrics["goodput"] * out["kept_train_s"] / last
    return out, attempts


def run_metrics(session: Session, plan: Plan, ctx: telemetry.RunContext, steps: Mapping[str, telemetry.StepTimes],
                mine_rows: list[dict[str, Any]], rows: list[dict[str, Any]], result: Mapping[str, Any],
                end: float | None, price: Any,
                record: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    """Every figure of the run: timings, container cost, the backend's own account, preemptions,
    the gang's waits and the node bill. Returns ``(metrics, attempts, billed by node)``."""
    orch = plan.orchestrator
    fused = fused_tasks(session.pipe_of(plan.fuse))
    uses = session.pod_uses(plan.fuse)
    step_uses = session.step_uses(plan.fuse)
    metrics = telemetry.derive_metrics(steps, submitted_at=ctx.submitted_at, finished_at=end)
    metrics.update(cluster_cost(steps, mine_rows, uses, orch, price, gang=session.gang, fused=fused,
                                wall_s=metrics.get("total_s")))
    metrics.update(own_metrics(orch, result))  # the orchestrator's own account (Argo's GPU-seconds)
    preemption, attempts = preemptions(mine_rows, steps, uses, fused, price, metrics)
    metrics.update(preemption)
    if session.gang is not None:
        ready = gang_ready(mine_rows)
        metrics["gang_ready_s"] = None if ready is None else ready - ctx.submitted_at
        metrics.update(kueue_waits(session, mine_rows, record))
    pods = pod_spans(rows, pod_gpus_by_step(uses, fused), session.gang)
    bill = cost.bill_nodes(node_spans(record.get("nodes", ()), pods), pods,
                           scale_down_delay_s=session.scale_down_delay_s).get(plan.pipeline_run)
    if bill is not None:
        train = steps.get(telemetry.TRAIN_STEP)
        metrics.update(node_cost(bill, {s: st.events for s, st in steps.items()}, {u.step: u.gpus for u in step_uses},
                                 None if price is None else price.per_gpu_hour,
                                 train_s=kept_train_s(metrics, train),
                                 train_tokens=train.metrics.get("train_tokens") if train else None,
                                 wall_s=metrics.get("total_s")))
    metrics = {k: telemetry.clean_number(v) for k, v in metrics.items()}
    return metrics, attempts, bill is not None


def run_tags(session: Session, plan: Plan, ctx: telemetry.RunContext, gpu: Any, price: Any, status: str,
             error: str | None, node_basis: bool, attempts: list[dict[str, Any]]) -> dict[str, str]:
    """The run's MLflow tags: its context, cost inputs, GPU, status, preempted attempts and error."""
    from components.fusion import FUSE_TAG

    tags = {
        **ctx.tags(),
        **cost.cost_tags(session.step_uses(plan.fuse), price),
        "llmpack.pipeline": session.pipe_of(plan.fuse).name,
        FUSE_TAG: plan.fuse,
        "llmpack.gpu_type": gpu.gpu_type or "unknown",
        "llmpack.gpu_type_source": gpu.source,
        "llmpack.status": status,
        "llmpack.cost_basis": "node" if node_basis else "container",
        "llmpack.scale_down_delay_s": f"{session.scale_down_delay_s:g}",
    }
    if gpu.gpu_product:
        tags["llmpack.gpu_product"] = gpu.gpu_product
    preempted = [f"{a['step']}{'/gang' if a.get('gang') else ''}#{a['attempt']}:{a['reason']}"
                 for a in attempts if a["outcome"] == "preempted"]
    if preempted:  # which attempts, and who took them (llmpack.cluster.k8s.preemption)
        tags["llmpack.preempted_attempts"] = ",".join(preempted)
    if gpu.instance_type:
        tags["llmpack.instance_type"] = gpu.instance_type
    if error:
        tags["llmpack.error"] = error[:4000]
    return tags


def close_run(session: Session, mc: Any, run_id: str, ctx: telemetry.RunContext, records: list[Any],
              metrics: dict[str, Any], tags: dict[str, str], status: str, end: float | None,
              record: dict[str, Any]) -> None:
    """The summary logged, the MLflow run ended, and the trace with the pods' phases exported."""
    try:
        tracking.log_summary(mc, run_id, metrics, tags, params=session.values)
        mc.set_terminated(run_id, "FINISHED" if status == "succeeded" else "FAILED",
                          end_time=int(end * 1000) if end else None)
    except Exception as exc:  # noqa: BLE001
        record["warnings"].append(f"MLflow summary logging failed ({type(exc).__name__})")
    # The pipeline's own closing task sent the trace of its steps; this one adds the pod phases.
    record["trace"] = export_trace(records, ctx=ctx, tags=tags, finished_at=end or ctx.submitted_at, out_dir=None,
                                   env={**os.environ, "MLFLOW_TRACKING_URI": session.uri}, mc=mc, run_id=run_id)


def measure(session: Session, plan: Plan, summary: Mapping[str, Any], result: Mapping[str, Any],
            rows: list[dict[str, Any]], record: dict[str, Any]) -> None:
    """Fill ``record`` (in place) with the ended run's status, metrics, tags, events and pods."""
    from llmpack.cluster.k8s.step_records import to_step_records

    orch = plan.orchestrator
    pipe = session.pipe_of(plan.fuse)
    fused = fused_tasks(pipe)
    ctx = telemetry.RunContext(run_group=session.run_group, pipeline_run=plan.pipeline_run, orchestrator=orch,
                               mode=MODE, submitted_at=float(summary["submitted_at"]))
    mine_rows = mine(rows, plan.pipeline_run)
    k8s_records = to_step_records(mine_rows, ctx, aliases=pod_step_aliases(fused))
    status, error = outcome(session, orch, result)
    failed = sorted((r for r in mine_rows if r.get("phase") == "Failed" and r.get("role") != "driver"),
                    key=lambda r: r.get("created") or 0.0)
    mc, run_id, records = read_records(session, ctx, summary, k8s_records, record)

    steps = telemetry.group_by_step(records)
    if mc is not None and mine_rows and not any("process_started" in st.events for st in steps.values()):
        record["warnings"].append(
            f"no step events in MLflow at {session.uri}: do the steps log to this tracking server "
            "(Secret llmpack-mlflow, key tracking-uri)? Only the pod phases are measured"
        )
    end = run_end(steps, mine_rows, result.get("finished_at"))
    gpu, price = run_gpu(session, pipe, mine_rows, fused)
    metrics, attempts, node_basis = run_metrics(session, plan, ctx, steps, mine_rows, rows, result, end, price, record)
    tags = run_tags(session, plan, ctx, gpu, price, status, error, node_basis, attempts)
    if mc is not None and run_id is not None:
        close_run(session, mc, run_id, ctx, records, metrics, tags, status, end, record)

    by_pod = {a["pod"]: a["outcome"] for a in attempts}
    uses = session.pod_uses(plan.fuse)
    record.update(
        status=status,
        error=error,
        failed_step=failed[0]["step"] if failed else None,
        finished_at=end,
        state=result.get("state"),
        metrics=metrics,
        tags=tags,
        events={step: dict(st.events) for step, st in steps.items() if st.events},
        retried_attempts=[{**a, "outcome": by_pod.get(a.get("pod"), "failed")}
                          for a in retried_pods(mine_rows, uses, orch, price, fused)],
        attempts=attempts,
        pods=mine_rows,
    )
    if run_id is not None:
        record["artifacts"]["mlflow_run_id"] = run_id
        record["artifacts"]["tracking_uri"] = session.uri


def bill_across_runs(session: Session, runs: list[dict[str, Any]]) -> None:
    """Bill each node once over the whole comparison, in place (and in MLflow).

    Each run was billed from its own watcher's view. A node that a later run reused within the
    scale-down delay (or that runs shared, with ``concurrency`` > 1) was then billed twice
    over the overlap; billed over every run's pods together it is billed once and shared.
    """
    gpus_by_step: dict[str, int] = {}
    for fuse in {str(r.get("fuse") or "none") for r in runs}:  # a fused pod's name is no authored step's
        gpus_by_step.update(session.pod_gpus(fuse))
    pods = pod_spans((p for r in runs for p in r.get("pods") or ()), gpus_by_step, session.gang)
    facts = [f for r in runs for f in r.get("nodes") or ()]
    bills = cost.bill_nodes(node_spans(facts, pods), pods, scale_down_delay_s=session.scale_down_delay_s)
    for run in runs:
        m, tags = run.get("metrics") or {}, run.get("tags") or {}
        bill = bills.get(run["pipeline_run"])
        if bill is None or tags.get("llmpack.cost_basis") != "node":
            continue
        if math.isclose(bill.gpu_seconds / 3600.0, m.get("node_gpu_hours") or 0.0, rel_tol=1e-12, abs_tol=1e-12):
            continue
        old_usd, old_per_1m = m.get("cost_usd"), m.get("usd_per_1m_tokens")
        tokens = old_usd / old_per_1m * 1e6 if old_usd and old_per_1m else None
        step_gpus = {u.step: u.gpus for u in session.step_uses(str(run.get("fuse") or "none"))}
        new = node_cost(bill, run.get("events") or {}, step_gpus, recorded_price(tags), train_s=kept_train_s(m, None),
                        train_tokens=tokens, wall_s=m.get("total_s"))
        new = {k: telemetry.clean_number(v) for k, v in new.items()}
        m.update({k: v for k, v in new.items() if v is not None or k in m})
        run_id = (run.get("artifacts") or {}).get("mlflow_run_id")
        if run_id is None:
            continue
        try:
            from mlflow.entities import Metric

            stamp = int(time.time() * 1000)  # later than the first summary (logged at 0): the latest value
            tracking.client(session.uri).log_batch(
                run_id, metrics=[Metric(k, float(v), stamp, 0) for k, v in new.items() if v is not None])
        except Exception as exc:  # noqa: BLE001 - the result still carries the figures
            run.setdefault("warnings", []).append(f"MLflow: node cost not updated ({type(exc).__name__})")
