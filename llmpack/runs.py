"""One pipeline run on one backend, locally: validate, submit, wait, measure, summarise.

The sequence is the same for every backend, which is what makes them comparable:

1. validate every input before anything is written (bad input: one line, exit 2);
2. create the pipeline run's MLflow record with its tags, take ``submitted_at``;
3. hand the pipeline to the backend (direct, kfp.local, the Argo local executor, ``mlflow run``);
4. read every step's JSONL events, derive the DESIGN.md metrics and cost, log them to MLflow;
5. move the staging directory to its final name (``<pipeline_run>`` or ``<pipeline_run>.failed``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from components import cost, record, telemetry, tracking
from components.commands import pipeline_values
from components.data import BUILTIN, load_rows
from components.dsl import Pipeline, is_dns1123_label
from components.errors import InputError, Interrupted, RunFailed
from components.modeling import check_model_ref
from components.runtime import CLIENT_UPLOADS_ENV
from components.submission import connect_tracking, new_id, telemetry_values
from llmpack.backends import local_runner
from llmpack.progress import watch


@dataclass(kw_only=True)
class RunOptions:
    backend: str = "direct"
    model: str = "tiny"
    data: str = BUILTIN
    max_steps: int = 60
    seed: int = 0
    output_dir: Path = Path("llmpack-runs")
    tracking_uri: str | None = None
    gpu_type: str | None = None
    gpus: int | None = None
    price_per_gpu_hour: str | None = None
    price_file: str | None = None
    run_group: str | None = None
    params: dict[str, Any] = field(default_factory=dict)  # other pipeline parameters


def validate(opts: RunOptions) -> None:
    """Every check that can fail on the user's input, before anything is written."""
    local_runner(opts.backend)  # an unknown --backend is refused here, before anything is written
    if opts.max_steps <= 0:
        raise InputError(f"--max-steps {opts.max_steps}: must be a positive number of steps")
    if opts.gpus is not None and opts.gpus < 0:
        raise InputError(f"--gpus {opts.gpus}: must be >= 0")
    if opts.gpu_type is not None and opts.gpus == 0:
        raise InputError(f"--gpu-type {opts.gpu_type!r} with --gpus 0: give a GPU count > 0 or drop --gpu-type")
    if opts.price_per_gpu_hour is not None:
        cost.parse_price(opts.price_per_gpu_hour, "--price-per-gpu-hour")
    if not 0 <= opts.seed < 2**32:
        raise InputError(f"--seed {opts.seed}: must be between 0 and 2**32 - 1")
    if opts.run_group is not None and not is_dns1123_label(opts.run_group):
        raise InputError(f"--run-group {opts.run_group!r}: must be a DNS-1123 label (lower-case letters, digits, '-')")
    check_model_ref(opts.model)
    if opts.data != BUILTIN:
        load_rows(opts.data, seed=opts.seed)  # validates every row; names file and line
    out = Path(opts.output_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"--output-dir {out}: exists and is not a directory")
    probe = next((p for p in [out, *out.resolve().parents] if p.exists()), None)
    if probe is None or not os.access(probe, os.W_OK) or str(probe.resolve()).startswith(("/proc", "/sys")):
        raise InputError(f"--output-dir {out}: cannot be created there")


def apply_gpu_overrides(pipe: Pipeline, gpu_type: str | None, gpus: int | None) -> Pipeline:
    """``--gpu-type``/``--gpus`` replace the GPU spec of every GPU step (a copy; the pipeline is untouched)."""
    if gpu_type is None and gpus is None:
        return pipe
    tasks = {}
    for name, task in pipe.tasks.items():
        res = task.step.execution.resources
        if res.gpus > 0:
            res = replace(res, gpu_type=gpu_type or res.gpu_type, gpus=res.gpus if gpus is None else gpus)
            if res.gpus == 0:
                res = replace(res, gpu_type=None)
            task = replace(task, step=replace(task.step, execution=replace(task.step.execution, resources=res)))
        tasks[name] = task
    return replace(pipe, tasks=tasks).validate()


