"""The cluster session: one run of a ``compare --cluster`` submitted, watched, measured and recorded.

:class:`Session` holds what every run of a comparison shares (parameters, each path's options,
Kubernetes access, MLflow, prices); :meth:`Session.run` takes one :class:`Plan` from submission
to its record: a pod watcher started before (or, for a path whose pods carry only the
orchestrator's run id, right after) the submission, live progress from the pods, the pods'
phases uploaded to MLflow, the metrics derived and the run billed by container and by node.
:func:`bill_across_runs` then bills each node once over the whole comparison, and
:func:`preflight` checks every path and the pod watcher's access before anything is submitted.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from components.errors import InputError
from components.record import cost, telemetry, tracking
from components.record.close import export_trace
from llmpack.backends import cluster_path, cluster_submitter
from llmpack.gpu_catalogue import node_gpu, resolve_node_price
from llmpack.k8s.billing import (
    cluster_cost,
    node_cost,
    node_spans,
    pod_gpus_by_step,
    pod_spans,
    recorded_price,
    retried_pods,
)

MODE = "cluster"

# (label, message, elapsed seconds since this run started)
Progress = Callable[[str, str, float], None]


def fused_tasks(pipe: Any) -> dict[str, tuple[str, ...]]:
    """Each fused task of a compiled pipeline (``llmpack compile --fuse``) -> the authored steps its
    one pod runs, in order: ``{"finetune-evaluate": ("finetune", "evaluate")}``."""
    from components.fusion import FusedStep

    return {t.name: tuple(m.task for m in t.step.members) for t in pipe.tasks.values() if isinstance(t.step, FusedStep)}


def pod_step_aliases(fused: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """Whose spin-up a pod's phases are (:func:`~llmpack.k8s.podphases.to_step_records`): the MLflow
    Job's ``main`` pod and a fused pod that trains count as ``finetune``'s, the way one pod that
    runs the training step starts it; a fused pod that does not train, as its first member's."""
    from llmpack.k8s.podphases import DEFAULT_STEP_ALIASES

    out = dict(DEFAULT_STEP_ALIASES)
    for task, members in fused.items():
        out[task] = telemetry.TRAIN_STEP if telemetry.TRAIN_STEP in members else members[0]
    return out


def gang_ready(rows: Iterable[Mapping[str, Any]]) -> float | None:
    """When the run's (last) TrainJob gang was all up: its last node pod's container start.

    None when the run has no gang, or a node pod of it never started. Several gangs (a retried
    launcher made another TrainJob): the last-created one's.
    """
    gangs: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("gang") and row.get("role") != "driver":
            gangs.setdefault(row["gang"], []).append(row)
    if not gangs:
        return None
    last = max(gangs.values(), key=lambda g: min((r.get("created") or 0.0) for r in g))
    starts = [r.get("container_started") for r in last]
    return None if any(s is None for s in starts) else max(starts)


def run_end(steps: Mapping[str, telemetry.StepTimes], rows: Iterable[Mapping[str, Any]], fallback: float | None) -> float | None:
    """The last timestamped moment of the run: a pod's container finish or a step's ``finished``."""
    ends = [s.events["finished"] for s in steps.values() if "finished" in s.events]
    ends += [r["finished"] for r in rows if r.get("finished") is not None]
    return max(ends) if ends else fallback


def _mine(rows: Iterable[Mapping[str, Any]], pipeline_run: str) -> list[dict[str, Any]]:
    return [dict(r) for r in rows if r.get("pipeline_run") == pipeline_run]


def describe(rows: list[dict[str, Any]]) -> str:
    """One progress line from a run's pods: the newest step pod's state and tasks done."""
    pods = [r for r in rows if r.get("role") != "driver"]
    if not pods:
        return "waiting for pods"
    done = {r["step"] for r in pods if r.get("phase") == "Succeeded"}
    latest = max(pods, key=lambda r: r.get("created") or 0.0)
    step = latest.get("step") or latest["pod"]
    if latest.get("phase") in ("Succeeded", "Failed"):
        state = "done" if latest["phase"] == "Succeeded" else "failed"
    elif latest.get("container_started") is not None:
        state = "running"
    elif latest.get("scheduled") is not None:
        state = "starting (image pull, init)"
    else:
        state = "queued (waiting for a node)"
    from llmpack.ui.progress import tasks_done

    return f"{step} · {state} · {tasks_done(len(done))}"  # pipeline tasks: finetune's optimizer steps are 23/60


