"""One record, whoever starts the run: the rules every path applies to its pipeline record.

``llmpack run``, the compiled summarizing tasks and ``llmpack sync`` each log a pipeline record;
these functions make those records comparable: every parameter with the values the run resolved
(:func:`record_params`), the run's mode (:func:`effective_mode`), metrics measured from submit named
for what they were measured from (:func:`name_from_submit`), an orchestrator's own MLflow run as
cross-link tags (:func:`foreign_run_tags`), the scalars KFP's UI compares (:func:`headline`,
:func:`read_scalars`) and the training-loss curve (:func:`loss_curve`). Import-light (stdlib only).
Each rule: docs/internals/record-internals.md and docs/internals/record.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from components.commands import format_value

# Parameters ``mlflow run`` logs on its own run for the project's ``main`` entry point.
MLFLOW_PROJECT_PARAMS = ("artifacts_dir", "base_dir")

# Metrics measured from the submit instant (docs/telemetry-and-cost.md).
FROM_SUBMIT = ("spinup_s", "time_to_first_step_s", "total_s", "pipeline_overhead_s", "gang_ready_s")
# Submit-time sources that are the submit instant itself (close.resolve_submit_time).
SUBMIT_INSTANTS = ("client", "orchestrator")

LOSS_CURVE = "train_loss"
TRAIN_LOG = "train_log.jsonl"
IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"  # Kubernetes sets it in every pod (components.servers.kube)


def record_params(values: Mapping[str, Any], *, run_group: str, pipeline_run: str,
                  submitted_at: float) -> dict[str, str]:
    """The record's parameters: every pipeline parameter in ``values``, the run's identity as resolved."""
    params = {name: format_value(value) for name, value in values.items()}
    params.update(run_group=run_group, pipeline_run=pipeline_run, submitted_at=repr(float(submitted_at)))
    return params


AUTO_MODE = "auto"  # a package's compiled default where its own local runner passes no mode: decided in the step


def effective_mode(mode: str, env: Mapping[str, str] | None = None) -> str:
    """``auto`` is ``cluster`` inside a Kubernetes pod and ``local`` outside; any other mode as given.

    A backend whose orchestrator also runs the same package on this machine with its compiled
    defaults (KFP's ``kfp.local``) compiles ``mode=auto``; the others compile ``cluster``, and a
    step told ``cluster`` outside a pod must still refuse to log to a sqlite file
    (:func:`components.record.tracking.require_cluster_uri`).
    """
    env = os.environ if env is None else env
    if mode != AUTO_MODE:
        return mode
    return "cluster" if env.get(IN_CLUSTER_ENV) else "local"


def name_from_submit(metrics: Mapping[str, float | None], source: str) -> dict[str, float | None]:
    """Metrics measured from submit renamed ``<name>_from_<source>_s`` unless ``source`` is a submit instant."""
    if source in SUBMIT_INSTANTS or source == "none":  # none: nothing measured from submit at all
        return dict(metrics)
    return {(f"{key[:-2]}_from_{source}_s" if key in FROM_SUBMIT else key): value for key, value in metrics.items()}


def loss_curve(root: str | os.PathLike[str] | None) -> list[tuple[int, float]]:
    """``(step, loss)`` of the run's training log under ``root`` (the newest file when several), [] without one.

    A resumed run appends to the same file, so a step logged twice keeps its last loss.
    """
    if root is None or not Path(root).is_dir():
        return []
    files = sorted(Path(root).rglob(TRAIN_LOG), key=lambda p: p.stat().st_mtime)
    return _points(files[-1:]) if files else []


def _points(files: Iterable[Path]) -> list[tuple[int, float]]:
    points: dict[int, float] = {}
    for path in files:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
                points[int(row["step"])] = float(row["loss"])
            except (ValueError, KeyError, TypeError):
                continue  # a killed run's last line may be cut short
    return sorted(points.items())


# The headline numbers a KFP run's comparison view shows (the summarizing task's Output[Metrics] scalars).
HEADLINE = ("final_loss", "eval_loss", "base_eval_loss", "perplexity", "base_exact_match", "tuned_exact_match",
            "tokens_per_s", "train_s", "mfu",
            "spinup_s", "time_to_first_step_s", "total_s", "spinup_from_first_pod_s",
            "time_to_first_step_from_first_pod_s", "total_from_first_pod_s", "gpu_hours", "cost_usd", "goodput")
SCALARS_FILE = "scalars.json"


def headline(metrics: Mapping[str, float | None], step_metrics: Mapping[str, float]) -> dict[str, float]:
    """The run's headline numbers that have a value: the derived ``metrics``, ``final_loss`` from finetune's own."""
    merged = {**{k: v for k, v in step_metrics.items() if k == "final_loss"}, **metrics}
    return {k: float(merged[k]) for k in HEADLINE if isinstance(merged.get(k), (int, float))}


def read_scalars(directory: str | os.PathLike[str]) -> dict[str, float]:
    """Top-level numbers (not booleans) of the JSON files in ``directory``: a KFP ``Output[Metrics]``'s scalars.

    The KFP components call it after the step (or the summarizing task) ran, and log each with
    ``Metrics.log_metric``: KFP keeps them as the artifact's ``system.Metrics`` metadata, which its
    UI's run comparison shows. Non-finite values are left out (not valid in that metadata).
    """
    import math

    out: dict[str, float] = {}
    for path in sorted(Path(directory).glob("*.json")) if Path(directory).is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key, value in data.items() if isinstance(data, dict) else ():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                out.setdefault(key, float(value))
    return out


# An MLflow run the orchestrator injected into the step's environment (KFP 2.17's MLflow plugin,
# KEP-12862, injects the task's own nested run, in its own experiment): linked, never logged to.
INJECTED_RUN_TAG = "llmpack.injected_mlflow_run_id"
INJECTED_EXPERIMENT_TAG = "llmpack.injected_mlflow_experiment_id"


def foreign_run_tags(orchestrator_run_id: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Cross-links to the MLflow run the environment names (``MLFLOW_RUN_ID``) when it is not the run's own
    orchestrator run (KFP's MLflow plugin injects its own into every step); {} when none is named.

    Inside ``mlflow run`` the same variables name the run ``mlflow run`` created, which is the
    orchestrator's run (``orchestrator_run_id``) and which the driver links itself.
    """
    env = os.environ if env is None else env
    if not env.get("MLFLOW_RUN_ID") or env["MLFLOW_RUN_ID"] == orchestrator_run_id:
        return {}
    tags = {INJECTED_RUN_TAG: env["MLFLOW_RUN_ID"]}
    if env.get("MLFLOW_EXPERIMENT_ID"):
        tags[INJECTED_EXPERIMENT_TAG] = env["MLFLOW_EXPERIMENT_ID"]
    return tags
