"""The pipeline run closes its own record: the summarizing task every compiled path ends with.

    python -m components.record --status=Succeeded --uses='[...]' --run-id=ID --created-at=TS --param=...

Each path runs it once, whether the steps succeeded or failed (each backend's native record hook).
It reads the run's step records, derives every metric and cost tag with :func:`summarize` (the one
function ``llmpack`` itself uses), logs them on the pipeline's record and ends it FINISHED, FAILED
or KILLED. The submit time's source, the run's identity, the end of the run, every attempt
billed, and who writes: docs/internals/record-internals.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from components import settings
from components.errors import InputError
from components.params import CLOSE_TASK as CLOSE_TASK  # re-exported: every backend names the task by it
from components.podspec import label_tags
from components.process import startup
from components.record import cost, gpu_metrics, telemetry, uniform
from components.record.telemetry import Record, RunContext

RECORD_FILE = "llmpack-record.json"
MODULE = "components.record"

SubmitTimeSource = Literal["client", "orchestrator", "first_pod", "none"]
RecordStatus = Literal["FINISHED", "FAILED", "KILLED"]

# Every spelling of a run's end state the orchestrators hand to their exit handlers.
_STATUS: dict[str, RecordStatus] = {
    "succeeded": "FINISHED", "success": "FINISHED", "finished": "FINISHED",
    "failed": "FAILED", "failure": "FAILED", "error": "FAILED",
    "canceled": "KILLED", "cancelled": "KILLED", "killed": "KILLED", "terminated": "KILLED",
}
_EARLIEST = ("pod_created", "pod_scheduled", "container_started", "process_started")


def record_status(orchestrator_status: str) -> RecordStatus:
    """MLflow's run status for the orchestrator's final state (unknown states count as FAILED)."""
    return _STATUS.get(orchestrator_status.strip().lower(), "FAILED")


def parse_timestamp(text: str | float | None) -> float | None:
    """Epoch seconds from an RFC 3339 time or a number; None for empty or unresolved placeholders."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text) if text > 0 else None
    text = text.strip()
    if not text or "{{" in text:
        return None
    try:
        value = float(text)
        return value if value > 0 else None
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo else None


def resolve_submit_time(
    submitted_at: float, orchestrator_created_at: str | float | None, records: Iterable[Record]
) -> tuple[float, SubmitTimeSource]:
    """The run's submit time and where it came from (see the module docstring)."""
    if submitted_at > 0:
        return submitted_at, "client"
    created = parse_timestamp(orchestrator_created_at)
    if created is not None:
        return created, "orchestrator"
    firsts = [r.value for r in records if r.kind == "event" and r.name in _EARLIEST]
    if firsts:
        return min(firsts), "first_pod"
    return 0.0, "none"


def gpu_uses(pipe: Any) -> list[cost.GpuUse]:
    """What each authored step of a pipeline object holds, for cost.

    A fused task's members each hold the fused pod's resources (:mod:`components.fusion`): their
    times follow each other with no gap, so their sum is the pod's time, and a fused-all pod bills
    its GPU for data preparation and registration too, as it holds it.
    """
    from components.fusion import FusedStep

    uses = []
    for t in pipe.task_order():
        res = t.step.execution.resources
        names = [m.task for m in t.step.members] if isinstance(t.step, FusedStep) else [t.name]
        uses += [cost.GpuUse(step=n, gpus=res.total_gpus, cpu=res.cpu, gpu_type=res.gpu_type) for n in names]
    return uses


