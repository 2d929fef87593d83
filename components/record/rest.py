"""MLflow's REST API without MLflow: how a step process logs its records to an HTTP tracking server.

Importing the MLflow client costs a step process 1.5-4 s (``benchmarks/step_upload.py``) to send a
handful of numbers, so against an ``http(s)://`` server a step speaks the few endpoints it needs
with the standard library: :class:`RestClient` answers the calls :mod:`components.record.tracking`
makes, with the same bodies (``tests/components/test_rest.py`` compares the stores). It honours
MLflow's HTTP settings (:func:`components.record.rest_auth.credentials`), never retries on its own, and
leaves what it cannot do as MLflow does to MLflow's client (:func:`usable`). The settings:
docs/internals/record-internals.md.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import posixpath
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote, urlencode, urlsplit

from components.errors import InputError
from components.record.rest_auth import NoRedirect, credentials, tls_context

API = "/api/2.0/mlflow/"
ARTIFACTS_API = "/api/2.0/mlflow-artifacts/"
# MLflow's batch limits (mlflow.utils.validation): per log-batch call.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_ENTITIES_PER_BATCH = 1000
# Settings only MLflow's own client can honour (plugins, SigV4, workspaces): with one set, use the client.
CLIENT_ONLY_ENV = ("MLFLOW_TRACKING_AUTH", "MLFLOW_TRACKING_AWS_SIGV4", "MLFLOW_WORKSPACE")


# MLflow's entities as NamedTuples: built positionally by tracking.py as mlflow.entities' are.
class Metric(NamedTuple):
    key: str
    value: float
    timestamp: int
    step: int


class Param(NamedTuple):
    key: str
    value: str


class RunTag(NamedTuple):
    key: str
    value: str


@dataclass(frozen=True, kw_only=True)
class Experiment:
    experiment_id: str
    name: str


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    run_id: str
    experiment_id: str
    status: str
    start_time: int | None
    end_time: int | None
    artifact_uri: str


@dataclass(frozen=True, kw_only=True)
class RunData:
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ModelVersion:
    name: str
    version: str
    status: str
    run_id: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Run:
    info: RunInfo
    data: RunData


class RestError(RuntimeError):
    """The tracking server answered with an error (``status``), or could not be spoken to safely (``status`` None)."""

    def __init__(self, message: str, *, status: int | None, error_code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


def is_http(uri: str) -> bool:
    return urlsplit(uri).scheme in ("http", "https")


def usable(uri: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether this module can speak for MLflow's client: an http(s) store and no client-only setting."""
    env = os.environ if env is None else env
    return is_http(uri) and not any((env.get(name) or "").strip() for name in CLIENT_ONLY_ENV) and not _header_plugins()


