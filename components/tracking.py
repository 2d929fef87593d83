"""MLflow: the one record per pipeline run that every step, client and report shares.

A pipeline run's record is the MLflow run tagged ``llmpack.record=pipeline`` and
``llmpack.pipeline_run=<id>`` in the experiment ``llmpack`` (``LLMPACK_EXPERIMENT``).
Steps log their events there as metrics named ``event.<step>.<name>`` and step metrics as
``metric.<step>.<name>``; the client adds the derived metrics. Uploads are idempotent: a key
already present is not logged again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.telemetry import Record, RunContext

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

EXPERIMENT_ENV = "LLMPACK_EXPERIMENT"
DEFAULT_EXPERIMENT = "llmpack"
RECORD_TAG = "llmpack.record"


def tracking_uri(explicit: str | None = None) -> str:
    """``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else MLflow's own default sqlite file."""
    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{Path('mlflow.db').resolve()}"


def redact_uri(uri: str) -> str:
    """A tracking URI safe to print: ``https://user:pass@host`` becomes ``https://***@host``."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if parts.username or parts.password:
        netloc = "***@" + (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        return parts._replace(netloc=netloc).geturl()
    return uri


def client(uri: str | None = None) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri(uri))


def experiment_id(mc: MlflowClient, name: str | None = None) -> str:
    """The llmpack experiment's id, created with its artifacts beside a sqlite database.

    Inside ``mlflow run`` (``MLFLOW_EXPERIMENT_ID`` set, no ``LLMPACK_EXPERIMENT``) it is the
    experiment that run lives in, so the record is the run ``mlflow run`` printed.
    """
    if name is None and not os.environ.get(EXPERIMENT_ENV) and os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return os.environ["MLFLOW_EXPERIMENT_ID"]
    name = name or os.environ.get(EXPERIMENT_ENV, DEFAULT_EXPERIMENT)
    exp = mc.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    uri = mc.tracking_uri if hasattr(mc, "tracking_uri") else tracking_uri()
    artifact_location = None
    if str(uri).startswith("sqlite:///"):
        artifact_location = (Path(str(uri)[len("sqlite:///") :]).parent / "mlartifacts").as_uri()
    try:
        return mc.create_experiment(name, artifact_location=artifact_location)
    except Exception:  # noqa: BLE001 - lost a creation race: read it back
        exp = mc.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def find_pipeline_run(mc: MlflowClient, pipeline_run: str) -> str | None:
    runs = mc.search_runs(
        [experiment_id(mc)],
        filter_string=f"tags.`llmpack.pipeline_run` = '{pipeline_run}' and tags.`{RECORD_TAG}` = 'pipeline'",
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def open_pipeline_run(mc: MlflowClient, ctx: RunContext, extra_tags: dict[str, str] | None = None) -> str:
    """The pipeline run's MLflow run id, created (with its tags) when it does not exist yet."""
    run_id = find_pipeline_run(mc, ctx.pipeline_run)
    if run_id is None:
        tags = {**ctx.tags(), RECORD_TAG: "pipeline", **(extra_tags or {})}
        run = mc.create_run(
            experiment_id(mc), start_time=int(ctx.submitted_at * 1000) or None, tags=tags, run_name=ctx.pipeline_run
        )
        run_id = run.info.run_id
        mc.log_param(run_id, "submitted_at", repr(ctx.submitted_at))
    elif extra_tags:
        set_tags(mc, run_id, extra_tags)
    return run_id


def set_tags(mc: MlflowClient, run_id: str, tags: dict[str, str]) -> None:
    from mlflow.entities import RunTag

    mc.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def log_records(mc: MlflowClient, run_id: str, records: list[Record]) -> int:
    """Upload step records not yet present on the run. Returns how many were logged."""
    from mlflow.entities import Metric

    present = set(mc.get_run(run_id).data.metrics)
    new = [r for r in records if r.mlflow_key not in present]
    if new:
        now = int(max(r.value for r in new if r.kind == "event") * 1000) if any(r.kind == "event" for r in new) else 0
        mc.log_batch(run_id, metrics=[Metric(r.mlflow_key, r.value, now, 0) for r in new])
    return len(new)


def log_summary(
    mc: MlflowClient, run_id: str, metrics: dict[str, Any], tags: dict[str, str], params: dict[str, Any] | None = None
) -> None:
    """Derived metrics, tags and (once) the run's parameters."""
    from mlflow.entities import Metric, Param, RunTag

    values = [Metric(k, float(v), 0, 0) for k, v in metrics.items() if v is not None]
    present = set(mc.get_run(run_id).data.params)
    new_params = [Param(k, str(v)) for k, v in (params or {}).items() if k not in present]
    mc.log_batch(run_id, metrics=values, params=new_params, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def records_from_run(metrics: dict[str, float], ctx: RunContext) -> list[Record]:
    """Rebuild step records from a run's ``event.*`` / ``metric.*`` metrics (for reports)."""
    from components.telemetry import make_record

    out = []
    for key, value in metrics.items():
        kind, _, rest = key.partition(".")
        step, _, name = rest.partition(".")
        if kind in ("event", "metric") and step and name:
            out.append(make_record(ctx, kind, step, name, value))
    return out
