"""Every attempt billed: a retried step's failed attempt is in the cost.

A step that fails once and is retried leaves two attempts; both held the step's GPU, so both are
in ``gpu_hours``, ``cost_usd`` and goodput's denominator, and the report names the retried one and
what it cost. Checked from fixed timestamps, on every local path that retries (a toy pipeline of
stdlib-only steps whose GPU step is named ``finetune``, made to fail once by
``LLMPACK_INJECT_FAILURES``), on the real pipeline (slow), and on a loopback cluster where the
finetune pod fails once and its retry succeeds (the pod watcher with the real Kubernetes client).
"""

from __future__ import annotations

import importlib
import io
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from components.commands import pipeline_values
from components.dsl import Pipeline, pipeline
from components.record import close as record
from components.record import cost, telemetry, tracking
from components.record.telemetry import RunContext, make_record

CTX = RunContext(run_group="rg-a", pipeline_run="pr-a", orchestrator="direct", mode="local", submitted_at=1000.0)
H100 = cost.resolve_price("nvidia-h100-80gb", env={})
FAIL_HOLD_S = 1.0  # the failed attempt holds its GPU this long before it crashes


def retried_records() -> list[telemetry.Record]:
    """finetune fails after 5 s (attempt 0), then its retry trains for 20 s (attempt 1)."""
    first = [("process_started", 1002.0), ("model_loaded", 1004.0), ("finished", 1007.0)]
    second = [("process_started", 1008.0), ("model_loaded", 1010.0), ("first_step", 1011.0), ("finished", 1030.0)]
    out = [make_record(CTX, "event", "finetune", n, v, 0) for n, v in first]
    out += [make_record(CTX, "event", "finetune", n, v, 1) for n, v in second]
    out += [make_record(CTX, "metric", "finetune", "train_s", 18.0, 1),
            make_record(CTX, "metric", "finetune", "train_tokens", 9000.0, 1)]
    out += [make_record(CTX, "event", "evaluate", "process_started", 1031.0),
            make_record(CTX, "event", "evaluate", "finished", 1035.0)]
    return out


# --------------------------------------------------------------------------- records and derivation


def test_a_retry_has_keys_of_its_own_and_the_first_attempt_keeps_the_old_ones() -> None:
    a0 = make_record(CTX, "event", "finetune", "process_started", 1.0)
    a1 = make_record(CTX, "event", "finetune", "process_started", 2.0, 1)
    assert (a0.attempt, a0.key, a0.mlflow_key) == (0, "pr-a/finetune/event/process_started",
                                                   "event.finetune.process_started")
    assert (a1.attempt, a1.key, a1.mlflow_key) == (1, "pr-a/finetune/event/process_started/attempt1",
                                                   "event.finetune.process_started.attempt1")
    # Through MLflow's metric names and back (what the summarizing task and the cluster path read).
    back = tracking.records_from_run({r.mlflow_key: r.value for r in retried_records()}, CTX)
    assert sorted((r.key, r.value) for r in back) == sorted((r.key, r.value) for r in retried_records())
    # A line written before attempts existed reads as attempt 0.
    assert telemetry.Record(**{k: v for k, v in a0.__dict__.items() if k != "attempt"}) == a0


def test_the_jsonl_keeps_both_attempts(tmp_path: Path) -> None:
    log = telemetry.EventLog(tmp_path / telemetry.EVENTS_FILE)
    for rec in retried_records():
        log.append(rec)
    steps = telemetry.group_by_step(telemetry.read_records([log.path]))
    finetune = steps["finetune"]
    assert [a.attempt for a in finetune.all_attempts] == [0, 1]
    assert finetune.events["process_started"] == 1008.0 and finetune.attempt == 1  # its view: the last attempt
    assert [a.attempt for a in finetune.retried] == [0] and steps["evaluate"].retried == ()


