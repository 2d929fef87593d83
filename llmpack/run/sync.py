"""``llmpack sync RUN_DIR``: send a run directory's records to MLflow, after a tracking outage.

A local run keeps ``events.jsonl`` and ``summary.json`` in its directory; when the tracking store
did not answer within the run's bounded wait, the summary says ``"tracking": "not sent"``. Sync
finds the run's record by its tags, creates it only when there is none, logs what it lacks and
closes it with the run's own status: a record opened before the outage is completed, not doubled,
and a second sync changes nothing. Where it sends, its bound, what it writes after, and the step
files it reads too: docs/internals/run-directories.md.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from components.errors import InputError, Interrupted
from llmpack.run import orphans
from llmpack.run.orphans import FAILED_SUFFIX
from llmpack.ui.terminal import command

SUMMARY_FILE = "summary.json"
EVENTS_FILE = "events.jsonl"
EXIT_NOT_SENT = 1  # the store did not answer (or refused): nothing changed locally
_IDENTITY = ("run_group", "pipeline_run", "orchestrator", "mode")


@dataclass(frozen=True, kw_only=True)
class SyncResult:
    """What one sync did: the record, and how many records it logged / found already there."""

    run_dir: Path
    pipeline_run: str
    mlflow_run_id: str
    tracking_uri: str
    logged: int
    already: int
    status: str
    skipped: int = 0  # JSONL lines that were not a storable record (garbage, cut short, a bad name)


def closed_when_stopped(run_dir: Path) -> bool:
    """A kept ``<run>.failed`` directory without a summary: an interrupted run whose record was sent and closed
    (KILLED, or FAILED on a crash) as it stopped. :mod:`llmpack.run.local` writes a summary into the kept
    directory only when that record could not be sent, for this command to send."""
    return run_dir.name.endswith(FAILED_SUFFIX) and run_dir.is_dir() and not (run_dir / SUMMARY_FILE).exists()


def read_run_dir(run_dir: Path) -> tuple[dict[str, Any], Any, int]:
    """``(summary, upload, skipped)`` of a run directory (``skipped``: JSONL lines that were not a storable
    record, left out and counted); an :class:`InputError` naming what is wrong with it."""
    from components import bounded
    from components.record import gpu_metrics, telemetry, tracking, uniform
    from components.record.close import record_status

    if not run_dir.is_dir():
        raise InputError(f"RUN_DIR {run_dir}: no such run directory")
    path = run_dir / SUMMARY_FILE
    try:
        summary = bounded.read_json(path, allow_nan=True)  # regular, not a symlink, size and depth capped
    except FileNotFoundError:
        raise InputError(f"RUN_DIR {run_dir}: no {SUMMARY_FILE}; not an llmpack run directory") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not readable as JSON ({exc})") from None
    missing = [k for k in (*_IDENTITY, "status", "submitted_at", "finished_at") if not isinstance(summary, dict)
               or summary.get(k) in (None, "")]
    if missing:
        raise InputError(f"{path}: not an llmpack run summary (missing {', '.join(missing)})")
    orphans.check_seal(run_dir, summary, path)  # a copied or planted identity: refused before anything is sent
    try:
        submitted_at, finished_at = float(summary["submitted_at"]), float(summary["finished_at"])
    except (TypeError, ValueError):
        raise InputError(f"{path}: submitted_at and finished_at must be epoch seconds") from None
    ctx = telemetry.RunContext(**{k: str(summary[k]) for k in _IDENTITY}, submitted_at=submitted_at)
    everything, skipped = _records(run_dir, summary.get(orphans.EVENTS_DIGEST))
    records = [r for r in everything if r.pipeline_run == ctx.pipeline_run]
    metrics = {k: v for k, v in _mapping(summary, "metrics").items() if isinstance(v, (int, float))}
    tags = {**ctx.tags(), **{k: str(v) for k, v in _mapping(summary, "tags").items()}}
    tags["llmpack.status"] = str(summary["status"])
    params = {**_mapping(summary, "params"), "submitted_at": repr(ctx.submitted_at)}
    if orphans.EVENTS_DIGEST in summary:  # sealed: the curve and series sealed with it, never a walk's finds
        curve, series = orphans.read_extras(run_dir, summary.get(orphans.EXTRAS_DIGEST))
    else:  # a run directory of an earlier version
        curve, series = uniform.loss_curve(run_dir), gpu_metrics.read_series(run_dir)
    upload = tracking.RunUpload(ctx=ctx, records=records, metrics=metrics, tags=tags, params=params,
                                status=record_status(str(summary["status"])), finished_at=finished_at,
                                curve=curve, series=series)
    return summary, upload, skipped


def _records(run_dir: Path, digest: object) -> tuple[list[Any], int]:
    """RUN_DIR's records: the sealed ``events.jsonl`` alone, read once and checked against the summary's sha256;
    without a digest (a run directory of an earlier version), every event file under it."""
    import hashlib
    import tempfile

    from components import bounded
    from components.record import telemetry

    if not isinstance(digest, str):
        return telemetry.read_records_counted([run_dir / EVENTS_FILE, *telemetry.find_event_files(run_dir)])
    data = bounded.read_bytes(run_dir / EVENTS_FILE, telemetry.MAX_RECORDS_BYTES)
    if hashlib.sha256(data).hexdigest() != digest:
        raise InputError(f"{run_dir / EVENTS_FILE}: not the records sealed with the run's summary (edited since); "
                         "nothing was sent")
    with tempfile.TemporaryDirectory(prefix="llmpack-sync-") as private:
        copy = Path(private) / EVENTS_FILE
        copy.write_bytes(data)
        return telemetry.read_records_counted([copy])


def _mapping(summary: dict[str, Any], key: str) -> dict[str, Any]:
    value = summary.get(key)
    return value if isinstance(value, dict) else {}


def store_for(recorded: object, explicit: str | None, *, what: str) -> str:
    """The store a run directory's records go to: the user's (``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else
    the default), never the one the directory names (``recorded``: anyone who can write the directory wrote it).
    A store whose scheme, host and port (or path) differ from the configured one is one :class:`InputError` line
    naming both, unless ``--tracking-uri`` was given: nothing in a run directory selects where credentials go."""
    from components.record import tracking
    from components.redaction import printable
    from components.uri_checks import store_key

    uri = tracking.tracking_uri(explicit)
    hint = recorded if isinstance(recorded, str) else "" if recorded is None else repr(recorded)
    if explicit or not hint.strip() or store_key(hint) == store_key(uri):
        return uri
    source = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default store"
    raise InputError(f"{what}: it names the tracking store {printable(hint)}, not the configured one "
                     f"{printable(uri)} ({source}); nothing was sent (a run directory cannot choose where your "
                     "credentials go): to send it there, pass that store's URI as --tracking-uri")


def sync_uri(explicit: str | None, summary: dict[str, Any], run_dir: Path | str = "RUN_DIR") -> str:
    """Where RUN_DIR's records go (:func:`store_for`): its summary's ``artifacts.tracking_uri`` is only checked."""
    return store_for(_mapping(summary, "artifacts").get("tracking_uri"), explicit, what=f"RUN_DIR {run_dir}")


def sync_run(run_dir: Path, tracking_uri: str | None = None, *, retry: Any = None) -> SyncResult:
    """Send RUN_DIR's records and summary to its pipeline record; idempotent, bounded.

    Raises :class:`InputError` for a bad RUN_DIR and ``components.record.tracking.TrackingUnavailable``
    when the store does not answer in time; RUN_DIR is changed only after a complete upload.
    """
    from components.record import tracking
    from components.record.close import write_json_atomic

    run_dir = Path(run_dir)
    summary, upload, skipped = read_run_dir(run_dir)
    uri = sync_uri(tracking_uri, summary, run_dir)
    retry = retry or tracking.upload_retry()
    mc = tracking.client(uri)
    run_id, logged = tracking.upload_run(mc, upload, retry)
    trace = send_trace_once(mc, run_id, upload, uri, run_dir) if summary.get("trace") != "sent" else "sent"
    if (summary.get("tracking") != "sent" or _mapping(summary, "artifacts").get("mlflow_run_id") != run_id
            or summary.get("trace") != trace):
        summary["tracking"] = "sent"
        summary["trace"] = trace
        summary["artifacts"] = {**_mapping(summary, "artifacts"), "mlflow_run_id": run_id}
        write_json_atomic(run_dir / SUMMARY_FILE, orphans.seal(run_dir, summary))
    return SyncResult(run_dir=run_dir, pipeline_run=upload.ctx.pipeline_run, mlflow_run_id=run_id,
                      tracking_uri=tracking.redact_uri(uri), logged=logged, already=len(upload.records) - logged,
                      status=upload.status, skipped=skipped)


def send_trace_once(mc: Any, run_id: str, upload: Any, uri: str, run_dir: Path) -> str:
    """The run's trace sent to the store it was synced to, unless its record says it has it (``llmpack.trace_id``)."""
    import os

    from components.record.close import export_trace
    from components.record.trace_export import TRACE_TAG

    if TRACE_TAG in mc.get_run(run_id).data.tags:
        return "sent"
    return export_trace(upload.records, ctx=upload.ctx, tags=upload.tags, finished_at=upload.finished_at,
                        env={**os.environ, "MLFLOW_TRACKING_URI": uri}, out_dir=run_dir, mc=mc, run_id=run_id)