def billed_uses(pipe: Any) -> list[cost.GpuUse]:
    """What each authored step of a pipeline object is billed for: :func:`gpu_uses`, a gang's GPUs included.

    A step compiled as a TrainJob gang (``llmpack compile --nodes N --gpus G``) runs in a launcher
    pod that holds no GPU; the step holds the TrainJob's ``N x G`` GPUs (and ``N x`` the node
    pod's CPUs), of the gang's GPU type, for as long as it runs. This is what every compiled
    summarizing task takes (``--uses``); :func:`gpu_uses` stays what each *pod* holds, which the
    pod billing of a cluster run needs (the gang's node pods bill their own GPUs there).
    """
    from components.trainjob import gang

    gangs = {name: found for name, t in pipe.tasks.items() if (found := gang.task_gang(pipe, t)) is not None}
    uses = []
    for use in gpu_uses(pipe):
        if use.step in gangs:
            nodes, spec = gangs[use.step]
            use = cost.GpuUse(step=use.step, gpus=nodes * spec.gpus_per_node, cpu=nodes * spec.cpu,
                              gpu_type=spec.gpu_type)
        uses.append(use)
    return uses


def uses_json(uses: Sequence[cost.GpuUse]) -> str:
    """The GPU uses as the compact JSON the summarizing task takes (``--uses``)."""
    return json.dumps([asdict(u) for u in uses if u.gpus > 0], separators=(",", ":"), sort_keys=True)


def parse_uses(text: str) -> list[cost.GpuUse]:
    try:
        return [cost.GpuUse(**item) for item in json.loads(text or "[]")]
    except (ValueError, TypeError) as exc:
        raise InputError(f"--uses: not a JSON list of GPU uses ({exc})") from None


def price_for(uses: Sequence[cost.GpuUse], env: Mapping[str, str] | None = None) -> cost.Price | None:
    """The price of the pipeline's one GPU type (flag-less: env var, price file, shipped table)."""
    types = sorted({u.gpu_type for u in uses if u.gpus > 0 and u.gpu_type})
    return cost.resolve_price(types[0], env=dict(os.environ if env is None else env)) if len(types) == 1 else None


def summarize(
    *,
    ctx: RunContext,
    records: list[Record],
    uses: list[cost.GpuUse],
    price: cost.Price | None,
    finished_at: float,
    untrained: bool = False,
) -> tuple[dict[str, float | None], dict[str, str]]:
    """The derived metrics and tags of one pipeline run from its step records. ``untrained``: the run is of a
    pipeline without finetune (it succeeded with no finetune record), whose spin-up is its first step's."""
    steps = telemetry.group_by_step(records)
    metrics = telemetry.derive_metrics(steps, submitted_at=ctx.submitted_at, finished_at=finished_at)
    if untrained and telemetry.TRAIN_STEP not in steps:  # spin-up: its first step's start (its first pod)
        starts = [s.first_process_start for s in steps.values() if s.first_process_start is not None]
        metrics["spinup_s"] = telemetry.since_submit(min(starts), ctx.submitted_at) if starts else None
    if ctx.submitted_at <= 0:  # nothing to measure from: better no number than one from 1970
        for key in ("spinup_s", "time_to_first_step_s", "total_s", "pipeline_overhead_s"):
            metrics[key] = None
    metrics.update(cost.cost_metrics(steps, uses, price, wall_s=metrics.get("total_s")))
    metrics = {k: telemetry.clean_number(v) for k, v in metrics.items()}
    tags = {**ctx.tags(), **cost.cost_tags(uses, price)}
    return metrics, tags


def retried_attempts(records: Iterable[Record], uses: list[cost.GpuUse],
                     price: cost.Price | None) -> list[dict[str, Any]]:
    """The run's retried attempts (every attempt of a step but its last) with their GPU time and cost,
    as JSON-ready dicts: ``summary["retried_attempts"]``, what the report lists."""
    steps = telemetry.group_by_step(records)
    return [{k: telemetry.clean_number(v) if isinstance(v, float) else v for k, v in asdict(a).items()}
            for a in cost.retried_attempts(steps, uses, price)]


def identity(values: Mapping[str, Any], orchestrator_run_id: str) -> tuple[str, str]:
    """``(run_group, pipeline_run)``: empty ones filled from the orchestrator's own run id."""
    pipeline_run = str(values.get("pipeline_run") or "") or orchestrator_run_id
    return str(values.get("run_group") or "") or pipeline_run, pipeline_run