def resolve_price(pipe: Pipeline, opts: RunOptions) -> cost.Price | None:
    gpu_types = sorted({t.step.execution.resources.gpu_type for t in pipe.tasks.values() if t.step.execution.resources.gpus > 0})
    if len(gpu_types) > 1:
        raise InputError(f"the pipeline mixes GPU types {gpu_types}; cost needs one (use --gpu-type)")
    if not gpu_types:
        return None
    price = cost.resolve_price(gpu_types[0], flag=opts.price_per_gpu_hour, price_file=opts.price_file)
    if price is None:
        raise InputError(
            f"--gpu-type {gpu_types[0]!r}: no known price; pass --price-per-gpu-hour or a price file "
            f"(known: {', '.join(cost.known_gpu_types())})"
        )
    return price


def prepare(opts: RunOptions, pipe: Pipeline | None = None) -> tuple[Pipeline, cost.Price | None]:
    from components.pipeline import build

    validate(opts)
    pipe = apply_gpu_overrides(pipe or build(), opts.gpu_type, opts.gpus)
    return pipe, resolve_price(pipe, opts)


def run_pipeline(
    opts: RunOptions,
    pipe: Pipeline | None = None,
    *,
    env: dict[str, str] | None = None,
    progress: Callable[[str, int, float], None] | None = None,
) -> dict[str, Any]:
    """Run the pipeline once; returns the ``llmpack run --json`` summary (status may be failed)."""
    pipe, price = prepare(opts, pipe)
    uri = tracking.tracking_uri(opts.tracking_uri)
    mc = connect_tracking(uri)
    backend = local_runner(opts.backend)

    run_group = opts.run_group or new_id("rg")
    pipeline_run = new_id(opts.backend)
    out_root = Path(opts.output_dir).resolve()
    staging = out_root / f".{pipeline_run}.partial"
    step_env = {
        **os.environ,
        **(env or {}),
        "MLFLOW_TRACKING_URI": uri,
        "PYTHONUNBUFFERED": "1",
        CLIENT_UPLOADS_ENV: "1",  # we upload every step's JSONL after the run (idempotent keys)
        record.RECORDS_DIR_ENV: str(staging),  # where the run's summarizing task finds the step records
    }
    if opts.price_per_gpu_hour is not None:  # the summarizing task prices the run as we do
        step_env[cost.PRICE_ENV] = str(opts.price_per_gpu_hour)
    if opts.price_file:
        step_env[cost.PRICE_FILE_ENV] = str(Path(opts.price_file).resolve())
    if opts.model == "tiny":
        step_env.setdefault("HF_HUB_OFFLINE", "1")

    overrides = {"model": opts.model, "data": opts.data, "seed": opts.seed, "max_steps": opts.max_steps, **opts.params}
    if opts.data != BUILTIN and Path(opts.data).expanduser().exists():
        overrides["data"] = str(Path(opts.data).expanduser().resolve())
    if opts.model != "tiny" and Path(opts.model).expanduser().exists():
        overrides["model"] = str(Path(opts.model).expanduser().resolve())

    submitted_at = time.time()
    ctx = telemetry.RunContext(
        run_group=run_group, pipeline_run=pipeline_run, orchestrator=opts.backend, mode="local", submitted_at=submitted_at
    )
    values = pipeline_values(pipe, {**overrides, **telemetry_values(ctx)})
    uses = record.gpu_uses(pipe)
    run_id = tracking.open_pipeline_run(mc, ctx, {**cost.cost_tags(uses, price), "llmpack.pipeline": pipe.name})
    staging.mkdir(parents=True)

    error: str | None = None
    failed_step: str | None = None
    artifacts: dict[str, Path] = {}
    try:
        with watch(staging, progress) if progress else nullcontext():
            artifacts = backend.run_local(pipe, values, staging, step_env)
    except RunFailed as exc:
        error, failed_step = str(exc), exc.step
    except InputError as exc:
        error = str(exc)
    except BaseException as exc:  # a crash or Ctrl-C: keep what there is, but never as a complete run
        _abandon(exc, mc=mc, run_id=run_id, staging=staging, kept=out_root / f"{pipeline_run}.failed")
        raise
    finished_at = time.time()

    try:
        return _finish(pipe=pipe, opts=opts, ctx=ctx, mc=mc, run_id=run_id, uri=uri, staging=staging,
                       out_root=out_root, artifacts=artifacts, error=error, failed_step=failed_step,
                       finished_at=finished_at, overrides=overrides, step_env=step_env)
    except BaseException as exc:
        _abandon(exc, mc=mc, run_id=run_id, staging=staging, kept=out_root / f"{pipeline_run}.failed")
        raise


