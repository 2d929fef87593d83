"""Every local path's run is one trace in a real MLflow server, linked to its pipeline record, with the same spans."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.mlflow_server import MlflowServer, clean_env
from components.record import telemetry
from tests.conftest import llmpack

PATHS = ("direct", "kfp", "argo", "mlflow")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    with MlflowServer(tmp_path_factory.mktemp("mlflow-trace-server")) as srv:
        yield srv


@pytest.mark.slow
def test_each_local_path_sends_one_trace_linked_to_its_record_with_the_same_span_names(
        server: MlflowServer, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    mc = MlflowClient(server.uri)
    names: dict[str, set[str]] = {}
    for path in PATHS:
        r = llmpack("run", "--backend", path, "--max-steps", "2", "--json", "--tracking-uri", server.uri,
                    "--output-dir", str(tmp_path / "runs"), cwd=tmp_path, env=clean_env())
        assert r.returncode == 0, r.stderr[-3000:]
        summary = json.loads(r.stdout)
        assert summary["trace"] == "sent", summary["trace"]
        run_id = summary["artifacts"]["mlflow_run_id"]
        (trace,) = mc.search_traces(locations=[mc.get_run(run_id).info.experiment_id], run_id=run_id)
        spans = trace.data.spans
        names[path] = {s.name for s in spans}
        # span times are the JSONL's events: each phase starts at one event of its step's attempt, to the
        # nanosecond a span carries (a float epoch second holds ~0.24 us, so within a microsecond, not
        # rounded to one: rounding both sides to 6 places flips when a time sits at a half microsecond)
        run_dir = Path(summary["artifacts"]["run_dir"])
        events = sorted(r.value for r in telemetry.read_records([run_dir / "events.jsonl"]) if r.kind == "event")
        phases = [s for s in spans if s.name in ("loading the model", "first step", "training", "evaluating")]
        assert phases
        for s in phases:
            nearest = min(events, key=lambda t: abs(t - s.start_time_ns / 1e9))
            assert abs(nearest - s.start_time_ns / 1e9) < 1e-6, (path, s.name, s.start_time_ns, nearest)
        assert mc.get_run(run_id).data.tags["llmpack.trace_id"] == trace.info.trace_id.removeprefix("tr-")
    assert all(names[p] == names["direct"] for p in PATHS), names
    assert {"pipeline llm-finetune", "to the first step", "step finetune", "training", "hand-over"} <= names["direct"]