def close(
    *,
    values: Mapping[str, Any],
    status: str,
    uses: list[cost.GpuUse],
    orchestrator_run_id: str = "",
    orchestrator_created_at: str | float | None = None,
    finished_at: float | None = None,
    records_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    fuse: str = "none",
) -> dict[str, Any]:
    """Derive the run's metrics and tags, log them on its record and end it; returns the summary.

    Args:
        values: the telemetry parameters (submitted_at, run_group, pipeline_run, orchestrator, mode).
        status: the orchestrator's final state (``Succeeded``, ``FAILED``, ``CANCELED``...).
        uses: the GPU each task holds (from the compiled pipeline).
        orchestrator_run_id: the orchestrator's own run id, for an empty ``pipeline_run``.
        orchestrator_created_at: when the orchestrator created the run (RFC 3339 or epoch).
        finished_at: the run's end; default: now (the command line passes when its process started).
        records_dir: a directory whose ``llmpack-events.jsonl`` files are the run's step records.
        env: the environment (price, tracking URI, client mode); default ``os.environ``.
        fuse: how the compiled pipeline's steps are packaged (``Pipeline.fuse``): tag ``llmpack.fuse`` when fused.
    """
    from components.fusion import FUSE_TAG, check_mode

    check_mode(fuse)
    env = dict(os.environ if env is None else env)
    finished_at = time.time() if finished_at is None else finished_at
    run_group, pipeline_run = identity(values, orchestrator_run_id)
    if not pipeline_run:
        raise InputError("pipeline_run: empty, and the orchestrator gave no run id to use instead")
    orchestrator = str(values.get("orchestrator") or "")
    base = RunContext(run_group=run_group, pipeline_run=pipeline_run, orchestrator=orchestrator,
                      mode=uniform.effective_mode(str(values.get("mode") or ""), env), submitted_at=0.0)
    records = telemetry.read_records(telemetry.find_event_files(records_dir)) if records_dir else []
    client_uploads = env.get(settings.CLIENT_UPLOADS.name) == "1"
    mlflow_on = not client_uploads and env.get(settings.MLFLOW_LOGGING.name, "1") != "0"
    mc = run_id = None
    if mlflow_on:
        from components.record import tracking

        tracking.require_cluster_uri(base.mode, env)
        # One bounded wait for both halves (read what the steps logged, then log the summary).
        retry = tracking.upload_retry(env)
        until = time.monotonic() + retry.max_wait_s
        mc = tracking.step_client(env.get("MLFLOW_TRACKING_URI"), env)
        opened = mc

        def read_logged() -> tuple[str, dict[str, float]]:
            rid = tracking.open_pipeline_run(opened, base)
            return rid, opened.get_run(rid).data.metrics

        run_id, logged_metrics = tracking.with_retries(read_logged, retry, until=until)
        logged = tracking.records_from_run(logged_metrics, base)
        records = list({r.key: r for r in [*logged, *records]}.values())

    submitted_at, source = resolve_submit_time(float(values.get("submitted_at") or 0.0), orchestrator_created_at,
                                               records)
    ctx = RunContext(run_group=run_group, pipeline_run=pipeline_run, orchestrator=base.orchestrator, mode=base.mode,
                     submitted_at=submitted_at)
    price = price_for(uses, env)
    final = record_status(status)
    metrics, tags = summarize(ctx=ctx, records=records, uses=uses, price=price, finished_at=finished_at,
                              untrained=final == "FINISHED")  # succeeded: no finetune record, no finetune
    metrics = uniform.name_from_submit(metrics, source)
    tags.update(uniform.foreign_run_tags(orchestrator_run_id, env))
    tags.update(label_tags(env))  # --label KEY=VALUE: llmpack.label.KEY (components.podspec)
    if fuse != "none":  # a fused run's history is its own path's (cluster plan, report); readers take none for none
        tags[FUSE_TAG] = fuse
    tags.update({"llmpack.submit_time_source": source, "llmpack.record": "pipeline",
                 "llmpack.status": "succeeded" if final == "FINISHED" else final.lower()})
    train = telemetry.group_by_step(records).get(telemetry.TRAIN_STEP)
    summary = {"pipeline_run": pipeline_run, "run_group": run_group, "status": final, "submitted_at": submitted_at,
               "submit_time_source": source, "finished_at": finished_at, "metrics": metrics, "tags": tags,
               "retried_attempts": retried_attempts(records, uses, price),
               "headline": uniform.headline(metrics, train.metrics if train else {})}
    if records_dir is not None:
        write_json_atomic(Path(records_dir) / RECORD_FILE, summary)
    if mc is not None and run_id is not None:
        from components.record import tracking

        params = uniform.record_params({**values, "mode": base.mode}, run_group=run_group, pipeline_run=pipeline_run,
                                       submitted_at=submitted_at)
        upload = tracking.RunUpload(ctx=ctx, records=records, metrics=metrics, tags=tags, status=final, params=params,
                                    finished_at=time.time(), curve=uniform.loss_curve(records_dir),
                                    series=gpu_metrics.read_series(records_dir))
        tracking.upload_run(mc, upload, retry, run_id=run_id, until=until)
        summary["mlflow_run_id"] = run_id
    summary["trace"] = export_trace(records, ctx=ctx, tags=tags, finished_at=finished_at, env=env,
                                    out_dir=records_dir, mc=mc, run_id=run_id)
    if records_dir is not None:
        write_json_atomic(Path(records_dir) / RECORD_FILE, summary)
    return summary