def _abandon(exc: BaseException, *, mc: Any, run_id: str, staging: Path, kept: Path) -> None:
    """A run cut short (crash, Ctrl-C, SIGTERM): its record ends KILLED or FAILED, its directory is kept as ``.failed``."""
    interrupted = isinstance(exc, (KeyboardInterrupt, Interrupted))
    try:
        records = telemetry.read_records(telemetry.find_event_files(staging)) if staging.exists() else []
        tracking.log_records(mc, run_id, records)
        tracking.set_tags(mc, run_id, {"llmpack.status": "killed" if interrupted else "failed",
                                       "llmpack.error": "interrupted" if interrupted else type(exc).__name__})
        mc.set_terminated(run_id, "KILLED" if interrupted else "FAILED")
    except Exception as log_exc:  # noqa: BLE001 - the JSONL in the kept directory has everything
        print(f"llmpack: warning: could not close the MLflow record ({type(log_exc).__name__})", file=sys.stderr)
    if staging.exists():
        os.replace(staging, kept)
    if isinstance(exc, Interrupted):
        exc.kept.append(str(kept))
    elif isinstance(exc, KeyboardInterrupt):
        exc.args = (*exc.args, str(kept))


def _finish(*, pipe: Pipeline, opts: RunOptions, ctx: telemetry.RunContext, mc: Any,
            run_id: str, uri: str, staging: Path, out_root: Path, artifacts: dict[str, Path], error: str | None,
            failed_step: str | None, finished_at: float, overrides: dict[str, Any],
            step_env: dict[str, str]) -> dict[str, Any]:
    """Upload what the run's summarizing task derived, write the summary, move the staging directory into place.

    Every path ends with the summarizing task (:mod:`components.record`); it wrote its summary
    into the staging directory. Only when it never ran (the orchestrator itself failed) is the
    same function called here, with the time the backend returned as the end of the run.
    """
    run_group, pipeline_run, submitted_at = ctx.run_group, ctx.pipeline_run, ctx.submitted_at
    records = telemetry.read_records(telemetry.find_event_files(staging))
    closed = record.read_summary(staging)
    if closed is None or closed.get("pipeline_run") != pipeline_run:
        closed = record.close(values=telemetry_values(ctx), status="Failed" if error else "Succeeded",
                              uses=record.gpu_uses(pipe), finished_at=finished_at, records_dir=staging, env=step_env)
    metrics, tags = closed["metrics"], dict(closed["tags"])
    finished_at = closed["finished_at"]
    status = "failed" if error else "succeeded"
    tags["llmpack.status"] = status
    if error:
        tags["llmpack.error"] = error[:4000]
    try:
        tracking.log_records(mc, run_id, records)
        tracking.log_summary(mc, run_id, metrics, tags, params=overrides)
        mc.set_terminated(run_id, "FAILED" if error else "FINISHED", end_time=int(finished_at * 1000))
    except Exception as exc:  # noqa: BLE001 - the JSONL stays the source of truth
        print(f"llmpack: warning: MLflow summary logging failed ({type(exc).__name__}); events kept in JSONL", file=sys.stderr)

    events_file = staging / "events.jsonl"
    with events_file.open("w", encoding="utf-8") as fh:
        for rec in sorted(records, key=lambda r: (r.kind != "event", r.value if r.kind == "event" else 0.0, r.key)):
            fh.write(json.dumps(rec.__dict__, sort_keys=True) + "\n")

    final = out_root / (pipeline_run + (".failed" if error else ""))
    rel = {key: path.resolve().relative_to(staging) for key, path in artifacts.items() if path.resolve().is_relative_to(staging)}
    summary: dict[str, Any] = {
        "run_group": run_group,
        "pipeline_run": pipeline_run,
        "orchestrator": opts.backend,
        "mode": "local",
        "status": status,
        "error": error,
        "failed_step": failed_step,
        "submitted_at": submitted_at,
        "finished_at": finished_at,
        "metrics": metrics,
        "tags": tags,
        "events": {step: dict(st.events) for step, st in telemetry.group_by_step(records).items()},
        "artifacts": {
            "run_dir": str(final),
            "events_file": str(final / "events.jsonl"),
            "mlflow_run_id": run_id,
            "tracking_uri": tracking.redact_uri(uri),
            **{f"{key}_dir": str(final / path) for key, path in sorted(rel.items())},
        },
    }
    model_key = "finetune.model"
    if model_key in rel:
        summary["artifacts"]["model_dir"] = str(final / rel[model_key])
    (staging / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    return summary
