"""The ``mlflow`` local path: compile the pipeline to an MLflow project and ``mlflow run`` it.

Same contract as :func:`llmpack.run.direct.run_local`. The project is generated from ``pipe`` into
``workdir/project`` (so a pipeline with an extra step runs that step too) and run as a user runs
it: the ``mlflow run ... -e main --env-manager local -P k=v ...`` command line, as a subprocess,
its output in ``workdir/logs/mlflow.log``. MLflow creates the parent run and one child run per
step. The parent is the pipeline run's record the llmpack client opened (``mlflow run
--run-id``), so the run id MLflow prints is the record, as with a plain ``mlflow run``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from components import settings
from components.commands import format_value, last_error_line, run_logged
from components.dsl import Pipeline
from components.errors import InputError, RunFailed
from mlflow_projects.compiler import write_local_project
from mlflow_projects.driver import STATUS_FILE

# Variables that would make `mlflow run` join some other run or experiment than the one we name.
_FOREIGN_ENV = ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_PARENT_RUN_ID")


def mlflow_command() -> list[str]:
    """The ``mlflow`` CLI of this interpreter's environment."""
    beside = Path(sys.executable).with_name("mlflow")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("mlflow")
    return [found] if found else [sys.executable, "-m", "mlflow"]


def record_run_id(env: Mapping[str, str], pipeline_run: str) -> str | None:
    """The MLflow run the client opened as this pipeline run's record, if any."""
    from components.record import tracking

    return tracking.find_pipeline_run(tracking.client(env.get("MLFLOW_TRACKING_URI")), pipeline_run)


def experiment_id(env: Mapping[str, str]) -> str:
    """The llmpack experiment, created as :func:`components.record.tracking.experiment_id` creates it.

    Created here, before ``mlflow run``, because MLflow would otherwise create it with its
    artifacts under the current directory (``./mlruns``) instead of beside the tracking database.
    """
    from components.record import tracking

    mc = tracking.client(env.get("MLFLOW_TRACKING_URI"))
    try:
        return tracking.experiment_id(mc, env.get(settings.EXPERIMENT.name, tracking.DEFAULT_EXPERIMENT))
    except Exception as exc:  # noqa: BLE001 - MLflow's error for a store it cannot reach: one line
        if isinstance(exc, InputError):
            raise
        raise InputError(f"the mlflow path needs its tracking store ({type(exc).__name__} from "
                         f"{tracking.redact_uri(tracking.tracking_uri(env.get('MLFLOW_TRACKING_URI')))}): `mlflow run` "
                         "records each step there; start it, or run --backend direct (it records offline and "
                         "`llmpack sync` sends later)") from None


def run_local(
    pipe: Pipeline, values: Mapping[str, Any], workdir: Path, env: Mapping[str, str], log: IO[str] | None = None
) -> dict[str, Path]:
    """Run the pipeline with ``mlflow run``; returns the artifact directories as ``{"task.output": path}``."""
    workdir = Path(workdir).resolve()
    project = write_local_project(pipe, workdir / "project")
    artifacts = workdir / "artifacts"
    run_env = {k: v for k, v in env.items() if k not in _FOREIGN_ENV}
    # MLproject commands say `python`: make that this interpreter, as an activated venv would.
    bindir = str(Path(sys.executable).parent)
    run_env["PATH"] = os.pathsep.join(
        [bindir, *(p for p in run_env.get("PATH", os.defpath).split(os.pathsep) if p != bindir)])
    cmd = [
        *mlflow_command(), "run", str(project),
        "-e", "main",
        "--env-manager", "local",
        "--experiment-id", experiment_id(run_env),
    ]
    record = record_run_id(run_env, str(values.get("pipeline_run") or "")) if values.get("pipeline_run") else None
    cmd += ["--run-id", record] if record else ["--run-name", f"{values.get('pipeline_run') or pipe.name}-main"]
    for name in pipe.all_params:
        cmd += ["-P", f"{name}={format_value(values[name])}"]
    cmd += ["-P", f"artifacts_dir={artifacts}"]
    if log is not None:
        print(f"mlflow: mlflow run {project} -e main --env-manager local ({len(pipe.tasks)} steps)", file=log)
    log_path = workdir / "logs" / "mlflow.log"
    rc, last = run_logged(cmd, env=run_env, log_path=log_path, cwd=workdir)
    status = _status(artifacts)
    if rc != 0:
        if status.get("failed_step"):
            raise RunFailed(status["failed_step"], status.get("error") or last)
        raise RunFailed("main", _failure_line(log_path.read_text(encoding="utf-8", errors="replace")))
    run_dir = Path(status["run_dir"]) if status.get("run_dir") else artifacts / str(values["pipeline_run"])
    if log is not None:
        print(f"mlflow: {len(pipe.tasks)} step{'' if len(pipe.tasks) == 1 else 's'} done in {run_dir}", file=log)
    return {f"{task.name}.{name}": run_dir / task.name / name
            for task in pipe.task_order() for name in task.step.outputs}


_MLFLOW_LOG_LINE = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARNING|ERROR) mlflow")


def _failure_line(text: str) -> str:
    """Why ``mlflow run`` failed before main.py ran a step: skip MLflow's own ``=== ... ===`` lines."""
    from components.redaction import redact_text

    if "llmpack: error:" in text:
        return redact_text(last_error_line(text))
    lines = [line for line in text.splitlines() if line.strip() and not _MLFLOW_LOG_LINE.match(line)]
    return redact_text(last_error_line("\n".join(lines)) if lines else last_error_line(text))


def _status(artifacts: Path) -> dict[str, Any]:
    """main.py's summary of the run (``llmpack-mlflow-run.json``), or {} when it never got that far."""
    found = sorted(artifacts.glob(f"*/{STATUS_FILE}"), key=lambda p: p.stat().st_mtime)
    if not found:
        return {}
    try:
        return json.loads(found[-1].read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