@dataclass
class Plan:
    """One run of the comparison: its path, label, pipeline-run id and packaging."""

    orchestrator: str
    label: str
    pipeline_run: str
    fuse: str = "none"  # the packaging (components.fusion) this run submits


@dataclass
class Session:
    """What every run of one comparison shares; :meth:`run` runs one :class:`Plan`."""

    run_group: str
    values: dict[str, Any]
    conf: dict[str, dict[str, Any]]
    k8s: dict[str, Any]
    uri: str
    price_flag: Any
    price_file: str | None
    timeout_s: float
    poll_s: float
    progress: Progress | None
    pipe: Any  # the pipeline as authored (sized by --gpus/--nodes), unfused
    scale_down_delay_s: float = cost.DEFAULT_SCALE_DOWN_DELAY_S
    gang: tuple[int, int] | None = None  # finetune as a TrainJob: (nodes, GPUs per node)
    pipes: dict[str, Any] = field(default_factory=dict)  # fuse mode -> that variant's compiled pipeline
    artifacts: dict[str, dict[str, str]] = field(default_factory=dict)  # fuse mode -> orchestrator -> compiled file
    submit_lock: threading.Lock = field(default_factory=threading.Lock)
    opencost: str | None = None  # --opencost: OpenCost's API, read once all runs ended (llmpack.k8s.reconcile)
    preempt: Any = None  # --preempt: a llmpack.k8s.preemption.PreemptSpec, evicted by llmpack.k8s.preempt_inject

    def pipe_of(self, fuse: str) -> Any:
        return self.pipes.get(fuse, self.pipe)

    def pod_uses(self, fuse: str = "none") -> list[cost.GpuUse]:
        """What each authored step's pod holds (a gang's launcher: no GPU; a fused pod's members: its GPUs)."""
        from components.record.close import gpu_uses

        return gpu_uses(self.pipe_of(fuse))

    def step_uses(self, fuse: str = "none") -> list[cost.GpuUse]:
        """What each step holds: finetune as a gang holds nodes x GPUs per node."""
        from dataclasses import replace

        if self.gang is None:
            return self.pod_uses(fuse)
        total = self.gang[0] * self.gang[1]
        return [replace(u, gpus=total) if u.step == telemetry.TRAIN_STEP else u for u in self.pod_uses(fuse)]

    def pod_gpus(self, fuse: str) -> dict[str, int]:
        """GPUs by a pod's ``llmpack.io/step`` in this variant (:func:`pod_gpus_by_step`)."""
        return pod_gpus_by_step(self.pod_uses(fuse), fused_tasks(self.pipe_of(fuse)))

    # ------------------------------------------------------------------ helpers

    def notify(self, label: str, message: str, t0: float) -> None:
        if self.progress is not None:
            with contextlib.suppress(Exception):  # a display error must not lose a run
                self.progress(label, message, time.monotonic() - t0)

    def pod_namespace(self, orch: str) -> str:
        return cluster_path(orch).pod_namespace(self.conf[orch])

    def api_client(self) -> Any:
        from llmpack.k8s.api import build_api_client

        return build_api_client(**self.k8s)

    def start_watcher(self, namespace: str, run_ids: Mapping[str, str] | None = None) -> Any:
        from llmpack.k8s.watcher import PodWatcher

        api_client = self.api_client()
        try:
            watcher = PodWatcher(api_client, namespace, self.run_group, run_ids=dict(run_ids or {}),
                                 window_s=max(1, int(min(60.0, self.timeout_s))))
            return watcher.start(timeout_s=self.timeout_s + 120.0)
        except BaseException:
            api_client.close()
            raise

    # ------------------------------------------------------------------ one run

    def secrets(self) -> tuple[str, ...]:
        values = [c.get("token") for c in self.conf.values()] + [self.k8s.get("token")]
        return tuple(str(v) for v in values if v)

    def run(self, plan: Plan) -> dict[str, Any]:
        """One run, start to end; whatever goes wrong, a record (failed, with one line) comes back."""
        from components.servers.remote import one_line

        t0 = time.monotonic()
        try:
            return self._run(plan, t0)
        except Exception as exc:  # noqa: BLE001 - one path's surprise must not lose the others
            error = one_line(f"{type(exc).__name__}: {exc}", self.secrets())
            self.notify(plan.label, f"failed: {error}", t0)
            return {**self._blank(plan), "error": error,
                    "tags": {**self._blank(plan)["tags"], "llmpack.status": "failed", "llmpack.error": error}}

    def _blank(self, plan: Plan) -> dict[str, Any]:
        from components.fusion import FUSE_TAG

        return {
            "run_group": self.run_group,
            "pipeline_run": plan.pipeline_run,
            "orchestrator": plan.orchestrator,
            "fuse": plan.fuse,
            "mode": MODE,
            "status": "failed",
            "error": None,
            "failed_step": None,
            "submitted_at": None,
            "finished_at": None,
            "state": None,
            "metrics": {},
            "tags": {"llmpack.run_group": self.run_group, "llmpack.pipeline_run": plan.pipeline_run,
                     "llmpack.orchestrator": plan.orchestrator, "llmpack.mode": MODE, FUSE_TAG: plan.fuse},
            "events": {},
            "artifacts": {},
            "pods": [],
            "warnings": [],
        }

    def _run(self, plan: Plan, t0: float) -> dict[str, Any]:
        live: list[Any] = []  # watchers started and not finished yet: finished whatever happens
        try:
            return self._run_watched(plan, t0, live)
        finally:
            for watcher in live:
                with contextlib.suppress(Exception):
                    watcher.finish(5.0)
                with contextlib.suppress(Exception):
                    watcher.api_client.close()

    def _run_watched(self, plan: Plan, t0: float, live: list[Any]) -> dict[str, Any]:
        from llmpack.run import submit

        orch = plan.orchestrator
        path = cluster_path(orch)
        conf = self.conf[orch]
        record = self._blank(plan)
        watcher = None
        self.notify(plan.label, "submitting", t0)
        if path.watch_before_submit:  # its pods carry the run group: watch before they exist
            watcher = self._safe_start(self.pod_namespace(orch), None, record, live)
        try:
            kwargs = {k: v for k, v in conf.items() if k not in path.own_options}
            if orch in self.artifacts.get(plan.fuse, {}):  # this variant's compiled file
                kwargs[path.artifact_option] = self.artifacts[plan.fuse][orch]
            with self.submit_lock:  # client libraries swap sys.stdout while they construct
                summary = submit.submit(orch, params=self.values, run_group=self.run_group,
                                        pipeline_run=plan.pipeline_run, tracking_uri=self.uri,
                                        price_per_gpu_hour=self.price_flag, price_file=self.price_file, **kwargs)
        except InputError as exc:
            record["error"] = str(exc)
            record["tags"].update({"llmpack.status": "failed", "llmpack.error": str(exc)})
            self._stop(watcher, record, live)
            self.notify(plan.label, f"failed: {exc}", t0)
            return record

        record["submitted_at"] = summary["submitted_at"]
        record["warnings"] += list(summary.get("warnings") or ())
        record["artifacts"] = {k: summary[k] for k in ("server_id", "url", "namespace", "mlflow_run_id", "tracking_uri")
                               if summary.get(k) is not None}
        if not path.watch_before_submit:  # its pods carry only its run id, known now (the first list finds what exists)
            watcher = self._safe_start(self.pod_namespace(orch), {summary["run_id"]: plan.pipeline_run}, record, live)
        elif summary.get("namespace") and watcher is not None and summary["namespace"] != watcher.namespace:
            self._stop(watcher, record, live)
            watcher = self._safe_start(summary["namespace"], None, record, live)
        self.notify(plan.label, "submitted", t0)

        stop_progress = threading.Event()
        ticker = None
        if self.progress is not None and watcher is not None:
            ticker = threading.Thread(target=self._tick, args=(plan, watcher, t0, stop_progress), daemon=True)
            ticker.start()
        wait_kwargs = {k: conf[k] for k in path.wait_options if conf.get(k) is not None}
        injector = self._start_injector(plan, watcher)
        try:
            result = submit.wait_for_completion(summary, timeout_s=self.timeout_s, poll_s=self.poll_s, **wait_kwargs)
        except InputError as exc:
            result = {"status": "error", "state": "unknown", "error": str(exc)}
        finally:
            stop_progress.set()
            if ticker is not None:
                ticker.join(5.0)
            if injector is not None:
                record["evictions"] = injector.stop()
                record["warnings"] += injector.warnings
        rows = self._stop(watcher, record, live)
        self._measure(plan, summary, result, rows, record)
        mark = "succeeded" if record["status"] == "succeeded" else f"failed: {record['error']}"
        self.notify(plan.label, mark, t0)
        return record

    def _start_injector(self, plan: Plan, watcher: Any) -> Any:
        """``--preempt``: evict this run's pod of the step when due (:mod:`llmpack.k8s.preempt_inject`)."""
        if self.preempt is None or watcher is None:
            return None
        from llmpack.k8s.preempt_inject import PreemptInjector

        aliases = pod_step_aliases(fused_tasks(self.pipe_of(plan.fuse)))
        steps = {self.preempt.step, *(pod for pod, step in aliases.items() if step == self.preempt.step)}
        gang = self.gang is not None and self.preempt.step == telemetry.TRAIN_STEP  # a TrainJob's node pod, not its launcher
        return PreemptInjector(watcher.api_client, self.preempt, lambda: _mine(watcher.rows(), plan.pipeline_run),
                               pod_steps=steps, gang=gang).start()

    def _safe_start(self, namespace: str, run_ids: Mapping[str, str] | None, record: dict[str, Any],
                    live: list[Any]) -> Any:
        """A started watcher, or None with a warning (the run is still measured from its own events)."""
        try:
            watcher = self.start_watcher(namespace, run_ids)
        except InputError as exc:
            record["warnings"].append(f"pod watcher: {exc}")
            return None
        live.append(watcher)
        return watcher

    def _stop(self, watcher: Any, record: dict[str, Any], live: list[Any]) -> list[dict[str, Any]]:
        if watcher is None:
            return []
        with contextlib.suppress(ValueError):
            live.remove(watcher)
        try:
            rows = watcher.finish()
        except Exception as exc:  # noqa: BLE001 - the run's own events still count
            record["warnings"].append(f"pod watcher: {exc}")
            return []
        finally:
            with contextlib.suppress(Exception):
                watcher.api_client.close()
        record["warnings"] += [f"pod watcher: {w}" for w in watcher.warnings]
        record.setdefault("nodes", []).extend(watcher.nodes())
        return rows

    def _tick(self, plan: Plan, watcher: Any, t0: float, stop: threading.Event) -> None:
        while not stop.wait(min(1.0, max(0.2, self.poll_s))):
            try:
                text = describe(_mine(watcher.rows(), plan.pipeline_run))
            except Exception:  # noqa: BLE001 - progress is best effort
                continue
            self.notify(plan.label, text, t0)

    def _kueue_waits(self, rows: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, float | None]:
        """Quota wait and admission checks of the run's TrainJob from its Kueue Workload (llmpack.k8s.kueue)."""
        from llmpack.k8s import kueue

        gang_rows = sorted((r for r in rows if r.get("gang")), key=lambda r: r.get("created") or 0.0)
        if not gang_rows:
            return kueue.waits(None)
        last = gang_rows[-1]  # a retried launcher's newer TrainJob is the one that trained
        api_client = self.api_client()
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

    def _preemptions(self, rows: list[dict[str, Any]], steps: Mapping[str, telemetry.StepTimes], uses: list[cost.GpuUse],
                     fused: Mapping[str, tuple[str, ...]], price: Any,
                     metrics: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Each attempt's outcome and each preemption's waste (:mod:`llmpack.k8s.preemption`). Goodput is
        then the kept training's (the container basis here; the node basis through :func:`kept_train_s`)."""
        from llmpack.k8s.preemption import preemption_metrics

        gpus = pod_gpus_by_step(uses, fused)
        gpus.setdefault("main", max(gpus.values(), default=0))  # the MLflow Job's one pod holds the largest step's
        out, attempts = preemption_metrics(rows, steps, gpus, None if price is None else price.per_gpu_hour,
                                           retry_gpu_hours=metrics.get("retry_gpu_hours"), aliases=pod_step_aliases(fused))
        train = steps.get(telemetry.TRAIN_STEP)
        last = train.metrics.get("train_s") if train else None
        if out["preemptions"] and out["kept_train_s"] and last and metrics.get("goodput") is not None:
            metrics["goodput"] = metrics["goodput"] * out["kept_train_s"] / last
        return out, attempts

    def _measure(self, plan: Plan, summary: Mapping[str, Any], result: Mapping[str, Any],
                 rows: list[dict[str, Any]], record: dict[str, Any]) -> None:
        from components.fusion import FUSE_TAG
        from llmpack.k8s.podphases import to_step_records

        orch = plan.orchestrator
        pipe = self.pipe_of(plan.fuse)
        fused = fused_tasks(pipe)
        ctx = telemetry.RunContext(run_group=self.run_group, pipeline_run=plan.pipeline_run, orchestrator=orch,
                                   mode=MODE, submitted_at=float(summary["submitted_at"]))
        mine = _mine(rows, plan.pipeline_run)
        k8s_records = to_step_records(mine, ctx, aliases=pod_step_aliases(fused))
        status = "succeeded" if result.get("status") == "succeeded" else "failed"
        error = None
        if status != "succeeded":
            if result.get("status") == "timeout":
                error = f"did not finish within {self.timeout_s:g} s (last state {result.get('state')})"
            else:
                error = result.get("error") or f"{orch} run ended {result.get('state') or result.get('status')}"
        failed = sorted((r for r in mine if r.get("phase") == "Failed" and r.get("role") != "driver"),
                        key=lambda r: r.get("created") or 0.0)

        records = list(k8s_records)
        mc, run_id = None, summary.get("mlflow_run_id")
        try:
            mc = tracking.client(self.uri)
            if run_id is None:
                run_id = tracking.open_pipeline_run(mc, ctx)
            tracking.log_records(mc, run_id, k8s_records)
            records = tracking.records_from_run(mc.get_run(run_id).data.metrics, ctx)
        except Exception as exc:  # noqa: BLE001 - the pod events are still reported
            record["warnings"].append(f"MLflow at {self.uri}: {type(exc).__name__}: {exc}")

        steps = telemetry.group_by_step(records)
        if mc is not None and mine and not any("process_started" in st.events for st in steps.values()):
            record["warnings"].append(
                f"no step events in MLflow at {self.uri}: do the steps log to this tracking server "
                "(Secret llmpack-mlflow, key tracking-uri)? Only the pod phases are measured"
            )
        end = run_end(steps, mine, result.get("finished_at"))
        uses = self.pod_uses(plan.fuse)
        step_uses = self.step_uses(plan.fuse)
        trains = {telemetry.TRAIN_STEP, "main", *(t for t, members in fused.items() if telemetry.TRAIN_STEP in members)}
        finetune_rows = [r for r in mine if r.get("step") in trains and r.get("role") != "driver"]
        finetune_rows = [r for r in finetune_rows if r.get("gang")] or finetune_rows  # the gang trains, not its launcher
        finetune_row = min(finetune_rows, key=lambda r: r.get("created") or 0.0) if finetune_rows else None
        spec_types = sorted({t.step.execution.resources.gpu_type for t in pipe.tasks.values()
                             if t.step.execution.resources.gpus > 0})
        gpu = node_gpu(finetune_row, spec_types[0] if spec_types else None)
        price = resolve_node_price(gpu, flag=self.price_flag, price_file=self.price_file)

        metrics = telemetry.derive_metrics(steps, submitted_at=ctx.submitted_at, finished_at=end)
        metrics.update(cluster_cost(steps, mine, uses, orch, price, gang=self.gang, fused=fused,
                                    wall_s=metrics.get("total_s")))
        metrics.update(cluster_submitter(orch).own_metrics(result))  # the orchestrator's own account (Argo's GPU-seconds)
        preemption, attempts = self._preemptions(mine, steps, uses, fused, price, metrics)
        metrics.update(preemption)
        if self.gang is not None:
            ready = gang_ready(mine)
            metrics["gang_ready_s"] = None if ready is None else ready - ctx.submitted_at
            metrics.update(self._kueue_waits(mine, record))
        pods = pod_spans(rows, pod_gpus_by_step(uses, fused), self.gang)
        bill = cost.bill_nodes(node_spans(record.get("nodes", ()), pods), pods,
                               scale_down_delay_s=self.scale_down_delay_s).get(plan.pipeline_run)
        if bill is not None:
            train = steps.get(telemetry.TRAIN_STEP)
            metrics.update(node_cost(bill, {s: st.events for s, st in steps.items()}, {u.step: u.gpus for u in step_uses},
                                     None if price is None else price.per_gpu_hour,
                                     train_s=kept_train_s(metrics, train),
                                     train_tokens=train.metrics.get("train_tokens") if train else None,
                                     wall_s=metrics.get("total_s")))
        metrics = {k: telemetry.clean_number(v) for k, v in metrics.items()}
        outcome = {a["pod"]: a["outcome"] for a in attempts}
        tags = {
            **ctx.tags(),
            **cost.cost_tags(step_uses, price),
            "llmpack.pipeline": pipe.name,
            FUSE_TAG: plan.fuse,
            "llmpack.gpu_type": gpu.gpu_type or "unknown",
            "llmpack.gpu_type_source": gpu.source,
            "llmpack.status": status,
            "llmpack.cost_basis": "node" if bill is not None else "container",
            "llmpack.scale_down_delay_s": f"{self.scale_down_delay_s:g}",
        }
        if gpu.gpu_product:
            tags["llmpack.gpu_product"] = gpu.gpu_product
        preempted = [f"{a['step']}{'/gang' if a.get('gang') else ''}#{a['attempt']}:{a['reason']}"
                     for a in attempts if a["outcome"] == "preempted"]
        if preempted:  # which attempts, and who took them (llmpack.k8s.preemption)
            tags["llmpack.preempted_attempts"] = ",".join(preempted)
        if gpu.instance_type:
            tags["llmpack.instance_type"] = gpu.instance_type
        if error:
            tags["llmpack.error"] = error[:4000]
        if mc is not None and run_id is not None:
            try:
                tracking.log_summary(mc, run_id, metrics, tags, params=self.values)
                mc.set_terminated(run_id, "FINISHED" if status == "succeeded" else "FAILED",
                                  end_time=int(end * 1000) if end else None)
            except Exception as exc:  # noqa: BLE001
                record["warnings"].append(f"MLflow summary logging failed ({type(exc).__name__})")
            # The pipeline's own closing task sent the trace of its steps; this one adds the pod phases.
            record["trace"] = export_trace(records, ctx=ctx, tags=tags, finished_at=end or ctx.submitted_at, out_dir=None,
                                           env={**os.environ, "MLFLOW_TRACKING_URI": self.uri}, mc=mc, run_id=run_id)

        record.update(
            status=status,
            error=error,
            failed_step=failed[0]["step"] if failed else None,
            finished_at=end,
            state=result.get("state"),
            metrics=metrics,
            tags=tags,
            events={step: dict(st.events) for step, st in steps.items() if st.events},
            retried_attempts=[{**a, "outcome": outcome.get(a.get("pod"), "failed")}
                              for a in retried_pods(mine, uses, orch, price, fused)],
            attempts=attempts,
            pods=mine,
        )
        if run_id is not None:
            record["artifacts"]["mlflow_run_id"] = run_id
            record["artifacts"]["tracking_uri"] = self.uri


def kept_train_s(metrics: Mapping[str, Any], train: telemetry.StepTimes | None) -> float | None:
    """The training a run kept (after a preemption: up to the checkpoint, plus the retry's), else its ``train_s``."""
    if metrics.get("preemptions") and metrics.get("kept_train_s") is not None:
        return metrics["kept_train_s"]
    return train.metrics.get("train_s") if train is not None else metrics.get("train_s")


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


def _check_pod_access(api_client: Any, namespace: str) -> None:
    """The watcher's access, before anything is submitted: the namespace exists, pods can be listed."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from llmpack.k8s.api import api_error

    core = client.CoreV1Api(api_client)
    try:
        core.read_namespace(namespace, _request_timeout=15)
    except ApiException as exc:
        if exc.status == 404:
            raise InputError(f"namespace {namespace!r} not found on the Kubernetes API at "
                             f"{api_client.configuration.host}") from None
        if exc.status != 403:  # namespaced credentials often cannot read Namespace objects
            raise api_error(exc, api_client, f"read namespace {namespace!r}") from None
    except Exception as exc:  # noqa: BLE001 - unreachable: one line
        raise api_error(exc, api_client, f"read namespace {namespace!r}") from None
    try:
        core.list_namespaced_pod(namespace, limit=1, _request_timeout=15)
    except Exception as exc:  # noqa: BLE001
        raise api_error(exc, api_client, f"list pods in namespace {namespace!r}") from None


def preflight(session: Session, backends: list[str]) -> None:
    for orch in backends:
        cluster_submitter(orch).check_connection(session.conf[orch])
    api_client = session.api_client()
    try:
        for namespace in dict.fromkeys(session.pod_namespace(o) for o in backends):
            _check_pod_access(api_client, namespace)
    finally:
        api_client.close()
