"""Every cluster path's run is one trace in a real MLflow server, linked to its pipeline record.

One ``compare --cluster`` of KFP, Argo and MLflow on the loopback cluster (tests/standins), the
pipeline's own closing task played for real (:mod:`standins.exit_task`): it sends the trace of the
steps' events from inside the cluster (on Argo joined to the workflow's ``TRACEPARENT``), and the
client's closing sends it again with the pod phases it watched. MLflow's own client must return one
trace per run, linked to the run, with the same span names on every path and every phase span
from one recorded event to the next.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standins.exit_task import ExitTask
from standins.loopback import LoopbackCluster

from benchmarks.mlflow_server import MlflowServer
from components.record import telemetry, tracking
from components.record.trace import parse_traceparent, phase_name
from components.record.trace_export import PARENT_TAG, TRACE_TAG
from llmpack.cluster.compare import cluster

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_env")]

SHARED = {"pipeline llm-finetune", "to the first step", "step finetune", "finetune attempt 0", "queued", "provisioning",
          "pulling and starting", "starting", "loading the model", "first step", "training", "evaluating",
          "hand-over"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    with MlflowServer(tmp_path_factory.mktemp("mlflow-trace-cluster")) as srv:
        yield srv


def _compare(server: MlflowServer, tmp_path: Path, **options: Any) -> tuple[dict[str, Any], ExitTask, LoopbackCluster]:
    exit_task = ExitTask(server.uri)
    with LoopbackCluster(tmp_path, server.uri, on_exit=exit_task) as lc:
        result = cluster.compare_cluster(**lc.options(**options))
        lc.fake.wait_idle()
    assert not exit_task.errors, exit_task.errors
    return result, exit_task, lc


def _trace_of(mc: Any, run_id: str) -> Any:
    (found,) = mc.search_traces(locations=[mc.get_run(run_id).info.experiment_id], run_id=run_id)
    return found


def _check_phases(spans: list[Any], records: list[telemetry.Record]) -> None:
    """Each phase span runs from one recorded event to the next one its attempt, rank or node recorded."""
    events = {(r.step, r.name, r.attempt): r.value for r in records if r.kind == "event"}
    by_id = {s.span_id: s for s in spans}
    checked = 0
    for span in spans:
        attrs = span.attributes
        if "llmpack.from_event" not in attrs:
            continue
        holder = by_id[span.parent_id].name  # "finetune attempt 0", "finetune rank 3", "finetune node 1"
        step, kind, n = holder.split(" ")
        suffix = "" if kind == "attempt" else f".{kind}{n}"
        attempt = int(n) if kind == "attempt" else int(by_id[span.parent_id].attributes["llmpack.attempt"])
        start = events[(step, attrs["llmpack.from_event"] + suffix, attempt)]
        end = events[(step, attrs["llmpack.to_event"] + suffix, attempt)]
        assert (span.start_time_ns, span.end_time_ns) == (round(start * 1e9), round(end * 1e9)), span.name
        assert span.name == phase_name(step, attrs["llmpack.from_event"], attrs["llmpack.to_event"])
        checked += 1
    assert checked >= 10


def test_each_cluster_path_sends_one_trace_linked_to_its_record(server: MlflowServer, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    result, exit_task, _ = _compare(server, tmp_path)
    mc = MlflowClient(server.uri)
    names: dict[str, set[str]] = {}
    for run in result["runs"]:
        orch, pipeline_run = run["orchestrator"], run["pipeline_run"]
        assert run["status"] == "succeeded" and run["trace"] == "sent", (orch, run["warnings"], run.get("trace"))
        assert exit_task.summaries[pipeline_run]["trace"] == "sent"  # the pipeline's own closing sent it first
        run_id = run["artifacts"]["mlflow_run_id"]
        found = _trace_of(mc, run_id)
        assert found.info.state.value == "OK"
        tags = mc.get_run(run_id).data.tags
        assert tags[TRACE_TAG] == found.info.trace_id.removeprefix("tr-")
        if orch == "argo":  # joined the workflow's trace that Argo injected into the exit pod
            planted = parse_traceparent(exit_task.traceparents[pipeline_run])
            assert (planted is not None and tags[TRACE_TAG] == planted[0]
                    and tags[PARENT_TAG] == exit_task.traceparents[pipeline_run])
            (root,) = [s for s in found.data.spans if s.parent_id is None]
            assert root.attributes["llmpack.parent_span_id"] == planted[1]
        spans = found.data.spans
        names[orch] = {s.name for s in spans}
        records = tracking.records_from_run(mc.get_run(run_id).data.metrics, telemetry.RunContext(
            run_group=run["run_group"], pipeline_run=pipeline_run, orchestrator=orch, mode="cluster",
            submitted_at=run["submitted_at"]))
        _check_phases(spans, records)
        (root,) = [s for s in spans if s.name == "pipeline llm-finetune"]
        assert root.start_time_ns == round(run["submitted_at"] * 1e9)
    assert SHARED <= names["kfp"], names["kfp"]
    assert names["kfp"] == names["argo"] == names["mlflow"], names


def test_a_gang_trace_has_a_span_per_node_pod_and_per_rank_on_every_path(server: MlflowServer, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    result, _, _ = _compare(server, tmp_path, nodes=2, gpus=2)
    mc = MlflowClient(server.uri)
    names: dict[str, set[str]] = {}
    for run in result["runs"]:
        assert run["status"] == "succeeded" and run["trace"] == "sent", (run["orchestrator"], run.get("trace"))
        run_id = run["artifacts"]["mlflow_run_id"]
        spans = _trace_of(mc, run_id).data.spans
        by_id = {s.span_id: s for s in spans}
        nodes = sorted(s.name for s in spans if " node " in s.name)
        ranks = {s.name: by_id[s.parent_id].name for s in spans if " rank " in s.name}
        assert nodes == ["finetune node 0", "finetune node 1"], run["orchestrator"]
        assert ranks == {f"finetune rank {r}": f"finetune node {r // 2}" for r in range(4)}
        records = tracking.records_from_run(mc.get_run(run_id).data.metrics, telemetry.RunContext(
            run_group=run["run_group"], pipeline_run=run["pipeline_run"], orchestrator=run["orchestrator"],
            mode="cluster", submitted_at=run["submitted_at"]))
        _check_phases(spans, records)
        names[run["orchestrator"]] = {s.name for s in spans}
    assert names["kfp"] == names["argo"] == names["mlflow"], names