def test_cost_gpu_hours_and_goodput_bill_every_attempt() -> None:
    steps = telemetry.group_by_step(retried_records())
    uses = [cost.GpuUse(step="finetune", gpus=2, gpu_type="nvidia-h100-80gb"), cost.GpuUse(step="evaluate", gpus=1)]
    m = cost.cost_metrics(steps, uses, H100)
    billed = 2 * (5.0 + 22.0) + 1 * 4.0  # finetune: the failed 5 s and the retry's 22 s, on 2 GPUs; evaluate 4 s
    assert m["gpu_hours"] == pytest.approx(billed / 3600)
    assert m["cost_usd"] == pytest.approx(billed * H100.per_gpu_hour / 3600)
    assert m["goodput"] == pytest.approx(18.0 * 2 / billed)
    without_retry = 18.0 * 2 / (2 * 22.0 + 4.0)
    assert m["goodput"] < without_retry
    assert (m["retries"], m["retry_gpu_hours"]) == (1.0, pytest.approx(2 * 5.0 / 3600))
    assert m["retry_cost_usd"] == pytest.approx(2 * 5.0 * H100.per_gpu_hour / 3600)
    (bill,) = cost.retried_attempts(steps, uses, H100)
    assert (bill.step, bill.attempt, bill.billed_s) == ("finetune", 0, 5.0)
    assert (bill.started_at, bill.ended_at) == (1002.0, 1007.0)  # where the report's timeline draws it (trial 7)


def test_timeline_spinup_is_the_first_attempt_and_compute_counts_every_attempt() -> None:
    m = telemetry.derive_metrics(telemetry.group_by_step(retried_records()), submitted_at=1000.0, finished_at=1036.0)
    assert m["spinup_s"] == 2.0  # when the orchestrator first had the step running
    assert m["time_to_first_step_s"] == 11.0  # the training that produced the model
    assert m["pipeline_overhead_s"] == 36.0 - (5.0 + 22.0 + 4.0)


def test_summary_lists_the_retried_attempt(tmp_path: Path) -> None:
    log = telemetry.EventLog(tmp_path / "finetune" / "model" / telemetry.EVENTS_FILE)
    for rec in retried_records():
        log.append(rec)
    uses = [cost.GpuUse(step="finetune", gpus=1, gpu_type="nvidia-h100-80gb")]
    summary = record.close(values={"submitted_at": 1000.0, "run_group": "rg-a", "pipeline_run": "pr-a",
                                   "orchestrator": "direct", "mode": "local"}, status="Succeeded", uses=uses,
                           finished_at=1036.0, records_dir=tmp_path, env={"LLMPACK_CLIENT_UPLOADS": "1"})
    assert summary["metrics"]["retries"] == 1.0
    (a,) = summary["retried_attempts"]
    assert (a["step"], a["attempt"], a["billed_s"]) == ("finetune", 0, 5.0)
    assert a["cost_usd"] == pytest.approx(5.0 * H100.per_gpu_hour / 3600)


# --------------------------------------------------------------------------- the step's attempt number


def test_attempt_number_from_the_orchestrator_or_the_jsonl(tmp_path: Path) -> None:
    path = tmp_path / telemetry.EVENTS_FILE
    assert telemetry.attempt_number(CTX, "finetune", path, env={}) == 0
    telemetry.EventLog(path).append(make_record(CTX, "event", "finetune", "process_started", 1.0))
    telemetry.EventLog(path).append(make_record(CTX, "event", "evaluate", "process_started", 1.0))
    other_run = RunContext(run_group="g", pipeline_run="other", orchestrator="kfp", mode="local", submitted_at=0.0)
    telemetry.EventLog(path).append(make_record(other_run, "event", "finetune", "process_started", 1.0, 4))
    assert telemetry.attempt_number(CTX, "finetune", path, env={}) == 1  # kfp.local: counted in the JSONL
    assert telemetry.attempt_number(CTX, "finetune", path, env={"LLMPACK_ATTEMPT": "3"}) == 3  # Argo {{retries}}...
    assert telemetry.attempt_number(CTX, "finetune", path, env={"LLMPACK_ATTEMPT": "0"}) == 1  # the larger wins
    assert telemetry.attempt_number(CTX, "finetune", path, env={"LLMPACK_ATTEMPT": "{{retries}}"}) == 1


def test_injected_failures() -> None:
    env = {"LLMPACK_INJECT_FAILURES": "finetune=1:2.5,evaluate=2"}
    assert telemetry.injected_failure("finetune", 0, env) == 2.5
    assert telemetry.injected_failure("finetune", 1, env) is None
    assert [telemetry.injected_failure("evaluate", n, env) for n in range(3)] == [0.0, 0.0, None]
    assert telemetry.injected_failure("tokenize", 0, env) is None
    with pytest.raises(ValueError, match="STEP=N"):
        telemetry.injected_failure("finetune", 0, {"LLMPACK_INJECT_FAILURES": "finetune=x"})


