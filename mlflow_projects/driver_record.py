"""The MLflow record of a generated project's ``main`` run (:mod:`mlflow_projects.driver`): the run ``mlflow run``
made, the llmpack record it is or links to, and both closed with the record's status. MLflow is imported
inside the functions (the first step starts before it: :mod:`mlflow_projects.first_step`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.redaction import redact_text


def close_open_children(mc: Any, parent: Any, status: str) -> None:
    """End every step run of ``parent`` still RUNNING: a signal can land between a step's run being
    created and the code that would end it (or while MLflow cancels the step), and no run may be
    left RUNNING after ``main``."""
    try:
        runs = mc.search_runs([parent.info.experiment_id],
                              f"tags.mlflow.parentRunId = '{parent.info.run_id}' and attributes.status = 'RUNNING'")
        for run in runs:
            mc.set_terminated(run.info.run_id, status)
    except Exception as exc:  # noqa: BLE001 - the record itself still closes
        print(redact_text(f"llmpack: warning: could not close the step runs of {parent.info.run_id} ({exc})"),
              file=sys.stderr)


def bind_record(mc: Any, parent: Any, spec: Mapping[str, Any], values: Mapping[str, str], run_dir: Path) -> Any:
    """The pipeline run's record: ``parent`` itself when it lives in the llmpack experiment, else a run opened there.

    ``llmpack`` runs and submits the project into the llmpack experiment (``LLMPACK_EXPERIMENT``), so
    there the run ``mlflow run`` created is the record. A plain ``mlflow run`` puts its run in
    ``Default`` (or whatever ``--experiment-name`` says), and MLflow cannot move a run: the record
    is then opened in the llmpack experiment, as every other path opens it, starting when
    ``parent`` started; the two link to each other (tags ``llmpack.record_run_id`` and
    ``llmpack.mlflow_run_id``) and the steps' child runs hang under the record.
    """
    from mlflow.entities import RunTag

    from components.record import tracking

    tags = {"llmpack.pipeline": spec["pipeline"], "llmpack.pipeline_run": values["pipeline_run"],
            "llmpack.run_group": values["run_group"], "llmpack.orchestrator": values["orchestrator"],
            "llmpack.mode": values["mode"], "llmpack.artifacts": str(run_dir)}
    if parent.info.experiment_id == tracking.experiment_id(mc):
        mc.log_batch(parent.info.run_id,
                     tags=[RunTag(k, v) for k, v in {tracking.RECORD_TAG: "pipeline", **tags}.items()])
        return parent
    ctx = record_context(values, parent.info.start_time / 1000.0)
    record_id = tracking.open_pipeline_run(mc, ctx, {**tags, "llmpack.mlflow_run_id": parent.info.run_id,
                                                      "llmpack.mlflow_experiment_id": parent.info.experiment_id})
    mc.log_batch(parent.info.run_id,
                 tags=[RunTag(k, v) for k, v in {**tags, "llmpack.record_run_id": record_id}.items()])
    print(f"llmpack: the run's record is run {record_id} in experiment {tracking.experiment_name()!r} "
          f"(this MLflow run, in experiment {parent.info.experiment_id}, links to it)", file=sys.stderr, flush=True)
    return mc.get_run(record_id)


def record_context(values: Mapping[str, str], started: float) -> Any:
    """The record's identity for :func:`bind_record`, opened at the parent run's start (its submit instant)."""
    from components.record.telemetry import RunContext

    return RunContext(run_group=values["run_group"], pipeline_run=values["pipeline_run"],
                      orchestrator=values["orchestrator"], mode=values["mode"], submitted_at=started)


def end_linked(mc: Any, shell: Any, record: Any, status: str) -> None:
    """End the run ``mlflow run`` created, when it is not the record itself, with the record's status.

    Ended here, ``mlflow run`` leaves it as it is (it only ends runs still RUNNING); so an
    interrupted run ends KILLED, not the FAILED MLflow would write.
    """
    if shell.info.run_id != record.info.run_id:
        try:
            mc.set_terminated(shell.info.run_id, status)
        except Exception as exc:  # noqa: BLE001 - the record itself is closed
            print(f"llmpack: warning: could not end MLflow run {shell.info.run_id} ({exc})", file=sys.stderr)


def set_up(spec: Mapping[str, Any], values: Mapping[str, str], run_dir: Path) -> tuple[Any, Any, bool, Any]:
    """Under ``mlflow run``, beside the early steps: MLflow's import, the run it made, the record."""
    import mlflow

    shell, owned = open_parent(os.environ.get("MLFLOW_EXPERIMENT_ID"))
    mc = mlflow.MlflowClient()
    return mc, shell, owned, bind_record(mc, shell, spec, values, run_dir)  # the record: `shell`, or linked to it


def open_parent(experiment_hint: str | None) -> tuple[Any, bool]:
    """The run ``mlflow run`` created for main, or a new one when main.py runs by hand."""
    import mlflow

    mc = mlflow.MlflowClient()
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if run_id:
        return mc.get_run(run_id), False
    from components.record import tracking

    # by hand there is no `mlflow run` experiment to keep: the run is made where the record lives, and is it
    run = mc.create_run(experiment_hint or tracking.experiment_id(mc), tags={"mlflow.source.type": "PROJECT",
                                                      "mlflow.project.entryPoint": "main"})
    return run, True
