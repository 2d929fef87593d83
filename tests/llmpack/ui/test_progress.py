"""Live progress read from a staging directory laid out as the steps leave it (no pipeline run)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from components.record.telemetry import EVENTS_FILE, EventLog, RunContext, make_record
from components.training.progress import PROGRESS_FILE, ProgressFile
from llmpack.ui.display import status_text
from llmpack.ui.progress import clock, current_step, read_train_progress

CTX = RunContext(run_group="rg-1", pipeline_run="kfp-1", orchestrator="kfp", mode="local", submitted_at=1000.0)
NOW = 2000.0


def _events(out: Path, step: str, **events: float) -> None:
    log = EventLog(out / EVENTS_FILE)
    for name, ts in events.items():
        log.append(make_record(CTX, "event", step, name, ts))


def _staging(root: Path) -> Path:
    """prepare_data finished; finetune running, its events and progress in its model directory (kfp-like nesting)."""
    _events(root / "prepare-data" / "dataset", "prepare_data", process_started=1001.0, finished=1002.0)
    model = root / "finetune" / "outputs" / "model"
    _events(model, "finetune", process_started=1003.0, model_loaded=1004.0)
    return model


def _progress(model: Path, **fields: object) -> None:
    state = {"step": 23, "max_steps": 60, "tokens_per_s": 1234.4, "eta_s": 15.0, "updated_at": NOW - 3.0, **fields}
    (model / PROGRESS_FILE).write_text(json.dumps(state))


def test_training_step_shows_k_of_n_tokens_per_s_and_eta(tmp_path: Path) -> None:
    _progress(_staging(tmp_path))
    # The ETA counts down from what the step wrote 3 s ago.
    assert current_step(tmp_path, now=NOW) == ("finetune 23/60 · 1,234 tok/s · ETA 0:12", 1)


def test_before_the_first_step_only_k_of_n(tmp_path: Path) -> None:
    _progress(_staging(tmp_path), step=0, tokens_per_s=None, eta_s=None)
    assert current_step(tmp_path, now=NOW) == ("finetune 0/60", 1)


def test_without_a_progress_file_the_step_and_steps_done(tmp_path: Path) -> None:
    model = _staging(tmp_path)
    assert current_step(tmp_path, now=NOW) == ("finetune · 1 task done", 1)
    (model / PROGRESS_FILE).write_text('{"step": 2')  # not a progress file (yet): never an error
    assert current_step(tmp_path, now=NOW) == ("finetune · 1 task done", 1)


def test_a_finished_training_step_no_longer_shows_its_progress(tmp_path: Path) -> None:
    model = _staging(tmp_path)
    _progress(model, step=60, eta_s=0.0)
    _events(model, "finetune", finished=1010.0)
    _events(tmp_path / "evaluate" / "metrics", "evaluate", process_started=1011.0)
    assert current_step(tmp_path, now=NOW) == ("evaluate · 2 tasks done", 2)


def test_clock() -> None:
    assert [clock(s) for s in (0, 12.4, -3, 754, 3723)] == ["0:00", "0:12", "0:00", "12:34", "1:02:03"]


def test_status_line_stays_on_one_80_column_line() -> None:
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(status_text("mlflow (10/10)", "finetune 1000/1000 · 123,456 tok/s · ETA 1:02:03", 1234.5, 78))
    console.print(status_text("kfp", "finetune 23/60 · 1,234 tok/s · ETA 0:12", 41.2, 78))
    console.print(status_text("a-very-long-label-for-a-comparison-run",
                              "finetune 1000/1000 · 123,456 tok/s · ETA 1:02:03", 9.0, 78))
    lines = console.export_text().splitlines()
    assert len(lines) == 3 and all(len(line) <= 78 for line in lines)  # 2 more: the spinner
    assert lines[1] == "kfp · finetune 23/60 · 1,234 tok/s · ETA 0:12 ·  41.2s"
    assert lines[2].endswith("…")


def test_progress_file_is_throttled_and_ends_on_the_last_step(tmp_path: Path) -> None:
    path = tmp_path / PROGRESS_FILE
    progress = ProgressFile(path, start_step=0, max_steps=5, every_s=3600)
    assert read_train_progress(path).step == 0  # type: ignore[union-attr]
    progress.update(1, 100, 1.0)
    progress.update(2, 200, 2.0)
    assert read_train_progress(path).step == 0, "written again within every_s"  # type: ignore[union-attr]
    progress.update(5, 500, 4.0)
    last = read_train_progress(path)
    assert last is not None and (last.step, last.max_steps, last.tokens_per_s, last.eta_s) == (5, 5, 125.0, 0.0)
    assert [p.name for p in tmp_path.iterdir()] == [PROGRESS_FILE], "no temporary file left behind"


def test_a_step_that_failed_is_shown_failed_never_done(tmp_path: Path) -> None:
    """Issue 52: "evaluate done" was shown for an evaluate that raised (``finished`` is its time either way)."""
    from components.record.telemetry import FAILED_METRIC
    from llmpack.ui.progress import snapshot

    model = _staging(tmp_path)
    _events(model, "finetune", finished=1010.0)
    metrics = tmp_path / "evaluate" / "metrics"
    _events(metrics, "evaluate", process_started=1011.0)
    EventLog(metrics / EVENTS_FILE).append(make_record(CTX, "metric", "evaluate", FAILED_METRIC, 1.0))
    _events(metrics, "evaluate", finished=1012.0)
    assert snapshot(tmp_path, now=NOW).text == "evaluate failed"
    _events(model, "finetune", finished=1013.0)  # a later finish elsewhere: that one is the last, and done
    assert snapshot(tmp_path, now=NOW).text == "finetune done"