def export_trace(records: list[Record], *, ctx: RunContext, tags: Mapping[str, str], finished_at: float,
                 env: Mapping[str, str], out_dir: Path | None, mc: Any = None, run_id: str | None = None) -> str:
    """The run's trace (:mod:`components.record.trace`) written beside its records and sent, never failing the run.

    ``TRACEPARENT`` (Argo 4.1 injects one) makes the run's spans join the orchestrator's trace; the
    record keeps it (tag ``llmpack.traceparent``), so a later sending from another process (``compare
    --cluster`` adding the pod phases, ``llmpack sync``) joins the same trace rather than starting one.
    Returns ``sent`` or the line saying why not; a sent trace tags the record ``llmpack.trace_id``.
    """
    from components.record import trace, trace_export

    experiment_id, recorded = None, {}
    if mc is not None and run_id:
        try:
            run = mc.get_run(run_id)
            experiment_id, recorded = run.info.experiment_id, dict(run.data.tags)
        except Exception:  # noqa: BLE001 - telemetry about the run never fails it
            experiment_id = None
    parent = env.get("TRACEPARENT") or recorded.get(trace_export.PARENT_TAG)
    built = trace.build_trace(records, pipeline_run=ctx.pipeline_run, submitted_at=ctx.submitted_at, tags=tags,
                              finished_at=finished_at, traceparent=parent)
    note = trace_export.export_run(built, env=env, out_dir=out_dir, tracking_uri=env.get("MLFLOW_TRACKING_URI"),
                                   experiment_id=experiment_id, run_id=run_id)
    if note is None and mc is not None and run_id:
        sent = {trace_export.TRACE_TAG: built.trace_id, **({trace_export.PARENT_TAG: parent} if built.joined else {})}
        try:
            for key, value in sent.items():
                mc.set_tag(run_id, key, value)
        except Exception:  # noqa: BLE001 - untagged: llmpack sync sends it again, MLflow keeps one trace per id
            pass
    return "sent" if note is None else note


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a new temporary file and a rename: never half-written, never through a link."""
    from components.bounded import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())  # a planted link: refused


def write_metric_files(metrics: Mapping[str, Any], specs: Sequence[str]) -> None:
    """``METRIC=PATH``: the number alone in PATH (atomically), for Argo to read as an output parameter and
    emit as a Prometheus metric; a metric not measured (None, or renamed ``..._from_first_pod_s``) writes nothing."""
    for spec in specs:
        key, _, target = spec.partition("=")
        value = metrics.get(key)
        if not target or not isinstance(value, (int, float)):
            continue
        path = Path(target)
        try:
            from components.bounded import write_atomic

            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, repr(float(value)).encode())  # a new temporary file: no planted link followed
        except (OSError, InputError) as exc:  # the record is closed; a metric file is a bonus, never a failure
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            print(f"llmpack: warning: could not write {key} to {path} ({why})", file=sys.stderr)


def read_summary(records_dir: Path) -> dict[str, Any] | None:
    """The summary the summarizing task wrote into ``records_dir``, if it ran."""
    path = Path(records_dir) / RECORD_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def record_args(*, status: str, uses: str, run_id: str, created_at: str, params: Mapping[str, str],
                fuse: str = "none") -> list[str]:
    """Arguments after ``python``: the summarizing task's command line (every backend runs this)."""
    args = ["-m", MODULE, f"--status={status}", f"--uses={uses}", f"--run-id={run_id}", f"--created-at={created_at}"]
    return args + fuse_args(fuse) + [f"--param={k}={v}" for k, v in params.items()]


