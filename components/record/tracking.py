"""MLflow: the one record per pipeline run that every step, client and report shares.

A pipeline run's record is the MLflow run tagged ``llmpack.record=pipeline`` and
``llmpack.pipeline_run=<id>`` in the experiment ``llmpack``; steps log ``event.<step>.<name>`` and
``metric.<step>.<name>``, the client the derived metrics; uploads are idempotent. Every upload is
bounded (:func:`with_retries`, ``LLMPACK_TRACKING_MAX_WAIT_S``), with one retry layer (MLflow's own
off inside it); what an outage held back is sent by :func:`upload_run` (``llmpack sync``). Step
processes get their client from :func:`step_client` (REST without MLflow to an http(s) store).
The retry rules: docs/internals/record-internals.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from components import settings
from components.errors import InputError
from components.names import filter_literal
from components.record.artifact_uri import artifact_uri_problem, check_artifact_uri  # noqa: F401 - as tracking.X
from components.record.retries import (  # the record's callers reach these as tracking.X
    DEFAULT_MAX_WAIT_S,  # noqa: F401
    TrackingUnavailable,  # noqa: F401
    UploadRetry,
    is_transient,  # noqa: F401
    mlflow_http_env,  # noqa: F401
    upload_retry,  # noqa: F401
    with_retries,
)
from components.record.telemetry import Record, RunContext
from components.redaction import blank_known

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from components.record.rest import RestClient

DEFAULT_EXPERIMENT = "llmpack"
RECORD_TAG = "llmpack.record"
RecordStatus = Literal["FINISHED", "FAILED", "KILLED"]


# Every cluster pod (KFP, Argo, the MLflow Job) reads the tracking server from this Secret, never a literal:
# the URI key is required, the credential keys optional, each read as the variable MLflow takes.
TRACKING_SECRET = "llmpack-mlflow"
TRACKING_URI_KEY = "tracking-uri"
# ``signing-key`` is the provenance key (components/provenance.py): every pod of a run must sign and verify
# checkpoints and evaluations with the same one, so it travels with the tracking Secret.
TRACKING_CREDENTIALS = {"username": "MLFLOW_TRACKING_USERNAME", "password": "MLFLOW_TRACKING_PASSWORD",
                        "token": "MLFLOW_TRACKING_TOKEN", "signing-key": "LLMPACK_SIGNING_KEY"}


def require_cluster_uri(mode: str, env: Mapping[str, str] | None = None) -> None:
    """In cluster mode a step that logs to MLflow needs the tracking server: one :class:`InputError` line without it.

    Without it MLflow would fall back to a sqlite file in the pod, and the run would "succeed"
    with its record and model registration gone with the pod. Nothing to check when the step
    does not log (``LLMPACK_MLFLOW_LOGGING=0``, or a client uploads for it).
    """
    env = os.environ if env is None else env
    if (mode != "cluster" or env.get(settings.MLFLOW_LOGGING.name, "1") == "0"
            or env.get(settings.CLIENT_UPLOADS.name) == "1"):
        return
    if not (env.get("MLFLOW_TRACKING_URI") or "").strip():
        raise InputError("MLFLOW_TRACKING_URI is empty in cluster mode: "
                         f"the pod reads it from Secret {TRACKING_SECRET!r} "
                         f"key {TRACKING_URI_KEY!r}, which is missing or empty in this namespace "
                         "(kubectl create secret "
                         f"generic {TRACKING_SECRET} --from-literal={TRACKING_URI_KEY}=http://mlflow...:5000); "
                         f"refusing to log to a sqlite file inside the pod")


def tracking_uri(explicit: str | None = None) -> str:
    """``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else MLflow's own default sqlite file.

    An http(s) URI whose host or port cannot be right (``:50OO``, ``:99999``, ``[::1``) is one
    :class:`InputError` line here, its credentials blanked, before MLflow quotes it whole in an error.
    """
    from components.redaction import redact_uri as redact
    from components.uri_checks import uri_problem

    uri = explicit or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        problem = uri_problem(uri)
        if problem is not None:
            source = "--tracking-uri" if explicit else "MLFLOW_TRACKING_URI"
            raise InputError(f"{source} {redact(uri)}: {problem}")
        return uri
    return f"sqlite:///{Path('mlflow.db').resolve()}"


def redact_uri(uri: str) -> str:
    """A tracking URI safe to print: ``https://user:pass@host`` becomes ``https://***@host``, and every query or
    fragment value ``***`` (the user's own URI: only they know which keys are secret); never raises."""
    from components.redaction import redact_uri as redact

    return redact(uri, every_value=True)


def client(uri: str | None = None) -> MlflowClient:
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(uri)
    _create_sqlite_whole(uri)
    return MlflowClient(tracking_uri=uri)


def step_client(uri: str | None = None, env: Mapping[str, str] | None = None, *,
                each_request: Callable[[Callable[[], Any]], Any] | None = None) -> MlflowClient | RestClient:
    """A step process's client: MLflow's REST API without importing MLflow for an http(s) store, else MLflow's.

    The lean path (:mod:`components.record.rest`) writes the same records; ``LLMPACK_TRACKING_REST=0``,
    a non-HTTP store or a setting only MLflow's client honours (an auth plugin, SigV4) keep the client.
    Each request times out after the retry bound's request timeout, or the user's shorter
    ``MLFLOW_HTTP_REQUEST_TIMEOUT``, as :func:`_one_retry_layer` caps MLflow's; ``each_request``
    retries each REST request (see :class:`components.record.rest.RestClient`).
    """
    env = os.environ if env is None else env
    uri = tracking_uri(uri)
    if env.get(settings.TRACKING_REST.name, "1") != "0":
        from components.record import rest

        if rest.usable(uri, env):
            timeout = UploadRetry().request_timeout_s
            try:
                timeout = min(timeout, max(1, int(env.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or timeout)))
            except ValueError:
                pass
            return rest.RestClient(uri, timeout_s=timeout, env=env, each_request=each_request)
    return client(uri)


def _entities(mc: Any) -> tuple[Any, Any, Any]:
    """``(Metric, Param, RunTag)`` for ``mc``: the REST client's own, or MLflow's (importing MLflow)."""
    from components.record import rest

    if isinstance(mc, rest.RestClient):
        return rest.Metric, rest.Param, rest.RunTag
    from mlflow.entities import Metric, Param, RunTag

    return Metric, Param, RunTag


def check_sqlite_writable(uri: str) -> None:
    """A sqlite store this process can write: the file (when it exists) and its directory (SQLite writes its
    journal beside the file), else one InputError. Checked before a run, not found when its records are sent."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri[len("sqlite:///"):].split("?", 1)[0])
    if str(path) in ("", ":memory:"):
        return
    where = f"MLflow tracking store {path}"
    if path.is_dir():
        raise InputError(f"{where}: is a directory, not a sqlite file")
    if path.exists() and not path.is_file():  # a FIFO or a device: SQLite's open would block or read for ever
        raise InputError(f"{where}: not a regular file (a FIFO or device), not a sqlite file")
    if not path.parent.is_dir():
        raise InputError(f"{where}: the directory {path.parent} does not exist")
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise InputError(f"{where}: not writable (read-only file); runs write their records there")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise InputError(f"{where}: its directory {path.parent} is not writable (SQLite writes its journal there)")


def _create_sqlite_whole(uri: str) -> None:
    """A new sqlite store appears whole or not at all.

    MLflow creates a sqlite database by running its schema migrations in place; a Ctrl-C in
    those seconds left a half-migrated file that every later run refused ("duplicate column
    name"). So a store that does not exist yet is migrated in a temporary file beside it and
    linked into place (a link, not a rename: a store another process created meanwhile wins).
    """
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri[len("sqlite:///"):])
    if path.exists() or not path.parent.is_dir() or str(path) == ":memory:":
        return
    from mlflow.tracking import MlflowClient

    # A name of its own each time: MLflow caches stores by URI, and a cached one would not migrate again.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        MlflowClient(tracking_uri=f"sqlite:///{tmp}")  # runs the migrations
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
            leftover.unlink(missing_ok=True)


def experiment_id(mc: MlflowClient, name: str | None = None) -> str:
    """The llmpack experiment's id, created with its artifacts beside a sqlite database.

    Always the experiment named ``LLMPACK_EXPERIMENT`` (default ``llmpack``), whoever started the
    run: a set ``MLFLOW_EXPERIMENT_ID`` is never adopted. ``mlflow run`` sets it (with
    ``MLFLOW_RUN_ID`` and ``MLFLOW_TRACKING_URI``) for its entry point, but so does KFP 2.17's MLflow
    plugin (KEP-12862) in every step container, and the same three variables cannot tell the two
    apart; adopting it put native ``mlflow run`` records in ``Default`` and KFP-plugin runs' records
    beside KFP's own. The MLflow driver links its own run to the record instead
    (:func:`mlflow_projects.driver_record.bind_record`).
    """
    name = name or experiment_name()
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


def experiment_name(env: Mapping[str, str] | None = None) -> str:
    """The record's experiment: ``LLMPACK_EXPERIMENT``, else ``llmpack``."""
    return (os.environ if env is None else env).get(settings.EXPERIMENT.name) or DEFAULT_EXPERIMENT


def find_pipeline_run(mc: MlflowClient, pipeline_run: str) -> str | None:
    runs = mc.search_runs(
        [experiment_id(mc)],
        filter_string=f"tags.`llmpack.pipeline_run` = {filter_literal(pipeline_run)} "
                      f"and tags.`{RECORD_TAG}` = 'pipeline'",
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


# id(ctx) -> (ctx, (tracking URI, experiment), run id): the register step opens the record, then its step
# runner's upload does again with the same context object; the second asks the server nothing (two requests).
_OPENED: dict[int, tuple[RunContext, tuple[str, str], str]] = {}


def open_pipeline_run(mc: MlflowClient, ctx: RunContext, extra_tags: dict[str, str] | None = None) -> str:
    """The pipeline run's MLflow run id, created (with its tags) when it does not exist yet.

    Kept for the same context object, tracking URI and experiment within this process
    (:data:`_OPENED`): a record found or created is not looked up again by a later call of the same step.
    """
    uri = getattr(mc, "tracking_uri", None)
    where = (uri, experiment_name()) if isinstance(uri, str) and uri else None
    known = _OPENED.get(id(ctx))
    if not extra_tags and where and known is not None and known[0] is ctx and known[1] == where:
        return known[2]
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
    if where:
        if len(_OPENED) >= 64:  # a long-lived process (tests, `llmpack sync` of many runs): stay small
            _OPENED.clear()
        _OPENED[id(ctx)] = (ctx, where, run_id)
    return run_id


FREE_TEXT_TAGS = frozenset({"llmpack.error"})  # a message (an exception's words): the one tag that may quote a secret


def _stored(key: str, value: object) -> str:
    """A tag's value as it goes to the store: a free-text one with every known secret blanked (typed, percent-encoded
    or in base64); the others exact (identity tags such as ``llmpack.pipeline_run`` are matched later, and a weak
    password equal to one of llmpack's words would otherwise blank them for good)."""
    return blank_known(str(value)) if key in FREE_TEXT_TAGS else str(value)


def set_tags(mc: MlflowClient, run_id: str, tags: dict[str, str]) -> None:
    _, _, RunTag = _entities(mc)  # noqa: N806 - a class, as mlflow.entities names it
    mc.log_batch(run_id, tags=[RunTag(k, _stored(k, v)) for k, v in tags.items()])


def metric_keys(mc: MlflowClient, run_id: str) -> set[str]:
    """The metric keys on the run now: what :func:`log_records` and :func:`log_curve` skip."""
    return set(mc.get_run(run_id).data.metrics)


def log_records(mc: MlflowClient, run_id: str, records: list[Record], *, present: set[str] | None = None) -> int:
    """Upload step records not yet present on the run. Returns how many were logged.

    ``present`` (:func:`metric_keys`, read once by a step that logs records and a curve) saves a request.
    """
    Metric, _, _ = _entities(mc)  # noqa: N806 - a class, as mlflow.entities names it
    present = metric_keys(mc, run_id) if present is None else present
    new = [r for r in records if r.mlflow_key not in present]
    if new:
        now = int(max(r.value for r in new if r.kind == "event") * 1000) if any(r.kind == "event" for r in new) else 0
        mc.log_batch(run_id, metrics=[Metric(r.mlflow_key, r.value, now, 0) for r in new])
    return len(new)


def log_summary(
    mc: MlflowClient, run_id: str, metrics: dict[str, Any], tags: dict[str, str], params: dict[str, Any] | None = None
) -> None:
    """Derived metrics, tags and (once) the run's parameters."""
    Metric, Param, RunTag = _entities(mc)  # noqa: N806 - classes, as mlflow.entities names them
    values = [Metric(k, float(v), 0, 0) for k, v in metrics.items() if v is not None]
    present = set(mc.get_run(run_id).data.params)
    new_params = [Param(k, str(v)) for k, v in (params or {}).items() if k not in present]
    mc.log_batch(run_id, metrics=values, params=new_params, tags=[RunTag(k, _stored(k, v)) for k, v in tags.items()])


def log_curve(mc: MlflowClient, run_id: str, key: str, points: list[tuple[int, float]], *,
              present: set[str] | None = None) -> int:
    """A step-indexed metric series (the training-loss curve), once: nothing when ``key`` is on the run already
    (``present``: as :func:`log_records`)."""
    return log_series(mc, run_id, key, [(step, loss, 0.0) for step, loss in points], present=present)


def log_series(mc: MlflowClient, run_id: str, key: str, points: list[tuple[int, float, float]], *,
               present: set[str] | None = None) -> int:
    """A step-indexed, timestamped series (a GPU's samples: ``(index, value, epoch s)``), once, as :func:`log_curve`."""
    Metric, _, _ = _entities(mc)  # noqa: N806 - a class, as mlflow.entities names it
    if not points or key in (metric_keys(mc, run_id) if present is None else present):
        return 0
    values = [Metric(key, value, int(t * 1000), step) for step, value, t in points]
    for start in range(0, len(values), 1000):  # MLflow's batch limit
        mc.log_batch(run_id, metrics=values[start:start + 1000])
    return len(values)


def records_from_run(metrics: dict[str, float], ctx: RunContext) -> list[Record]:
    """Rebuild step records from a run's ``event.*`` / ``metric.*`` metrics (for reports)."""
    from components.record.telemetry import make_record, split_mlflow_name

    out = []
    for key, value in metrics.items():
        kind, _, rest = key.partition(".")
        step, _, name = rest.partition(".")
        if kind in ("event", "metric") and step and name:
            name, attempt = split_mlflow_name(name)  # a retry's: ``<name>.attempt<N>``
            out.append(make_record(ctx, kind, step, name, value, attempt))
    return out


@dataclass(frozen=True, kw_only=True)
class RunUpload:
    """Everything a local pipeline run's record holds, as its run directory keeps it."""

    ctx: RunContext
    records: list[Record]
    metrics: dict[str, Any]
    tags: dict[str, str]
    params: dict[str, Any] = field(default_factory=dict)
    status: RecordStatus
    finished_at: float
    curve: list[tuple[int, float]] = field(default_factory=list)  # the training loss by step (uniform.LOSS_CURVE)
    # GPU samples (gpu_metrics.read_series)
    series: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)


def upload_run(
    mc: MlflowClient,
    run: RunUpload,
    retry: UploadRetry,
    *,
    run_id: str | None = None,
    until: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[str, int]:
    """Find or create the run's record, log what it lacks, close it; ``(run id, records logged)``.

    Idempotent and bounded: a second upload of the same run logs nothing new and creates no second
    record (same ``llmpack.pipeline_run`` tag); a partial one (the record opened at the start of a
    run, some keys logged) is completed. Raises :class:`TrackingUnavailable` after the bounded wait.
    """
    logged = 0

    def attempt() -> str:
        nonlocal logged
        rid = run_id or open_pipeline_run(mc, run.ctx, run.tags)
        logged += log_records(mc, rid, run.records)
        log_summary(mc, rid, run.metrics, run.tags, params=run.params)
        log_curve(mc, rid, "train_loss", run.curve)  # components.record.uniform.LOSS_CURVE
        for key, points in run.series.items():
            log_series(mc, rid, key, points)
        mc.set_terminated(rid, run.status, end_time=int(run.finished_at * 1000))
        return rid

    return with_retries(attempt, retry, until=until, sleep=sleep, clock=clock), logged
