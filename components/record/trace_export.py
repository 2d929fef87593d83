"""Where a run's trace goes: an OTLP endpoint, the MLflow tracking server, a file. Never blocks a run.

First match wins (:func:`target`): the OpenTelemetry SDK's ``OTEL_EXPORTER_OTLP_*`` endpoint (OTLP/HTTP
JSON), else an HTTP(S) MLflow server's ``/v1/traces`` linked to the pipeline's run, else nowhere
(the trace file beside the run still is). One bounded try: what was not sent is sent by ``llmpack
sync``, once (``llmpack.trace_id``). The targets in full: docs/internals/record-internals.md.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from components.record.rest_auth import NoRedirect
from components.record.trace import Trace

TRACE_FILE = "trace.otlp.json"
TRACE_TAG = "llmpack.trace_id"
PARENT_TAG = "llmpack.traceparent"  # the TRACEPARENT a sent trace joined (close.export_trace)


@dataclass(frozen=True, kw_only=True)
class Target:
    """An OTLP/HTTP endpoint and the headers it needs (never printed: they may hold a token)."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    insecure: bool = False
    kind: str = "otlp"  # "otlp" | "mlflow"


def target(env: Mapping[str, str], *, tracking_uri: str | None = None, experiment_id: str | None = None,
           run_id: str | None = None) -> Target | None:
    """Where this environment sends traces (module docstring), or None."""
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not endpoint and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    if endpoint:
        headers = _parse_headers(env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS")
                                 or "")
        return Target(url=endpoint, headers=headers, kind="otlp")
    uri = tracking_uri or env.get("MLFLOW_TRACKING_URI") or ""
    if not uri.startswith(("http://", "https://")) or not experiment_id:
        return None
    headers = {"x-mlflow-experiment-id": experiment_id}
    if run_id:
        headers["x-mlflow-run-id"] = run_id
    if env.get("MLFLOW_TRACKING_TOKEN"):
        headers["Authorization"] = f"Bearer {env['MLFLOW_TRACKING_TOKEN']}"
    elif env.get("MLFLOW_TRACKING_USERNAME"):
        pair = f"{env['MLFLOW_TRACKING_USERNAME']}:{env.get('MLFLOW_TRACKING_PASSWORD', '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    insecure = env.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() in ("1", "true")
    return Target(url=uri.rstrip("/") + "/v1/traces", headers=headers, insecure=insecure, kind="mlflow")


def send(trace: Trace, to: Target, *, env: Mapping[str, str] | None = None, timeout_s: float = 5.0) -> str | None:
    """POST the trace once; None when the endpoint took it, else one line saying why not (never raises)."""
    env = os.environ if env is None else env
    if env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")) == "grpc":
        return "OTLP over gRPC is not supported; set OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json"
    body = json.dumps(trace.otlp(root=to.kind == "mlflow")).encode()  # MLflow keeps whole traces only (Trace.otlp)
    request = urllib.request.Request(to.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **to.headers})
    context = ssl._create_unverified_context() if to.insecure else None  # noqa: S323 - the user asked for it
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), NoRedirect())
    try:
        with opener.open(request, timeout=timeout_s) as resp:
            resp.read()
        return None
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            return (f"trace not sent to {_redact(to.url)}: HTTP {exc.code} redirect, not followed (the trace and its "
                    "credentials go only to the configured endpoint)")
        return f"trace not sent to {_redact(to.url)}: HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return f"trace not sent to {_redact(to.url)}: {type(exc).__name__}"


def write(trace: Trace, path: Path) -> Path:
    """The trace as OTLP/JSON at ``path``, through a new temporary file and a rename (bounded.write_atomic)."""
    from components.bounded import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(trace.otlp(), indent=1, sort_keys=True) + "\n").encode())  # no planted link followed
    return path


def _parse_headers(text: str) -> dict[str, str]:
    headers: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep and key.strip():
            headers[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return headers


def _redact(url: str) -> str:
    from components.redaction import redact_uri

    return redact_uri(url)


def export_run(trace: Trace, *, env: Mapping[str, str], out_dir: Path | None = None, tracking_uri: str | None = None,
               experiment_id: str | None = None, run_id: str | None = None) -> str | None:
    """Write the run's trace into ``out_dir`` (when given) and send it to its target (when there is one).

    Returns None when it was sent, else the one line saying why not ("no trace endpoint" included):
    the caller tags the record only on None, so ``llmpack sync`` sends what is left, once.
    """
    if out_dir is not None:
        try:
            write(trace, Path(out_dir) / TRACE_FILE)
        except OSError as exc:
            return f"trace not written: {exc}"
    to = target(env, tracking_uri=tracking_uri, experiment_id=experiment_id, run_id=run_id)
    if to is None:
        return "no trace endpoint"
    return send(trace, to, env=env)
