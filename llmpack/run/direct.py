"""The ``direct`` path: every step as a plain subprocess on this machine, in DAG order.

It is the reference the orchestrators are compared against: no orchestrator, just the steps.
A step that crashes is retried per its spec (backoff capped at 1 s; bad input, exit 2, is not
retried); each attempt is told its number in ``LLMPACK_ATTEMPT`` so that its records are its own
and every attempt is billed (:mod:`components.record.telemetry`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from components import settings
from components.backend import Backend, Coloured
from components.commands import format_value, run_logged, step_args, task_params
from components.dsl import OutputRef, Pipeline
from components.errors import RunFailed
from components.record.close import CLOSE_TASK, gpu_uses, record_args, uses_json


def run_local(pipe: Pipeline, values: Mapping[str, Any], workdir: Path, env: Mapping[str, str],
              log: IO[str] | None = None) -> dict[str, Path]:
    """Run the pipeline, then its summarizing task; returns the artifact directories as ``{"task.output": path}``."""
    status = "Failed"
    try:
        artifacts = _run_steps(pipe, values, workdir, env)
        status = "Succeeded"
    except KeyboardInterrupt:
        status = "Canceled"
        raise
    finally:
        close = record_args(status=status, uses=uses_json(gpu_uses(pipe)), run_id="", created_at="",
                            params={k: format_value(values[k]) for k in pipe.all_params}, fuse=pipe.fuse)
        run_logged([sys.executable, *close], env=env, log_path=workdir / "logs" / f"{CLOSE_TASK}.log")
    if log is not None:
        print(f"direct: {len(pipe.tasks)} step{'' if len(pipe.tasks) == 1 else 's'} done in {workdir}", file=log)
    return artifacts


def _run_steps(pipe: Pipeline, values: Mapping[str, Any], workdir: Path, env: Mapping[str, str]) -> dict[str, Path]:
    artifacts: dict[str, Path] = {}
    for task in pipe.task_order():
        inputs = {
            name: str(artifacts[f"{ref.task}.{ref.output}"])
            for name, ref in task.arguments.items()
            if isinstance(ref, OutputRef)
        }
        outputs = {name: workdir / task.name / name for name in task.step.outputs}
        cmd = [sys.executable, *step_args(task, inputs=inputs, outputs={k: str(v) for k, v in outputs.items()},
                                          params=task_params(task, values))]
        retry = task.step.execution.retry
        for attempt in range(retry.limit + 1):
            rc, last = run_logged(cmd, env={**env, settings.ATTEMPT.name: str(attempt)},
                                  log_path=workdir / "logs" / f"{task.name}.log")
            if rc == 0:
                break
            if rc == 2 or attempt == retry.limit:  # bad input is not retried
                raise RunFailed(task.name, last)
            time.sleep(min(retry.backoff_s * retry.factor**attempt, retry.max_backoff_s, 1.0))
        for name, path in outputs.items():
            artifacts[f"{task.name}.{name}"] = path
    return artifacts


class DirectBackend(Coloured, Backend):
    """``direct``: local only, nothing to compile (the reference path)."""

    name = "direct"
    colour = "#7f7f7f"

    def run_local(self, pipe: Pipeline, values: Mapping[str, Any], workdir: Path, env: Mapping[str, str],
                  log: IO[str] | None = None) -> dict[str, Path]:
        return run_local(pipe, values, workdir, env, log)


BACKEND = DirectBackend()
