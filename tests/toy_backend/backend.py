"""``toy``: a fourth backend written only against :mod:`components` and its contract, :mod:`components.backend`.

It proves that an orchestrator is one folder plus one registry line: registered with
``LLMPACK_BACKENDS=toy=tests.toy_backend.backend``, it is compiled by ``llmpack compile`` (a small
JSON of the DAG, ``toy/finetune.json``) and run by ``llmpack run``/``llmpack compare``: each task's
command as a subprocess, in the order of that JSON, then the record's closing task. Local only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from components.backend import Backend
from components.commands import format_value, run_logged, step_args, task_params
from components.dsl import OutputRef, Pipeline
from components.errors import RunFailed
from components.params import TELEMETRY_PARAMS
from components.record.close import CLOSE_TASK, gpu_uses, record_args, uses_json

ARTIFACT = Path("toy/finetune.json")


def plan(pipe: Pipeline) -> dict[str, Any]:
    """The toy's compiled form: the tasks in DAG order, each with the outputs it reads."""
    return {"pipeline": pipe.name, "tasks": [
        {"name": t.name, "step": t.step.name,
         "inputs": {k: f"{ref.task}.{ref.output}" for k, ref in t.arguments.items() if isinstance(ref, OutputRef)},
         "outputs": sorted(t.step.outputs)}
        for t in pipe.task_order()]}


class ToyBackend(Backend):
    name = "toy"
    artifacts = (ARTIFACT,)

    def compile(self, pipe: Pipeline, out_dir: Path, *, final_dir: Path | None = None) -> list[Path]:
        path = out_dir / ARTIFACT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(plan(pipe), indent=2) + "\n")
        return [path]

    def run_local(self, pipe: Pipeline, values: Mapping[str, Any], workdir: Path, env: Mapping[str, str],
                  log: IO[str] | None = None) -> dict[str, Path]:
        artifacts: dict[str, Path] = {}
        status = "Failed"
        try:
            for spec in plan(pipe)["tasks"]:
                task = pipe.tasks[spec["name"]]
                outputs = {name: workdir / task.name / name for name in spec["outputs"]}
                inputs = {k: str(artifacts[ref]) for k, ref in spec["inputs"].items()}
                cmd = [sys.executable, *step_args(task, inputs=inputs, outputs={k: str(v) for k, v in outputs.items()},
                                                  params=task_params(task, values))]
                rc, last = run_logged(cmd, env=dict(env), log_path=workdir / "logs" / f"{task.name}.log")
                if rc != 0:
                    raise RunFailed(task.name, last)
                artifacts.update({f"{task.name}.{k}": v for k, v in outputs.items()})
            status = "Succeeded"
        finally:
            close = record_args(status=status, uses=uses_json(gpu_uses(pipe)), run_id="", created_at="",
                                params={k: format_value(values[k]) for k in TELEMETRY_PARAMS})
            run_logged([sys.executable, *close], env=dict(env), log_path=workdir / "logs" / f"{CLOSE_TASK}.log")
        return artifacts


BACKEND = ToyBackend()
