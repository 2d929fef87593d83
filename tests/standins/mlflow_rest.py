"""A stand-in MLflow tracking server: the REST endpoints a step process's record uses, in memory, on 127.0.0.1.

For the checks a real ``mlflow server`` cannot make quickly or at all: which ``Authorization``
header arrived (Basic or Bearer), TLS with a self-signed certificate and client certificates, a
server that answers 503 a few times first, and the size of every ``runs/log-batch`` call. The
record itself is checked against a real ``mlflow server`` (tests/components/test_rest.py, slow).
"""

from __future__ import annotations

import re
import ssl
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from standins.base import RecordedRequest, StandInHandler, StandInServer

_TAG_TERM = re.compile(r"tags\.`([^`]+)`\s*=\s*'([^']*)'")


@dataclass
class MlflowRequest(RecordedRequest):
    """A recorded request, with the ``Authorization`` header's scheme only (never its credentials)."""

    auth_scheme: str = ""
    auth_value: str = field(default="", repr=False)


class MlflowRestStandIn(StandInServer):
    """``api/2.0/mlflow/...``: experiments, runs, params, metrics, tags, all in memory.

    ``authorization``: the exact header value required (None: none needed); ``fail_next``: statuses
    answered, in order, to the next requests before any is served.
    """

    thread_name = "mlflow-standin"
    request_type = MlflowRequest

    def __init__(self, *, authorization: str | None = None, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(token=None, tls=tls)
        self.authorization = authorization
        self.fail_next: list[int] = []
        self.experiments: dict[str, str] = {}
        self.runs: dict[str, dict[str, Any]] = {}

    def handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(StandInHandler):
            def _handle(self, method: str) -> None:
                header = self.headers.get("Authorization") or ""
                parts, query, body, _ = self._receive(api, method)
                recorded = api.requests[-1]
                assert isinstance(recorded, MlflowRequest)
                recorded.auth_scheme, recorded.auth_value = header.partition(" ")[0], header
                if api.authorization is not None and header != api.authorization:
                    return self._json(401, {"error_code": "UNAUTHENTICATED", "message": "credentials refused"})
                if api.fail_next:
                    return self._json(api.fail_next.pop(0),
                                      {"error_code": "TEMPORARILY_UNAVAILABLE", "message": "busy"})
                code, obj = api.answer(method, parts.path.removeprefix("/api/2.0/mlflow/"),
                                       query if method == "GET" else body)
                self._json(code, obj)

        return Handler

    def answer(self, method: str, endpoint: str, req: Any) -> tuple[int, dict[str, Any]]:
        req = req or {}
        if endpoint == "experiments/get-by-name":
            name = req.get("experiment_name", "")
            if name not in self.experiments:
                return 404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": f"no experiment {name!r}"}
            return 200, {"experiment": {"experiment_id": self.experiments[name], "name": name}}
        if endpoint == "experiments/create":
            self.experiments[req["name"]] = str(len(self.experiments) + 1)
            return 200, {"experiment_id": self.experiments[req["name"]]}
        if endpoint == "runs/search":
            wanted = dict(_TAG_TERM.findall(req.get("filter", "")))
            found = [r for r in self.runs.values() if r["info"]["experiment_id"] in req.get("experiment_ids", [])
                     and all(r["tags"].get(k) == v for k, v in wanted.items())]
            return 200, ({"runs": [self._run(r) for r in found[: int(req.get("max_results", 1000))]]} if found else {})
        if endpoint == "runs/create":
            run_id = uuid.uuid4().hex
            self.runs[run_id] = {"info": {"run_id": run_id, "experiment_id": req["experiment_id"], "status": "RUNNING",
                                          "start_time": req.get("start_time"),
                                          "artifact_uri": f"mlflow-artifacts:/{run_id}"},
                                 "tags": {t["key"]: t["value"] for t in req.get("tags", [])}, "params": {},
                                 "metrics": {}}
            return 200, {"run": self._run(self.runs[run_id])}
        run = self.runs.get(req.get("run_id", ""))
        if run is None:
            return 404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such run"}
        if endpoint == "runs/get":
            return 200, {"run": self._run(run)}
        if endpoint == "runs/log-parameter":
            run["params"][req["key"]] = req["value"]
        elif endpoint == "runs/set-tag":
            run["tags"][req["key"]] = req["value"]
        elif endpoint == "runs/log-batch":
            if len(req.get("metrics", [])) > 1000 or len(req.get("params", [])) > 100 or len(req.get("tags", [])) > 100:
                return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "batch over MLflow's limits"}
            run["params"].update({p["key"]: p["value"] for p in req.get("params", [])})
            run["tags"].update({t["key"]: t["value"] for t in req.get("tags", [])})
            run["metrics"].update({m["key"]: m for m in req.get("metrics", [])})
        elif endpoint == "runs/update":
            run["info"].update(status=req["status"], end_time=req.get("end_time"))
        else:
            return 404, {"error_code": "ENDPOINT_NOT_FOUND", "message": endpoint}
        return 200, {}

    @staticmethod
    def _run(run: dict[str, Any]) -> dict[str, Any]:
        return {"info": run["info"], "data": {
            "metrics": list(run["metrics"].values()),
            "params": [{"key": k, "value": v} for k, v in run["params"].items()],
            "tags": [{"key": k, "value": v} for k, v in run["tags"].items()]}}
