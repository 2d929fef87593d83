"""A stand-in Kubeflow Pipelines API server (v2beta1 REST) on 127.0.0.1, for the real ``kfp.Client``.

It answers what ``kfp.Client`` sends while it is constructed and in
``create_run_from_pipeline_package`` / ``get_run`` (read from kfp/client/client.py and the
generated ``kfp_server_api`` services), JSON over HTTP/1.1 as the KFP API server's gRPC gateway
writes it (snake_case field names, RFC 3339 times, errors as ``{"error", "code", "message",
"details"}`` with gRPC codes).

In full: docs/internals/stand-ins.md, "The KFP API stand-in".
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any

from standins.base import StandInHandler, StandInServer
from standins.base import utc_now as _now

# gRPC status codes the gateway maps to HTTP statuses.
INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, UNAUTHENTICATED = 3, 5, 7, 16
TERMINAL = {"SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"}
_EPOCH = "1970-01-01T00:00:00Z"


def error_body(code: int, message: str) -> dict[str, Any]:
    return {
        "error": message,
        "code": code,
        "message": message,
        "details": [{"@type": "type.googleapis.com/google.rpc.Status", "code": code, "message": message}],
    }


def _check_parameters(spec: dict[str, Any], parameters: dict[str, Any]) -> str | None:
    """The API server's check of runtime parameters against the root's input definitions."""
    declared = ((spec.get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {}
    for name, value in parameters.items():
        if name not in declared:
            return f"Invalid input error: input parameter {name} is not declared by the pipeline"
        ptype = declared[name].get("parameterType")
        ok = {
            "STRING": isinstance(value, str),
            "NUMBER_INTEGER": (isinstance(value, (int, float)) and not isinstance(value, bool)
                               and float(value).is_integer()),
            "NUMBER_DOUBLE": isinstance(value, (int, float)) and not isinstance(value, bool),
            "BOOLEAN": isinstance(value, bool),
            "LIST": isinstance(value, list),
            "STRUCT": isinstance(value, dict),
        }.get(ptype, True)
        if not ok:
            return f"Invalid input error: input parameter {name} requires type {ptype}, got {value!r}"
    for name, p in declared.items():
        if name not in parameters and "defaultValue" not in p and not p.get("isOptional"):
            return f"Invalid input error: input parameter {name} is required"
    return None


def _parse_pipeline_spec(body: Any) -> tuple[dict[str, Any] | None, str | None]:
    """``pipeline_spec`` as kfp sends it: the spec, or ``{"pipeline_spec", "platform_spec"}``."""
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    if not isinstance(body, dict):
        return None, "Invalid input error: pipeline_spec must be an object"
    spec = body.get("pipeline_spec") if "pipeline_spec" in body else body
    try:
        json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
        if "platform_spec" in body:
            json_format.ParseDict(body["platform_spec"], pipeline_spec_pb2.PlatformSpec())
    except json_format.ParseError as exc:
        return None, f"Invalid input error: failed to parse the pipeline spec: {exc}"
    return spec, None


class KFPAPIStandIn(StandInServer):
    """The stand-in KFP API server. Use as a context manager, or ``start()`` / ``close()``."""

    thread_name = "kfp-standin"

    def __init__(
        self,
        *,
        token: str | None = "kfp-standin-token",
        multi_user: bool = False,
        namespaces: Iterable[str] = ("kubeflow-user",),
        run_states: Iterable[str] = ("PENDING", "RUNNING", "SUCCEEDED"),
        tag_name: str = "2.5.0",
    ) -> None:
        super().__init__(token=token)
        self.multi_user = multi_user
        self.namespaces = set(namespaces)
        self.run_states = list(run_states)
        self.tag_name = tag_name
        self.experiments: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self._reads: dict[str, int] = {}
        self._lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _make_handler(self)

    # ------------------------------------------------------------------ state

    def set_run_state(self, run_id: str, state: str, error: str | None = None) -> None:
        with self._lock:
            self._set_state(self.runs[run_id], state, error)
            self._reads[run_id] = len(self.run_states)  # scripted states no longer apply

    def _set_state(self, run: dict[str, Any], state: str, error: str | None = None) -> None:
        if run["state"] == state:
            return
        now = _now()
        run["state"] = state
        run["state_history"].append({"update_time": now, "state": state})
        if state == "RUNNING" and run["scheduled_at"] == _EPOCH:
            run["scheduled_at"] = now
        if state in TERMINAL:
            run["finished_at"] = now
        if error:
            run["error"] = {"code": 2, "message": error, "details": []}

    def _experiment(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body.get("display_name") or ""
        if not name:
            return 400, error_body(INVALID_ARGUMENT, "Invalid input error: Experiment name is empty. "
                                   "Please specify a valid experiment name")
        namespace = body.get("namespace") or ""
        problem = self._namespace_problem(namespace, "CreateExperiment")
        if problem:
            return problem
        with self._lock:
            if any(e["display_name"] == name and e.get("namespace", "") == namespace
                   for e in self.experiments.values()):
                return 409, error_body(6, f"Already exist error: Failed to create a new experiment. "
                                          f"The name {name} already exists. Please specify a new name")
            exp = {
                "experiment_id": str(uuid.uuid4()),
                "display_name": name,
                "description": body.get("description") or "",
                "created_at": _now(),
                "namespace": namespace,
                "storage_state": "AVAILABLE",
                "last_run_created_at": _EPOCH,
            }
            self.experiments[exp["experiment_id"]] = exp
        return 200, exp

    def _namespace_problem(self, namespace: str, api: str) -> tuple[int, dict[str, Any]] | None:
        if not self.multi_user:
            if namespace:
                return 400, error_body(INVALID_ARGUMENT,
                                       f"Invalid input error: In single-user mode, {api} cannot filter by namespace.")
            return None
        if not namespace:
            return 400, error_body(INVALID_ARGUMENT,
                                   f"Invalid input error: In multi-user mode, {api} must filter by namespace.")
        if namespace not in self.namespaces:
            return 403, error_body(
                PERMISSION_DENIED,
                "Failed to authorize with API: PermissionDenied: User 'system:serviceaccount:kubeflow:pipeline-runner' "
                f"is not authorized with reason: namespace \"{namespace}\" not found (request: {{Namespace:{namespace} "
                "Verb:list Group:pipelines.kubeflow.org Resource:experiments}})",
            )
        return None

    def _create_run(self, body: Any, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict):
            return 400, error_body(INVALID_ARGUMENT, "Invalid input error: the run is not a JSON object")
        experiment_id = body.get("experiment_id") or query.get("experiment_id") or ""
        with self._lock:
            exp = self.experiments.get(experiment_id)
        if exp is None:
            return 404, error_body(NOT_FOUND, f"Failed to create a run: experiment {experiment_id} not found")
        if not body.get("display_name"):
            return 400, error_body(INVALID_ARGUMENT,
                                   "Invalid input error: The run name is empty. Please specify a valid name")
        if body.get("pipeline_spec") is None and body.get("pipeline_version_reference") is None:
            return 400, error_body(INVALID_ARGUMENT,
                                   "Invalid input error: Failed to create a run: pipeline spec or version is required")
        spec, problem = (_parse_pipeline_spec(body.get("pipeline_spec")) if body.get("pipeline_spec") is not None
                         else (None, None))
        if problem:
            return 400, error_body(INVALID_ARGUMENT, problem)
        runtime = body.get("runtime_config") or {}
        if spec is not None:
            problem = _check_parameters(spec, runtime.get("parameters") or {})
            if problem:
                return 400, error_body(INVALID_ARGUMENT, problem)
        now = _now()
        run = {
            "experiment_id": experiment_id,
            "run_id": str(uuid.uuid4()),
            "display_name": body["display_name"],
            "storage_state": "AVAILABLE",
            "description": body.get("description") or "",
            "pipeline_spec": copy.deepcopy(body.get("pipeline_spec")),
            "runtime_config": copy.deepcopy(runtime),
            "service_account": body.get("service_account") or "pipeline-runner",
            "created_at": now,
            "scheduled_at": _EPOCH,
            "finished_at": _EPOCH,
            "state": "PENDING",
            "state_history": [{"update_time": now, "state": "PENDING"}],
        }
        with self._lock:
            self.runs[run["run_id"]] = run
            self._reads[run["run_id"]] = 0
            exp["last_run_created_at"] = now
        return 200, copy.deepcopy(run)

    def _read_run(self, run_id: str) -> dict[str, Any] | None:
        with self._lock:
            run = self.runs.get(run_id)
            if run is None:
                return None
            n = self._reads[run_id]
            if n < len(self.run_states):
                self._set_state(run, self.run_states[n])
            self._reads[run_id] = n + 1
            return copy.deepcopy(run)


def _filter_match(obj: dict[str, Any], flt: str | None) -> bool:
    if not flt:
        return True
    for pred in json.loads(flt).get("predicates", []):
        op = pred.get("operation") or pred.get("op")
        value = pred.get("stringValue", pred.get("string_value"))
        key = pred.get("key")
        if op in ("EQUALS", 1) and obj.get(key) != value:
            return False
        if op in ("NOT_EQUALS", 2) and obj.get(key) == value:
            return False
    return True


def _make_handler(api: KFPAPIStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(StandInHandler):
        server_version = "ml-pipeline-standin/" + api.tag_name

        def _handle(self, method: str) -> None:
            parts, query, body, authorized = self._receive(api, method)
            if not authorized:
                return self._json(401, error_body(UNAUTHENTICATED,
                                                  "Unauthenticated: the request has no valid bearer token"))
            path = parts.path.rstrip("/")
            prefix = "/apis/v2beta1/"
            if not path.startswith(prefix):
                return self._json(404, error_body(NOT_FOUND, "Not Found"))
            rest = path[len(prefix):].split("/")
            if rest == ["healthz"] and method == "GET":
                return self._json(200, {"commit_sha": "0b0b0b0", "tag_name": api.tag_name, "multi_user": api.multi_user,
                                        "pipeline_store": "database"})
            if rest == ["experiments"]:
                if method == "POST":
                    return self._json(*api._experiment(body if isinstance(body, dict) else {}))
                namespace = query.get("namespace", "")
                problem = api._namespace_problem(namespace, "ListExperiment")
                if problem:
                    return self._json(*problem)
                with api._lock:
                    items = [copy.deepcopy(e) for e in api.experiments.values()
                             if e.get("namespace", "") == namespace and _filter_match(e, query.get("filter"))]
                out: dict[str, Any] = {"total_size": len(items)}
                if items:
                    out["experiments"] = items
                return self._json(200, out)
            if len(rest) == 2 and rest[0] == "experiments" and method == "GET":
                with api._lock:
                    exp = copy.deepcopy(api.experiments.get(rest[1]))
                if exp is None:
                    return self._json(404, error_body(NOT_FOUND,
                                                      f"Failed to get experiment: experiment {rest[1]} not found"))
                return self._json(200, exp)
            if rest == ["runs"]:
                if method == "POST":
                    return self._json(*api._create_run(body, query))
                with api._lock:
                    runs = [copy.deepcopy(r) for r in api.runs.values()
                            if not query.get("experiment_id") or r["experiment_id"] == query["experiment_id"]]
                return self._json(200, {"runs": runs, "total_size": len(runs)} if runs else {"total_size": 0})
            if len(rest) == 2 and rest[0] == "runs" and method == "GET":
                run = api._read_run(rest[1])
                if run is None:
                    return self._json(404, error_body(NOT_FOUND, f"Failed to get run: run {rest[1]} not found"))
                return self._json(200, run)
            return self._json(404, error_body(NOT_FOUND, "Not Found"))

    return Handler