def _header_plugins() -> bool:
    """A package that adds request headers to MLflow's (``mlflow.request_header_provider``): MLflow's client sends them.

    Read from the installed packages' ``entry_points.txt`` directly: ``importlib.metadata`` would
    cost a step process a tenth of a second or more (a third on a loaded machine) to say the same.
    """
    for entry in sys.path:
        root = Path(entry or ".")
        if not root.is_dir():
            continue
        for found in (*root.glob("*.dist-info/entry_points.txt"), *root.glob("*.egg-info/entry_points.txt")):
            try:
                if "[mlflow.request_header_provider]" in found.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def _json_number(value: float) -> float | str:
    """Protobuf JSON's spelling of a double: NaN and infinities as strings (MLflow's client sends them so)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _int(value: Any) -> int | None:
    return None if value in (None, "") else int(value)


def _run(obj: Mapping[str, Any]) -> Run:
    info, data = obj.get("info", {}), obj.get("data", {})
    return Run(
        info=RunInfo(run_id=info.get("run_id") or info.get("run_uuid", ""),
                     experiment_id=str(info.get("experiment_id", "")),
                     status=info.get("status", ""), start_time=_int(info.get("start_time")),
                     end_time=_int(info.get("end_time")), artifact_uri=info.get("artifact_uri", "")),
        data=RunData(metrics={m["key"]: float(m.get("value", 0.0)) for m in data.get("metrics", [])},
                     params={p["key"]: p.get("value", "") for p in data.get("params", [])},
                     tags={t["key"]: t.get("value", "") for t in data.get("tags", [])}),
    )


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class RestClient:
    """The part of ``MlflowClient`` the record uses, spoken over MLflow's REST API with the standard library.

    ``timeout_s`` bounds each request (connect, then read). Nothing is retried here unless
    ``each_request`` says how (the register step: ``tracking.with_retries`` per request, as
    MLflow's client retries each of its requests); the record's uploads retry whole, idempotent
    calls around it instead.
    """

    def __init__(self, tracking_uri: str, *, timeout_s: float = 10.0, env: Mapping[str, str] | None = None,
                 each_request: Callable[[Callable[[], dict[str, Any]]], dict[str, Any]] | None = None) -> None:
        self._each_request = each_request or (lambda send: send())
        self._experiments: dict[str, Experiment] = {}
        self._artifact_uris: dict[str, str] = {}
        parts = urlsplit(tracking_uri)
        if parts.scheme not in ("http", "https"):
            raise InputError(f"MLflow tracking URI scheme {parts.scheme!r}: the REST client speaks http(s) only")
        self.tracking_uri = tracking_uri
        self.timeout_s = timeout_s
        self._creds = credentials(env)
        authorization = self._creds.authorization
        if parts.username or parts.password:  # user:pass@host wins, as requests applies it last
            userinfo = f"{parts.username or ''}:{parts.password or ''}".encode()
            authorization = "Basic " + base64.standard_b64encode(userinfo).decode()
            netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
            parts = parts._replace(netloc=netloc)
        self._base = parts.geturl().rstrip("/")
        self._headers = {"Content-Type": "application/json", "User-Agent": "llmpack-rest"}
        if authorization:
            self._headers["Authorization"] = authorization
        handlers: list[urllib.request.BaseHandler] = [NoRedirect()]  # credentials never follow a Location
        if parts.scheme == "https":
            handlers.append(urllib.request.HTTPSHandler(context=tls_context(self._creds, env)))
        self._opener = urllib.request.build_opener(*handlers)

    # ------------------------------------------------------------------ the wire

    def call(self, method: str, endpoint: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One request to ``api/2.0/mlflow/<endpoint>``: the answer's JSON, or :class:`RestError` / ``OSError``.

        GET sends ``body`` as the query string, as MLflow's client does; a 4xx/5xx answer is a
        :class:`RestError` with its status; no answer (refused, reset, timed out) an ``OSError``;
        a certificate the settings do not trust a :class:`RestError` without status (not retried).
        """
        url = self._base + API + endpoint
        data = None
        if method == "GET":
            url += "?" + urlencode(body or {}, doseq=True) if body else ""
        else:
            data = json.dumps(body or {}).encode()
        return self._each_request(lambda: self._send(urllib.request.Request(url, data=data, method=method,
                                                                           headers=self._headers), method, endpoint))

    def put_file(self, path: str, local: Path) -> None:
        """``PUT api/2.0/mlflow-artifacts/artifacts/<path>``: one file to the server's artifact proxy, as MLflow's
        ``MlflowArtifactsRepository`` sends it (one request, the file as the body, a guessed content type)."""
        import mimetypes

        endpoint = "artifacts/" + quote(path.strip("/"))
        headers = {**self._headers, "Content-Type": mimetypes.guess_type(local.name)[0] or "application/octet-stream",
                   "Content-Length": str(local.stat().st_size)}

        def send() -> dict[str, Any]:
            with local.open("rb") as fh:
                return self._send(urllib.request.Request(self._base + ARTIFACTS_API + endpoint, data=fh, method="PUT",
                                                         headers=headers), "PUT", endpoint)

        self._each_request(send)

    def _send(self, request: urllib.request.Request, method: str, endpoint: str) -> dict[str, Any]:
        try:
            with self._opener.open(request, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:  # NoRedirect: not followed, and not retried
                raise RestError(f"{method} {endpoint}: HTTP {exc.code} redirect, not followed (credentials go only "
                                "to MLFLOW_TRACKING_URI: set it to the server's own address)", status=None) from None
            raise self._error(method, endpoint, exc.code, exc.read()) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                raise RestError(f"{method} {endpoint}: the server's certificate is not trusted "
                                f"({exc.reason.verify_message}); "
                                "set MLFLOW_TRACKING_SERVER_CERT_PATH to its CA bundle", status=None) from None
            raise
        except http.client.HTTPException as exc:  # a broken answer: as good as none
            raise ConnectionError(f"{method} {endpoint}: {type(exc).__name__}") from None
        try:
            answer = json.loads(raw) if raw.strip() else {}
        except ValueError:
            answer = None
        if not isinstance(answer, dict):  # a login page, a proxy's: not an MLflow server at this URI
            raise RestError(f"{method} {endpoint}: the answer is not MLflow's JSON "
                            "(is MLFLOW_TRACKING_URI the tracking server?)", status=None)
        return answer

    @staticmethod
    def _error(method: str, endpoint: str, status: int, raw: bytes) -> RestError:
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = {}
        obj = obj if isinstance(obj, dict) else {}
        code = str(obj.get("error_code") or "")
        message = str(obj.get("message") or raw[:200].decode("utf-8", "replace")).strip()
        return RestError(f"{method} {endpoint}: HTTP {status} {code}: {message}".replace(" : ", ": "),
                         status=status, error_code=code)

    # ------------------------------------------------------------------ what tracking.py calls

    def get_experiment_by_name(self, name: str) -> Experiment | None:
        """The experiment, or None; one found is kept (a name's id does not change while a step runs)."""
        if name in self._experiments:
            return self._experiments[name]
        try:
            obj = self.call("GET", "experiments/get-by-name", {"experiment_name": name})
        except RestError as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        exp = obj["experiment"]
        self._experiments[name] = Experiment(experiment_id=str(exp["experiment_id"]), name=exp.get("name", name))
        return self._experiments[name]

    def create_experiment(self, name: str, artifact_location: str | None = None) -> str:
        body = {"name": name, **({"artifact_location": artifact_location} if artifact_location else {})}
        return str(self.call("POST", "experiments/create", body)["experiment_id"])

    def search_runs(self, experiment_ids: Sequence[str], filter_string: str = "", max_results: int = 1000) -> list[Run]:
        body = {"experiment_ids": [str(e) for e in experiment_ids], "filter": filter_string,
                "run_view_type": "ACTIVE_ONLY", "max_results": max_results}
        return [_run(r) for r in self.call("POST", "runs/search", body).get("runs", [])]

    def create_run(self, experiment_id: str, start_time: int | None = None, tags: Mapping[str, str] | None = None,
                   run_name: str | None = None) -> Run:
        """As ``MlflowClient.create_run``: ``user_id`` from the ``mlflow.user`` tag, else ``unknown``.

        The run starts now by default.
        """
        tags = dict(tags or {})
        body: dict[str, Any] = {"experiment_id": str(experiment_id), "user_id": tags.get("mlflow.user", "unknown"),
                                "start_time": start_time or int(time.time() * 1000),
                                "tags": [{"key": k, "value": str(v)} for k, v in tags.items()]}
        if run_name:
            body["run_name"] = run_name
        return _run(self.call("POST", "runs/create", body)["run"])

    def get_run(self, run_id: str) -> Run:
        """The run; its artifact URI is kept (:meth:`_artifact_uri` then asks no more)."""
        run = _run(self.call("GET", "runs/get", {"run_uuid": run_id, "run_id": run_id})["run"])
        if run.info.artifact_uri:
            self._artifact_uris.setdefault(run_id, run.info.artifact_uri)
        return run

    def log_param(self, run_id: str, key: str, value: Any) -> Any:
        self.call("POST", "runs/log-parameter", {"run_uuid": run_id, "run_id": run_id, "key": key, "value": str(value)})
        return value

    def set_tag(self, run_id: str, key: str, value: Any) -> None:
        self.call("POST", "runs/set-tag", {"run_uuid": run_id, "run_id": run_id, "key": key, "value": str(value)})

    def log_batch(self, run_id: str, metrics: Sequence[Metric] = (), params: Sequence[Param] = (),
                  tags: Sequence[RunTag] = ()) -> None:
        """Split as ``MlflowClient.log_batch`` splits (100 params and 100 tags per call, metrics filling each
        call up to 1000 entities, the rest 1000 a call), so each call is within the server's limits."""
        if not (metrics or params or tags):
            return
        rest = list(metrics)
        batches: list[tuple[Sequence[Metric], Sequence[Param], Sequence[RunTag]]] = []
        for p_batch, t_batch in zip_longest(_chunks(list(params), MAX_PARAMS_TAGS_PER_BATCH),
                                            _chunks(list(tags), MAX_PARAMS_TAGS_PER_BATCH), fillvalue=[]):
            size = max(0, min(MAX_ENTITIES_PER_BATCH - len(p_batch) - len(t_batch), MAX_METRICS_PER_BATCH))
            batches.append((rest[:size], p_batch, t_batch))
            rest = rest[size:]
        batches += [(m_batch, [], []) for m_batch in _chunks(rest, MAX_METRICS_PER_BATCH)]
        for m_batch, p_batch, t_batch in batches:
            self.call("POST", "runs/log-batch", {
                "run_id": run_id,
                "metrics": [{"key": m.key, "value": _json_number(float(m.value)), "timestamp": int(m.timestamp),
                             "step": int(m.step)} for m in m_batch],
                "params": [{"key": p.key, "value": str(p.value)} for p in p_batch],
                "tags": [{"key": t.key, "value": str(t.value)} for t in t_batch]})

    def set_terminated(self, run_id: str, status: str | None = None, end_time: int | None = None) -> None:
        self.call("POST", "runs/update", {"run_uuid": run_id, "run_id": run_id, "status": status or "FINISHED",
                                          "end_time": end_time or int(time.time() * 1000)})

    # ------------------------------------------------------------------ what the register step calls

    def proxies_artifacts(self, run_id: str) -> bool:
        """Whether the run's artifacts go through this server (``mlflow-artifacts:/...``, ``mlflow server``'s default).

        Elsewhere (``s3://``, ``gs://``, a path on the server) MLflow's client writes them itself:
        the register step then uses it (:func:`components.steps.register.register`).
        """
        parts = urlsplit(self._artifact_uri(run_id))
        return parts.scheme == "mlflow-artifacts" and not parts.netloc

    def _artifact_uri(self, run_id: str) -> str:
        """The run's artifact URI, asked once per run (it never changes)."""
        if run_id not in self._artifact_uris:
            self._artifact_uris[run_id] = self.get_run(run_id).info.artifact_uri
        return self._artifact_uris[run_id]

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        root = urlsplit(self._artifact_uri(run_id)).path
        self.put_file(posixpath.join(root, artifact_path or "", Path(local_path).name), Path(local_path))

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str | None = None) -> None:
        """Every file under ``local_dir``, at the same relative place under ``artifact_path``, as MLflow walks it."""
        root = urlsplit(self._artifact_uri(run_id)).path
        base = Path(local_dir).resolve()
        for path in sorted(p for p in base.rglob("*") if p.is_file()):
            self.put_file(posixpath.join(root, artifact_path or "", path.relative_to(base).as_posix()), path)

    def create_registered_model(self, name: str) -> None:
        self.call("POST", "registered-models/create", {"name": name})

    def create_model_version(self, name: str, source: str, run_id: str, tags: Mapping[str, str],
                             await_creation_s: float = 300.0) -> ModelVersion:
        """A new version, awaited while the registry says ``PENDING_REGISTRATION``.

        At most 300 s, as MLflow's client.
        """
        obj = self.call("POST", "model-versions/create", {
            "name": name, "source": source, "run_id": run_id,
            "tags": [{"key": k, "value": str(v)} for k, v in tags.items()]})
        version = obj["model_version"]
        deadline = time.monotonic() + await_creation_s
        while version.get("status") == "PENDING_REGISTRATION" and time.monotonic() < deadline:
            time.sleep(1.0)
            version = self.call("GET", "model-versions/get",
                                {"name": name, "version": version["version"]})["model_version"]
        return ModelVersion(name=name, version=str(version["version"]), status=str(version.get("status", "")))

    def get_model_version_by_alias(self, name: str, alias: str) -> ModelVersion:
        """The version ``alias`` points at, with its tags; :class:`RestError` (404) when the alias is unset."""
        version = self.call("GET", "registered-models/alias", {"name": name, "alias": alias})["model_version"]
        return ModelVersion(name=name, version=str(version["version"]), status=str(version.get("status", "")),
                            run_id=str(version.get("run_id", "")),
                            tags={t["key"]: t.get("value", "") for t in version.get("tags", [])})

    def set_registered_model_alias(self, name: str, alias: str, version: str) -> None:
        self.call("POST", "registered-models/alias", {"name": name, "alias": alias, "version": str(version)})