@command("sync", short_help="Send a run's records to MLflow after a tracking outage.")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--tracking-uri", default=None,
              help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db). A run that "
                   "names another store is refused unless this names it.")
def sync(run_dir: Path, tracking_uri: str | None) -> None:
    """Send a run directory's records to MLflow after a tracking outage (idempotent).

    Reads RUN_DIR/events.jsonl and RUN_DIR/summary.json (written by every `llmpack run`), finds
    or creates the run's MLflow record, logs only what it lacks and closes it with the run's
    status. Running it twice creates no second record and no duplicate value. A kept
    <run>.failed directory without a summary.json had its record closed when it stopped: there
    is nothing to send. A staging directory (<runs>/.<run>.partial) whose llmpack client died is
    taken over first (kept as <run>.failed, its record closed KILLED); one whose client lives is
    refused (exit 2). The records go only to the store you configure (--tracking-uri, else
    MLFLOW_TRACKING_URI, else the default): a run directory that names another one is refused
    (exit 2, nothing sent) unless --tracking-uri is given. Lines of the JSONL that are not
    records are skipped and counted. Waits at most LLMPACK_TRACKING_MAX_WAIT_S seconds
    (default 30) for the server.

    Exit codes: 0 sent (or nothing to send); 1 the server did not answer or refused (nothing
    changed); 2 bad RUN_DIR.
    """
    from components.record import tracking
    from components.redaction import redact_text

    if tracking_uri:
        tracking.tracking_uri(tracking_uri)  # a malformed --tracking-uri: one line, before RUN_DIR is read
    if orphans.partial_name(run_dir):  # a staging directory: its client died, or the run is in progress
        kept = orphans.taken_over(run_dir)
        if kept is None:
            owner = orphans.read_owner(run_dir)
            if not orphans.owner_alive(owner):  # a planted store: refused before the directory is touched
                store_for(owner.get("tracking_uri"), tracking_uri, what=f"RUN_DIR {run_dir}")
            kept = orphans.take_over(run_dir)
            click.echo(f"took over {run_dir}: its llmpack client died; the run is kept as {kept}")
        run_dir = kept
    if closed_when_stopped(run_dir):
        click.echo(f"nothing to send: {run_dir} is an interrupted run whose MLflow record was sent and closed "
                   "when it stopped")
        return
    # a RUN_DIR that is not one, or names another store: exit 2 before MLflow is even imported
    sync_uri(tracking_uri, read_run_dir(run_dir)[0], run_dir)
    from llmpack.ui.display import library_logs_to

    with library_logs_to(run_dir.parent / "llmpack-client.log"):
        try:
            result = sync_run(run_dir, tracking_uri)
        except tracking.TrackingUnavailable as exc:
            click.echo(redact_text(f"llmpack: error: {exc}; nothing changed in {run_dir}; "
                                   "run this again when it is back"), err=True)
            sys.exit(EXIT_NOT_SENT)
        except InputError:
            raise
        except (KeyboardInterrupt, Interrupted) as exc:  # exit 130/143 in the CLI; a second sync completes it
            exc.add_note(f"{run_dir} is unchanged; run `llmpack sync {run_dir}` again to send the rest "
                         "(it is idempotent: nothing is sent twice)")
            raise
        except Exception as exc:  # noqa: BLE001 - the store refused (4xx, bad URI): one line, not a traceback
            message = redact_text(str(exc)).splitlines()[0] if str(exc) else ""
            click.echo(f"llmpack: error: tracking store refused the upload ({type(exc).__name__}: {message[:300]}); "
                       f"nothing changed in {run_dir}", err=True)
            sys.exit(EXIT_NOT_SENT)
    click.echo(f"synced {result.run_dir} to {result.tracking_uri}: record {result.mlflow_run_id} {result.status}, "
               f"{result.logged} record(s) sent, {result.already} already there"
               + (f", {result.skipped} line(s) skipped (not a record: cut short, garbage or a name MLflow refuses)"
                  if result.skipped else ""))
