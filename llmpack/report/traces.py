"""The report's runs as OpenTelemetry traces: ``traces.otlp.json`` beside ``report.html``.

One trace per run (:func:`components.record.trace.build_trace`), built from the events the
report already holds, so a report rebuilt from MLflow alone, offline, still carries them (a gang's
node and rank spans too: its ``<event>.node<n>`` / ``<event>.rank<r>`` events are there). A run's
retried attempts are not in its ``events`` (each step's last attempt is), so their spans are in
the run's own ``trace.otlp.json`` (the run directory, or the trace MLflow keeps), not here.
Load the file into any OTLP/JSON reader, or send it on: ``curl -H 'Content-Type: application/json'
--data @traces.otlp.json $OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TRACES_FILE = "traces.otlp.json"


def run_trace(run: dict[str, Any]) -> dict[str, Any]:
    """One run of a report as an OTLP/JSON body."""
    from components.record.telemetry import RunContext, make_record
    from components.record.trace import build_trace

    ctx = RunContext(run_group=str(run.get("run_group", "")), pipeline_run=str(run["pipeline_run"]),
                     orchestrator=str(run.get("orchestrator", "")), mode=str(run.get("mode", "")),
                     submitted_at=float(run["submitted_at"]))
    records = [make_record(ctx, "event", step, name, t)
               for step, events in (run.get("events") or {}).items() for name, t in events.items()]
    tags = {**ctx.tags(), **{k: str(v) for k, v in (run.get("tags") or {}).items()},
            "llmpack.status": str(run["status"])}
    return build_trace(records, pipeline_run=ctx.pipeline_run, submitted_at=ctx.submitted_at, tags=tags).otlp()


def write_traces(runs: list[dict[str, Any]], path: Path) -> Path:
    """Every run's trace in one OTLP/JSON request body (one resourceSpans entry per run).

    A run refused before it was submitted (no ``submitted_at``) has no timeline, so no trace."""
    body = {"resourceSpans": [rs for run in runs if run.get("submitted_at") is not None
                              for rs in run_trace(run)["resourceSpans"]]}
    path.write_text(json.dumps(body, sort_keys=True) + "\n", encoding="utf-8")
    return path
