"""Telemetry records, the JSONL sink and the derived metrics, with fixed timestamps."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.record import telemetry, tracking
from components.record.telemetry import RunContext, make_record

CTX = RunContext(run_group="rg-1", pipeline_run="pr-1", orchestrator="kfp", mode="local", submitted_at=1000.0)


def records() -> list[telemetry.Record]:
    ev = [
        ("prepare-data", "process_started", 1001.0), ("prepare-data", "finished", 1002.0),
        ("tokenize", "process_started", 1003.0), ("tokenize", "finished", 1004.0),
        ("finetune", "process_started", 1006.0), ("finetune", "model_loaded", 1008.0),
        ("finetune", "first_step", 1009.5), ("finetune", "finished", 1030.0),
        ("evaluate", "process_started", 1031.0), ("evaluate", "finished", 1035.0),
    ]
    out = [make_record(CTX, "event", s, n, v) for s, n, v in ev]
    out += [make_record(CTX, "metric", "finetune", "train_s", 20.0),
            make_record(CTX, "metric", "finetune", "tokens_per_s", 500.0),
            make_record(CTX, "metric", "evaluate", "eval_loss", 2.0),
            make_record(CTX, "metric", "evaluate", "base_eval_loss", 3.0)]
    return out


def test_derived_metrics_from_fixed_timestamps() -> None:
    steps = telemetry.group_by_step(records())
    m = telemetry.derive_metrics(steps, submitted_at=1000.0, finished_at=1036.0)
    assert m["spinup_s"] == 6.0
    assert m["time_to_first_step_s"] == 9.5
    assert m["total_s"] == 36.0
    assert m["pipeline_overhead_s"] == 36.0 - (1 + 1 + 24 + 4)
    assert m["queue_s"] is None and m["provision_s"] is None
    assert (m["train_s"], m["tokens_per_s"], m["eval_loss"], m["base_eval_loss"]) == (20.0, 500.0, 2.0, 3.0)


def test_spinup_is_the_training_process_start_on_a_cluster_too() -> None:
    """Issue 51's check: spin-up from the container start left out the steps an MLflow Job's (or a fused) pod runs
    before finetune, which separate pods count; one end on every path, the pod phases beside it."""
    recs = records() + [make_record(CTX, "event", "finetune", n, v) for n, v in
                        (("pod_created", 1002.0), ("pod_scheduled", 1002.5), ("node_ready", 1004.0),
                         ("container_started", 1005.0))]
    m = telemetry.derive_metrics(telemetry.group_by_step(recs), submitted_at=1000.0)
    assert m["spinup_s"] == 6.0  # finetune's process start, not its container's (1005.0)
    no_process = [r for r in recs if not (r.step == "finetune" and r.name == "process_started")]
    assert telemetry.derive_metrics(telemetry.group_by_step(no_process), submitted_at=1000.0)["spinup_s"] == 5.0
    assert m["queue_s"] == 0.5
    assert m["provision_s"] == 2.0
    assert m["total_s"] == 35.0  # no client finish time: the last step's finish


def test_jsonl_roundtrip_and_idempotent_keys(tmp_path: Path) -> None:
    log = telemetry.EventLog(tmp_path / "a" / telemetry.EVENTS_FILE)
    for rec in records():
        log.append(rec)
    log.append(make_record(CTX, "event", "finetune", "process_started", 1007.0))  # a retry
    back = telemetry.read_records(telemetry.find_event_files(tmp_path))
    assert len(back) == len(records())
    assert telemetry.group_by_step(back)["finetune"].events["process_started"] == 1007.0


def test_process_start_time_comes_from_the_os() -> None:
    t0 = time.time()
    code = "import time; time.sleep(2); from components.record.telemetry import process_start_time as p; print(p())"
    started = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    # The process began before its 2 s sleep, not when Python got to the call (a loaded machine may take
    # a second to start it).
    assert t0 - 0.05 <= started <= t0 + 1.5


def test_mlflow_upload_is_idempotent(tracking_uri: str) -> None:
    mc = tracking.client(tracking_uri)
    ctx = RunContext(run_group="rg-x", pipeline_run=f"pr-{time.time_ns()}", orchestrator="argo", mode="local",
                     submitted_at=1000.0)
    run_id = tracking.open_pipeline_run(mc, ctx, {"llmpack.gpu_type": "nvidia-l4"})
    assert tracking.open_pipeline_run(mc, ctx) == run_id  # found again by tag
    recs = [make_record(ctx, "event", "finetune", "first_step", 1009.5)]
    assert tracking.log_records(mc, run_id, recs) == 1
    assert tracking.log_records(mc, run_id, recs) == 0
    history = mc.get_metric_history(run_id, "event.finetune.first_step")
    assert len(history) == 1 and history[0].value == pytest.approx(1009.5)
    run = mc.get_run(run_id)
    assert run.data.tags["llmpack.orchestrator"] == "argo" and run.data.tags["llmpack.gpu_type"] == "nvidia-l4"
    rebuilt = tracking.records_from_run(run.data.metrics, ctx)
    assert rebuilt[0].step == "finetune" and rebuilt[0].name == "first_step"


def test_a_start_within_a_clock_tick_before_the_submit_is_no_negative_spinup() -> None:
    """The fifth trial: `spin-up s -0.00194` (a /proc start time in 10 ms ticks read a few ms before the
    submit). Within the resolution it is 0; a larger gap (clock skew) is kept, for the screen to exclude."""
    from components.record.telemetry import since_submit

    assert since_submit(99.998, 100.0) == 0.0 and since_submit(100.25, 100.0) == 0.25
    assert since_submit(99.0, 100.0) == -1.0 and since_submit(None, 100.0) is None