def fuse_args(fuse: str) -> list[str]:
    """``--fuse=MODE`` for a fused pipeline's summarizing task; nothing for an unfused one."""
    return [] if fuse == "none" else [f"--fuse={fuse}"]


def main(argv: Sequence[str] | None = None) -> int:
    started = telemetry.process_start_time()
    startup.pause_full_collections()  # MLflow's import without full collections (components.process.startup)
    try:
        return _main(argv, started)
    finally:
        startup.settle()


def _main(argv: Sequence[str] | None, started: float) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description="Close a pipeline run's record.")
    parser.add_argument("--status", required=True, help="the orchestrator's final state of the run")
    parser.add_argument("--uses", default="[]", help="JSON list of the GPU each task holds")
    parser.add_argument("--run-id", default="", help="the orchestrator's own run id")
    parser.add_argument("--created-at", default="", help="when the orchestrator created the run (RFC 3339 or epoch)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--fuse", default="none", help="how the compiled steps are packaged (none, gpu, all)")
    parser.add_argument("--scalars-out", default="",
                        help="a directory for the headline numbers as JSON (KFP's Output[Metrics])")
    parser.add_argument("--metric-file", action="append", default=[], metavar="METRIC=PATH",
                        help="write the run's METRIC (e.g. spinup_s) alone to PATH when measured "
                             "(Argo's output parameters)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        values = dict(item.partition("=")[::2] for item in args.param)
        records_dir = os.environ.get(settings.RECORDS_DIR.name)
        summary = close(values=values, status=args.status, uses=parse_uses(args.uses), orchestrator_run_id=args.run_id,
                        orchestrator_created_at=args.created_at, finished_at=started,
                        records_dir=Path(records_dir) if records_dir else None, fuse=args.fuse)
    except InputError as exc:
        from components.redaction import redact_text

        print(redact_text(f"llmpack: error: {exc}"), file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the steps' JSONL keeps everything; the run's own status stands
        from components.redaction import redact_text  # MLflow's message may quote the tracking URI whole

        print(redact_text(f"llmpack: warning: could not close the run's record ({type(exc).__name__}: {exc})"),
              file=sys.stderr)
        return 0
    if args.scalars_out:
        write_json_atomic(Path(args.scalars_out) / uniform.SCALARS_FILE, summary["headline"])
    m = summary["metrics"]
    write_metric_files(m, args.metric_file)
    print(f"llmpack: record {summary['pipeline_run']} {summary['status']}: spinup_s={m.get('spinup_s')} "
          f"time_to_first_step_s={m.get('time_to_first_step_s')} cost_usd={m.get('cost_usd')} "
          f"(submit time from {summary['submit_time_source']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