# --------------------------------------------------------------------------- the report


def _run(path: str, retried: list[dict[str, Any]], cost_usd: float = 0.05,
         retry_cost: float | None = 0.01) -> dict[str, Any]:
    metrics = {"spinup_s": 1.0, "time_to_first_step_s": 2.0, "total_s": 30.0, "cost_usd": cost_usd, "goodput": 0.4,
               "retries": float(len(retried)), "retry_cost_usd": retry_cost, "train_s": 10.0}
    return {"run_group": "rg", "pipeline_run": f"{path}-1", "orchestrator": path, "mode": "local",
            "status": "succeeded", "error": None, "submitted_at": 1000.0, "metrics": metrics, "events": {},
            "tags": {"llmpack.price_per_gpu_hour": "11.06", "llmpack.gpu_count": "1"}, "retried_attempts": retried,
            "artifacts": {}}


RETRIED = [{"step": "finetune", "attempt": 0, "billed_s": 3.25, "gpu_hours": 3.25 / 3600, "cost_usd": 0.01}]


def test_report_shows_retried_attempts_and_their_cost(tmp_path: Path) -> None:
    from llmpack.compare.comparison import comparison
    from llmpack.report import retry_lines, write_report

    runs = [_run("direct", []), _run("argo", RETRIED)]
    lines = retry_lines(runs)
    assert lines == [("argo", "argo-1 [succeeded]: 1 retried attempt: finetune first attempt failed after 3.25 s, "
                              "0.000903 GPU-h, $0.0100 ($0.0100 of $0.0500 billed, in the cost)")]
    result = comparison("rg", ["direct", "argo"], runs)
    out = write_report(result, tmp_path / "report")
    md = (out / "report.md").read_text()
    assert "## Retried attempts" in md and "finetune first attempt failed after 3.25 s" in md
    assert "$0.0100 of $0.0500" in md
    page = (out / "report.html").read_text()
    assert "<h2>Retried attempts</h2>" in page and "finetune first attempt failed after 3.25 s" in page


