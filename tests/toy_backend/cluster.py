"""``toyc``: the toy as a *cluster* backend, declared in this folder against :mod:`components.backend` only.

Registered with one line, ``LLMPACK_BACKENDS=toyc+cluster=tests.toy_backend.cluster``, it gets
``llmpack submit toyc`` (its ``--host``, the stand-in server of :mod:`tests.toy_backend.server`),
``llmpack compile`` writes its plan, a ``compare --cluster`` path, and the pod watcher recognises
its pods by their ``toy.example/run`` label and keeps that label, and ``llmpack doctor --path toyc``
checks its RBAC, compiled pods and server: everything ``llmpack`` asks of it is a field or a method here.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.backend import (
    TLS_OPTIONS,
    ClickOption,
    ClusterBackend,
    ClusterPath,
    LabFacts,
    PodMarks,
    ServerConnection,
    SubmitRequest,
    pod_labels,
)
from components.dsl import Pipeline
from components.errors import InputError
from components.servers.submission import new_id
from tests.toy_backend.backend import plan

ARTIFACT = Path("toyc/finetune.json")
RUN_LABEL = "toy.example/run"  # the toy orchestrator's own mark on its pods: its run id


def _call(method: str, url: str, body: dict[str, Any] | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 - the user's --host
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise InputError(f"toyc server at {url}: HTTP {exc.code}") from None
    except OSError as exc:
        raise InputError(f"toyc server at {url}: {type(exc).__name__}") from None


@dataclass(frozen=True, kw_only=True)
class ToyRequest(SubmitRequest):
    """A run of the toy plan: the shared fields and the toy server's own."""

    host: str | None = None
    plan_path: str | None = None


class ToyClusterBackend(LabFacts, ClusterBackend):
    name = "toyc"
    artifacts = (ARTIFACT,)
    connection_type = ServerConnection
    submit_help = "Send the toy plan to the toy server (--host)."
    cluster_path = ClusterPath(name="toyc", artifact_option="plan_path", artifact_path=ARTIFACT.as_posix(),
                               submit_options=("host", "plan_path", *TLS_OPTIONS), wait_options=("host", *TLS_OPTIONS))
    pod_marks = PodMarks(run_labels=(RUN_LABEL,), workflow_labels=(RUN_LABEL,))

    def compile(self, pipe: Pipeline, out_dir: Path, *, final_dir: Path | None = None) -> list[Path]:
        path = out_dir / ARTIFACT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(plan(pipe), indent=2) + "\n")
        return [path]

    def submit_options(self) -> list[ClickOption]:
        import click

        return [click.option("--host", default=None, help="The toy server's URL."),
                click.option("--plan", "plan_path", default=None, help="Compiled plan (default: compiled now).")]

    def check_connection(self, options: Mapping[str, Any]) -> None:
        if not options.get("host"):
            raise InputError("--host: the toy server's URL is required")

    def request(self, options: Mapping[str, Any]) -> ToyRequest:
        return ToyRequest.of(options)

    def submit_run(self, request: SubmitRequest) -> dict[str, Any]:
        assert isinstance(request, ToyRequest)
        host, plan_path, params = request.host, request.plan_path, request.params
        run_group, pipeline_run = request.run_group, request.pipeline_run
        self.check_connection({"host": host})
        if plan_path:
            body = json.loads(Path(plan_path).read_text())
        else:
            from components.finetune_pipeline import build

            body = plan(build())
        run_group, pipeline_run = run_group or new_id("rg"), pipeline_run or new_id("toyc")
        answer = _call("POST", f"{host}/api/runs", {"plan": body, "params": dict(params or {}),
                                                    "run_group": run_group, "pipeline_run": pipeline_run})
        return {"orchestrator": self.name, "run_group": run_group, "pipeline_run": pipeline_run,
                "server_id": answer["id"], "host": host, "parameters": dict(params or {})}

    def wait_for_completion(self, summary: Mapping[str, Any], *, host: str | None = None, timeout_s: float = 0,
                            **_: Any) -> dict[str, Any]:
        state = _call("GET", f"{host or summary['host']}/api/runs/{summary['server_id']}")["state"]
        return {"status": "succeeded" if state == "Succeeded" else "failed", "state": state}

    def stop_hint(self, summary: Mapping[str, Any]) -> str:
        return f"DELETE {summary.get('host')}/api/runs/{summary.get('server_id')}"

    def recognise_pod(self, pod: Mapping[str, Any]) -> bool:
        return RUN_LABEL in pod_labels(pod)


BACKEND = ToyClusterBackend()
