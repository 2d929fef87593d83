"""Argo's per-run spin-up and time to first step, from the exit handler's output parameters.

The exit handler (``close-record``) writes the record's ``spinup_s`` and ``time_to_first_step_s``
to its output parameters' files (``close --metric-file``); Argo emits them as the gauges
``llmpack_spinup_seconds`` and ``llmpack_time_to_first_step_seconds`` (the compiled template:
tests/backends/test_argo_backend.py). Locally the executor gives each output parameter a file of
the task's own under the workdir.
"""

from __future__ import annotations

from pathlib import Path

from argo_workflows.local import load_workflow, plan
from argo_workflows.workflow import RUN_METRICS
from components.record.close import write_metric_files

ROOT = Path(__file__).resolve().parents[2]


def test_measured_metrics_are_written_alone_and_unmeasured_ones_not_at_all(tmp_path: Path) -> None:
    metrics = {"spinup_s": 41.25, "time_to_first_step_s": None, "total_s": 99.0}
    specs = [f"{key}={tmp_path / 'p' / key}" for key in ("spinup_s", "time_to_first_step_s", "missing_s")]
    write_metric_files(metrics, specs)
    assert float((tmp_path / "p" / "spinup_s").read_text()) == 41.25
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["spinup_s"]  # no temporary file left either


def test_a_metric_file_that_cannot_be_written_is_a_warning_not_a_failure(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    write_metric_files({"spinup_s": 1.0}, [f"spinup_s={tmp_path / 'file' / 'under-a-file'}"])
    assert "could not write spinup_s" in capsys.readouterr().err


def test_the_local_executor_gives_the_exit_handlers_output_parameters_files(tmp_path: Path) -> None:
    _, on_exit = plan(load_workflow(ROOT / "argo_workflows" / "finetune.yaml"), {}, tmp_path)
    assert on_exit is not None
    command = on_exit.command(0)
    for name, (key, _) in RUN_METRICS.items():
        assert f"--metric-file={key}={tmp_path / on_exit.name / 'parameters' / name}" in command