def test_terminal_shows_retried_attempts() -> None:
    from rich.console import Console

    from llmpack.compare.comparison import comparison
    from llmpack.compare.table import compare_table

    buf = io.StringIO()
    compare_table(comparison("rg", ["direct", "argo"], [_run("direct", []), _run("argo", RETRIED)]),
                  console=Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "argo retried: argo-1 [succeeded]: 1 retried attempt: finetune first attempt failed after 3.25 s" in text
    assert "direct retried" not in text


# --------------------------------------------------------------------------- every local path that retries

TOY_STEPS = '''
import time
from pathlib import Path

from components import reporting
from components.dsl import Dataset, Execution, Input, Model, Output, Resources, Retry, step


@step(name="prepare-data")
def toy_prepare(out: Output[Dataset], text: str = "hello") -> None:
    """Write the text."""
    (Path(out.path) / "data.txt").write_text(text)


@step(name="finetune",
      execution=Execution(resources=Resources(cpu=1, memory="1Gi", gpu_type="nvidia-h100-80gb", gpus=1),
                          retry=Retry(limit=2, backoff_s=0)))
def toy_finetune(data: Input[Dataset], model: Output[Model], hold_s: float = 0.3) -> None:
    """"Train" for hold_s seconds on one GPU."""
    reporting.emit("model_loaded")
    t0 = time.time()
    reporting.emit("first_step")
    time.sleep(hold_s)
    reporting.metric("train_s", time.time() - t0)
    reporting.metric("train_tokens", 1000.0)
    (Path(model.path) / "weights.txt").write_text((Path(data.path) / "data.txt").read_text().upper())
'''


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("attempts-toy")
    (root / "llmpack_attempts_toy_steps.py").write_text(textwrap.dedent(TOY_STEPS), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def toy_pipe(toy_dir: Path) -> Pipeline:
    sys.path.insert(0, str(toy_dir))
    try:
        mod = importlib.import_module("llmpack_attempts_toy_steps")
    finally:
        sys.path.remove(str(toy_dir))

    @pipeline(name="toy-attempts")
    def toy(text: str = "hello", hold_s: float = 0.3):
        made = mod.toy_prepare(text=text)
        mod.toy_finetune(data=made.outputs["out"], hold_s=hold_s)

    return toy()


def _env(toy_dir: Path, workdir: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(toy_dir), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "LLMPACK_MLFLOW_LOGGING": "0", "LLMPACK_CLIENT_UPLOADS": "1",
            "LLMPACK_RECORDS_DIR": str(workdir), "LLMPACK_INJECT_FAILURES": f"finetune=1:{FAIL_HOLD_S}",
            "MLFLOW_TRACKING_URI": f"sqlite:///{workdir.parent / 'mlflow.db'}", **extra}


def check_every_attempt_billed(workdir: Path, summary: dict[str, Any] | None = None,
                               other_gpu_steps: tuple[str, ...] = ()) -> None:
    """The failed attempt's seconds are in gpu_hours and cost; goodput is below the last attempt's alone.

    ``other_gpu_steps``: steps besides finetune that hold a GPU (one attempt each), billed too.
    """
    records = telemetry.read_records(telemetry.find_event_files(workdir))
    steps = telemetry.group_by_step(records)
    finetune = steps["finetune"]
    others = [cost.billed_seconds(steps[s]) for s in other_gpu_steps]
    assert all(o is not None for o in others)
    other_s = sum(o for o in others if o is not None)
    assert [a.attempt for a in finetune.all_attempts] == [0, 1], records
    failed, last = finetune.all_attempts
    failed_s, last_s = cost.billed_seconds(failed), cost.billed_seconds(last)
    assert failed_s is not None and failed_s >= FAIL_HOLD_S and last_s is not None
    assert "first_step" not in failed.events and "train_s" not in failed.metrics  # it crashed before training

    summary = summary or record.read_summary(workdir)
    assert summary is not None, "the summarizing task wrote no record"
    m = summary["metrics"]
    assert m["gpu_hours"] * 3600 == pytest.approx(failed_s + last_s + other_s, abs=1e-6)
    assert m["cost_usd"] == pytest.approx((failed_s + last_s + other_s) * H100.per_gpu_hour / 3600, rel=1e-9)
    assert m["retries"] == 1.0
    assert m["retry_gpu_hours"] * 3600 == pytest.approx(failed_s, abs=1e-6)
    assert m["retry_cost_usd"] == pytest.approx(failed_s * H100.per_gpu_hour / 3600, rel=1e-9)
    train_s = finetune.metrics["train_s"]
    held_s = max(failed_s + last_s + other_s, m["total_s"])  # one GPU, held from submit to end (goodput's denominator)
    assert m["goodput"] == pytest.approx(train_s / held_s, rel=1e-9)
    assert m["goodput"] < train_s / (last_s + other_s)  # lower than with the successful attempt alone
    (a,) = summary["retried_attempts"]
    assert (a["step"], a["attempt"]) == ("finetune", 0) and a["billed_s"] == pytest.approx(failed_s, abs=1e-6)


def _values(pipe: Pipeline, orchestrator: str) -> dict[str, Any]:
    return pipeline_values(pipe, {"pipeline_run": f"{orchestrator}-attempts-1", "run_group": "rg-attempts",
                                  "orchestrator": orchestrator, "mode": "local", "submitted_at": time.time()})


def test_direct_bills_the_failed_attempt(toy_pipe: Pipeline, toy_dir: Path, tmp_path: Path) -> None:
    from llmpack.run.direct import run_local

    work = tmp_path / "work"
    out = run_local(toy_pipe, _values(toy_pipe, "direct"), work, _env(toy_dir, work))
    assert (out["finetune.model"] / "weights.txt").read_text() == "HELLO"
    log = (work / "logs" / "finetune.log").read_text()
    assert log.count("RuntimeError: LLMPACK_INJECT_FAILURES: step 'finetune' attempt 0 failed on purpose") == 1
    assert "attempt 1 failed" not in log
    check_every_attempt_billed(work)


def test_argo_local_bills_the_failed_attempt(toy_pipe: Pipeline, toy_dir: Path, tmp_path: Path) -> None:
    from argo_workflows.local import run_local

    work = tmp_path / "work"
    run_local(toy_pipe, _values(toy_pipe, "argo"), work, _env(toy_dir, work))
    check_every_attempt_billed(work)


def test_without_a_failure_nothing_is_retried(toy_pipe: Pipeline, toy_dir: Path, tmp_path: Path) -> None:
    from llmpack.run.direct import run_local

    work = tmp_path / "work"
    run_local(toy_pipe, _values(toy_pipe, "direct"), work, _env(toy_dir, work, LLMPACK_INJECT_FAILURES=""))
    summary = record.read_summary(work)
    assert summary is not None and summary["metrics"]["retries"] == 0.0 and summary["retried_attempts"] == []
    assert all(r.attempt == 0 for r in telemetry.read_records(telemetry.find_event_files(work)))


@pytest.mark.slow
def test_kfp_local_bills_the_failed_attempt(toy_pipe: Pipeline, toy_dir: Path, tmp_path: Path) -> None:
    from kfp_pipelines.local import run_local

    work = tmp_path / "work"
    run_local(toy_pipe, _values(toy_pipe, "kfp"), work, _env(toy_dir, work))  # attempt from the JSONL: no env
    check_every_attempt_billed(work)


@pytest.mark.slow
def test_mlflow_run_bills_the_failed_attempt(toy_pipe: Pipeline, toy_dir: Path, tmp_path: Path) -> None:
    from mlflow_projects.local import run_local

    work = tmp_path / "work"
    run_local(toy_pipe, _values(toy_pipe, "mlflow"), work, _env(toy_dir, work))
    check_every_attempt_billed(work)


@pytest.mark.slow
def test_llmpack_run_of_the_real_pipeline_bills_the_failed_finetune(tmp_path: Path) -> None:
    """The whole pipeline on the direct path; finetune crashes once, 1 s after its start."""
    from llmpack.report import retry_lines
    from llmpack.run.local import RunOptions, run_pipeline

    opts = RunOptions(backend="direct", max_steps=4, output_dir=tmp_path / "runs",
                      tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    summary = run_pipeline(opts, env={"LLMPACK_INJECT_FAILURES": f"finetune=1:{FAIL_HOLD_S}"})
    assert summary["status"] == "succeeded", summary.get("error")
    check_every_attempt_billed(Path(summary["artifacts"]["run_dir"]), summary, other_gpu_steps=("evaluate",))
    ((path, text),) = retry_lines([summary])
    assert path == "direct" and "finetune first attempt failed after" in text
    # The MLflow record has both attempts under their own names, and the report rebuilt from it lists the retry.
    from llmpack.report import runs_from_mlflow

    mc = tracking.client(opts.tracking_uri)
    metrics = mc.get_run(summary["artifacts"]["mlflow_run_id"]).data.metrics
    assert "event.finetune.process_started" in metrics and "event.finetune.process_started.attempt1" in metrics
    (again,) = runs_from_mlflow(mc, summary["run_group"])
    assert [a["attempt"] for a in again["retried_attempts"]] == [0]
    assert again["events"]["finetune"]["process_started"] == metrics["event.finetune.process_started.attempt1"]


# --------------------------------------------------------------------------- the loopback cluster


def test_loopback_cluster_pod_that_fails_once_then_succeeds() -> None:
    """The finetune pod fails once, its retry succeeds: both pods are attempts, both are billed."""
    from standins.k8s_api import KubeAPIStandIn, node_object, pod_states

    from llmpack.cluster.k8s.api import build_api_client
    from llmpack.cluster.k8s.billing import cluster_cost, retried_pods
    from llmpack.cluster.k8s.podphases import all_terminated
    from llmpack.cluster.k8s.step_records import to_step_records
    from llmpack.cluster.k8s.watcher import PodWatcher

    t0, ns, rg, run = 1_741_942_800.0, "llmpack", "rg-retry", "argo-retry-1"

    def labels(step: str) -> dict[str, str]:
        return {"llmpack.io/run-group": rg, "llmpack.io/pipeline-run": run, "llmpack.io/orchestrator": "argo",
                "llmpack.io/step": step, "workflows.argoproj.io/workflow": "llm-finetune-r1"}

    def pod(name: str, step: str, **times: Any) -> list[dict[str, Any]]:
        return pod_states(name, namespace=ns, labels=labels(step), node="gpu-1" if step == "finetune" else "cpu-1",
                          annotations={"workflows.argoproj.io/node-name": f"llm-finetune-r1.{step}"}, **times)

    pods = [
        pod("llm-finetune-r1-prepare-data-1", "prepare-data", created=t0, scheduled=t0 + 1, initialized=t0 + 2,
            started=t0 + 3, finished=t0 + 10),
        pod("llm-finetune-r1-finetune-2", "finetune", created=t0 + 11, scheduled=t0 + 12, initialized=t0 + 13,
            started=t0 + 20, finished=t0 + 50, failed=True),  # attempt 0: 30 s on the GPU, then exit 1
        pod("llm-finetune-r1-finetune-3", "finetune", created=t0 + 60, scheduled=t0 + 61, initialized=t0 + 62,
            started=t0 + 70, finished=t0 + 170),  # the retry: 100 s
    ]
    token = "standin-token-attempts"
    with KubeAPIStandIn(token=token, namespaces=(ns,)) as api:
        api.add_node(node_object("cpu-1", created=t0 - 9000, ready=t0 - 8000, instance_type="m6i.2xlarge"))
        api.add_node(node_object("gpu-1", created=t0 - 9000, ready=t0 - 8000, instance_type="p5.48xlarge",
                                 gpu_product="NVIDIA-H100-80GB-HBM3"))
        for states in pods:
            api.apply_pod(states[-1])
        watcher = PodWatcher(build_api_client(host=api.url, token=token), ns, rg, window_s=1)
        rows = watcher.run(until=all_terminated(steps=["prepare-data", "finetune"]), timeout_s=10)
    assert sorted((r["step"], r["phase"]) for r in rows) == [("finetune", "Failed"), ("finetune", "Succeeded"),
                                                             ("prepare-data", "Succeeded")]

    ctx = RunContext(run_group=rg, pipeline_run=run, orchestrator="argo", mode="cluster", submitted_at=t0 - 1)
    k8s = to_step_records(rows, ctx)
    tune = [r for r in k8s if r.step == "finetune" and r.name == "container_started"]
    assert [(r.attempt, r.value) for r in tune] == [(0, t0 + 20), (1, t0 + 70)]
    # What the steps logged themselves (the retry's with its attempt, as LLMPACK_ATTEMPT / {{retries}} tell it).
    steps_own = [make_record(ctx, "event", "finetune", "process_started", t0 + 21, 0),
                 make_record(ctx, "event", "finetune", "finished", t0 + 49, 0),
                 make_record(ctx, "event", "finetune", "process_started", t0 + 71, 1),
                 make_record(ctx, "event", "finetune", "first_step", t0 + 80, 1),
                 make_record(ctx, "event", "finetune", "finished", t0 + 169, 1),
                 make_record(ctx, "metric", "finetune", "train_s", 88.0, 1)]
    steps = telemetry.group_by_step([*k8s, *steps_own])
    uses = [cost.GpuUse(step="finetune", gpus=1, gpu_type="nvidia-h100-80gb")]
    m = cluster_cost(steps, rows, uses, "argo", H100)
    assert m["gpu_hours"] * 3600 == pytest.approx(30.0 + 100.0)
    assert m["cost_usd"] == pytest.approx(130.0 * H100.per_gpu_hour / 3600)
    assert m["goodput"] == pytest.approx(88.0 / 130.0) and m["goodput"] < 88.0 / 100.0
    assert (m["retries"], m["retry_gpu_hours"] * 3600) == (1.0, pytest.approx(30.0))
    (a,) = retried_pods(rows, uses, "argo", H100)
    assert (a["step"], a["attempt"], a["billed_s"], a["pod"]) == ("finetune", 0, 30.0, "llm-finetune-r1-finetune-2")
    derived = telemetry.derive_metrics(steps, submitted_at=ctx.submitted_at)
    assert derived["spinup_s"] == pytest.approx(22.0)  # the first attempt's process start (its container: 21 s)
    assert derived["time_to_first_step_s"] == pytest.approx(81.0)  # the retry's training



def test_run_json_drops_step_failed_when_the_retry_succeeded() -> None:
    """Trial 9: `--json`'s step_metrics kept the first attempt's step_failed 1 though the step's retry succeeded."""
    from llmpack.run.local import _step_metrics

    recs = [make_record(CTX, "metric", "picky", telemetry.FAILED_METRIC, 1.0, 0),
            make_record(CTX, "event", "picky", "process_started", 1.0, 0),
            make_record(CTX, "event", "picky", "process_started", 2.0, 1),
            make_record(CTX, "metric", "picky", "rows_checked", 36.0, 1)]
    picky = telemetry.group_by_step(recs)["picky"]
    assert _step_metrics(picky) == {"rows_checked": 36.0}
    failed = telemetry.group_by_step(recs[:2])["picky"]
    assert _step_metrics(failed) == {telemetry.FAILED_METRIC: 1.0}
