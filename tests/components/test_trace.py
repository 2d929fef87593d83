"""Every run a trace: spans from the JSONL events, joined to a TRACEPARENT, exported without ever failing a run."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from components.record import trace_export
from components.record.close import export_trace
from components.record.telemetry import RunContext, make_record
from components.record.trace import build_trace, from_otlp, parse_traceparent, trace_id_of

CTX = RunContext(run_group="g", pipeline_run="pr-trace", orchestrator="argo", mode="cluster", submitted_at=100.0)
EVENTS = {  # step -> its events (one attempt), seconds after submit
    "prepare_data": {"pod_created": 1.0, "pod_scheduled": 1.5, "node_ready": 1.5, "container_started": 3.0,
                     "process_started": 3.2, "finished": 4.0},
    "finetune": {"process_started": 5.0, "model_loaded": 6.0, "first_step": 6.5, "finished": 9.0},
}


def _records(retry_finetune: bool = False) -> list[Any]:
    recs = [make_record(CTX, "event", step, name, CTX.submitted_at + t)
            for step, events in EVENTS.items() for name, t in events.items()]
    if retry_finetune:  # a first attempt that died after loading the model; the second is EVENTS' finetune
        recs = [make_record(CTX, "event", r.step, r.name, r.value, attempt=1) if r.step == "finetune" else r
                for r in recs]
        recs += [make_record(CTX, "event", "finetune", "process_started", 104.2, attempt=0),
                 make_record(CTX, "event", "finetune", "model_loaded", 104.6, attempt=0)]
    return recs


def _by_name(spans: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        out.setdefault(span["name"], []).append(span)
    return out


def _seconds(span: dict[str, Any], key: str) -> float:
    return int(span[key]) / 1e9


def test_spans_are_the_jsonl_events_in_a_run_step_attempt_phase_tree() -> None:
    tags = {"llmpack.orchestrator": "argo", "llmpack.gpu_type": "nvidia-h100-80gb", "llmpack.status": "succeeded",
            "llmpack.secret_thing": "not exported"}
    spans = from_otlp(build_trace(_records(), pipeline_run=CTX.pipeline_run, submitted_at=100.0, tags=tags).otlp())
    named = _by_name(spans)
    run = named["pipeline llm-finetune"][0]
    assert "parentSpanId" not in run and _seconds(run, "startTimeUnixNano") == 100.0
    assert _seconds(run, "endTimeUnixNano") == 109.0  # the last finish
    attrs = {a["key"]: next(iter(a["value"].values())) for a in run["attributes"]}
    assert attrs["cicd.pipeline.run.id"] == "pr-trace" and attrs["cicd.pipeline.result"] == "success"
    assert attrs["llmpack.gpu_type"] == "nvidia-h100-80gb" and "llmpack.secret_thing" not in attrs
    # every phase span's times are two consecutive events of the JSONL, under its attempt, under its step
    ids = {s["spanId"]: s for s in spans}
    phases = [("queued", 101.0, 101.5), ("provisioning", 101.5, 101.5), ("pulling and starting", 101.5, 103.0),
              ("starting", 103.0, 103.2), ("running", 103.2, 104.0), ("loading the model", 105.0, 106.0),
              ("first step", 106.0, 106.5), ("training", 106.5, 109.0), ("to the first step", 100.0, 103.0),
              ("hand-over", 104.0, 105.0)]
    for name, start, end in phases:
        (span,) = named[name]
        assert ((_seconds(span, "startTimeUnixNano"), _seconds(span, "endTimeUnixNano"))
                == pytest.approx((start, end))), name
    assert ids[named["training"][0]["parentSpanId"]]["name"] == "finetune attempt 0"
    assert ids[named["finetune attempt 0"][0]["parentSpanId"]]["name"] == "step finetune"
    assert ids[named["step finetune"][0]["parentSpanId"]]["name"] == "pipeline llm-finetune"
    assert len({s["spanId"] for s in spans}) == len(spans)


def test_a_retried_step_has_one_span_per_attempt_and_the_failed_one_is_an_error() -> None:
    named = _by_name(from_otlp(build_trace(_records(retry_finetune=True), pipeline_run=CTX.pipeline_run,
                                           submitted_at=100.0).otlp()))
    first, second = named["finetune attempt 0"][0], named["finetune attempt 1"][0]
    assert first["status"]["code"] == 2 and second["status"]["code"] == 1
    assert ({a["key"]: a["value"] for a in first["attributes"]}["cicd.pipeline.task.run.result"]
            == {"stringValue": "failure"})
    assert len(named["loading the model"]) == 2 and len(named["training"]) == 1


def test_the_same_run_gives_the_same_trace_and_a_traceparent_joins_its_parent() -> None:
    a = build_trace(_records(), pipeline_run=CTX.pipeline_run, submitted_at=100.0)
    b = build_trace(list(reversed(_records())), pipeline_run=CTX.pipeline_run, submitted_at=100.0)
    assert a.otlp() == b.otlp() and a.trace_id == trace_id_of("pr-trace")
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    joined = build_trace(_records(), pipeline_run=CTX.pipeline_run, submitted_at=100.0, traceparent=parent)
    spans = from_otlp(joined.otlp())
    assert {s["traceId"] for s in spans} == {"4bf92f3577b34da6a3ce929d0e0e4736"}
    assert _by_name(spans)["pipeline llm-finetune"][0]["parentSpanId"] == "00f067aa0ba902b7"
    for bad in ("", "garbage", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-zz-01"):
        assert parse_traceparent(bad) is None


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], dict[str, Any]]] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(({k.lower(): v for k, v in self.headers.items()}, json.loads(body)))
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def collector() -> Iterator[tuple[str, type[_Collector]]]:
    handler = type("Collector", (_Collector,), {"received": [], "status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_otlp_endpoint_and_headers_from_the_otel_settings(collector: tuple[str, type[_Collector]],
                                                          tmp_path: Path) -> None:
    url, handler = collector
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": url,
           "OTEL_EXPORTER_OTLP_HEADERS": "x-team=ml%20platform,authorization=Bearer abc"}
    note = export_trace(_records(), ctx=CTX, tags={}, finished_at=109.0, env=env, out_dir=tmp_path)
    assert note == "sent"
    ((headers, body),) = handler.received
    assert headers["x-team"] == "ml platform" and headers["authorization"] == "Bearer abc"
    assert headers["content-type"] == "application/json"
    # the file beside the records is what was sent
    assert json.loads((tmp_path / trace_export.TRACE_FILE).read_text()) == body


def test_mlflow_target_links_the_run_and_carries_mlflow_credentials() -> None:
    to = trace_export.target({"MLFLOW_TRACKING_TOKEN": "tok"}, tracking_uri="https://mlflow.example:5000/",
                             experiment_id="7", run_id="abc")
    assert to is not None and to.url == "https://mlflow.example:5000/v1/traces"
    assert to.headers == {"x-mlflow-experiment-id": "7", "x-mlflow-run-id": "abc", "Authorization": "Bearer tok"}
    assert "tok" not in repr(to)
    assert trace_export.target({}, tracking_uri="sqlite:///mlflow.db", experiment_id="7", run_id="abc") is None


def test_a_refusing_or_absent_endpoint_never_fails_the_run(collector: tuple[str, type[_Collector]],
                                                           tmp_path: Path) -> None:
    url, handler = collector
    handler.status = 503
    note = export_trace(_records(), ctx=CTX, tags={}, finished_at=109.0,
                        env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url + "/v1/traces"}, out_dir=tmp_path)
    assert note.startswith("trace not sent to http://127.0.0.1:") and note.endswith("HTTP 503")
    t0 = time.monotonic()
    closed = export_trace(_records(), ctx=CTX, tags={}, finished_at=109.0,
                          env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"}, out_dir=tmp_path)
    assert closed.startswith("trace not sent") and time.monotonic() - t0 < 6
    assert export_trace(_records(), ctx=CTX, tags={}, finished_at=109.0, env={}, out_dir=None) == "no trace endpoint"
    grpc = {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}
    assert "gRPC is not supported" in export_trace(_records(), ctx=CTX, tags={}, finished_at=109.0, env=grpc,
                                                   out_dir=None)


def test_the_closing_task_joins_a_planted_traceparent(collector: tuple[str, type[_Collector]]) -> None:
    """What Argo 4.1 injects into the main container: the run's spans land in the workflow's trace."""
    url, handler = collector
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url,
           "TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    assert export_trace(_records(), ctx=CTX, tags={}, finished_at=109.0, env=env, out_dir=None) == "sent"
    spans = from_otlp(handler.received[0][1])
    assert {s["traceId"] for s in spans} == {"0af7651916cd43dd8448eb211c80319c"}
    roots = [s for s in spans if s.get("parentSpanId") == "b7ad6b7169203331"]
    assert [s["name"] for s in roots] == ["pipeline llm-finetune"]


def _gang_records() -> list[Any]:
    """A finetune gang of 2 nodes x 2 GPUs: the launcher's events, each node pod's and each rank's."""
    recs = [make_record(CTX, "event", "finetune", name, CTX.submitted_at + t)
            for name, t in {"process_started": 5.0, "model_loaded": 30.0, "first_step": 31.0, "finished": 40.0}.items()]
    for node, late in ((0, 0.0), (1, 3.0)):
        recs += [make_record(CTX, "event", "finetune", f"{name}.node{node}", CTX.submitted_at + t + late)
                 for name, t in {"pod_created": 7.0, "pod_scheduled": 15.0, "node_ready": 14.0,
                                 "container_started": 20.0}.items()]
    for rank in range(4):
        recs += [make_record(CTX, "event", "finetune", f"{name}.rank{rank}", CTX.submitted_at + t + rank * 0.1)
                 for name, t in {"process_started": 24.0, "model_loaded": 29.0, "first_step": 30.5,
                                 "finished": 38.0}.items()]
    return recs


def test_a_gang_has_a_span_per_node_pod_and_per_rank_with_the_same_phase_names() -> None:
    spans = from_otlp(build_trace(_gang_records(), pipeline_run=CTX.pipeline_run, submitted_at=100.0).otlp())
    named, ids = _by_name(spans), {s["spanId"]: s for s in spans}
    attempt = named["finetune attempt 0"][0]
    for node in (0, 1):
        (span,) = named[f"finetune node {node}"]
        assert span["parentSpanId"] == attempt["spanId"]
        assert _seconds(span, "startTimeUnixNano") == 107.0 + 3.0 * node
    for rank in range(4):  # ranks 0, 1 on node 0 and 2, 3 on node 1; each rank's own phases inside it
        (span,) = named[f"finetune rank {rank}"]
        assert ids[span["parentSpanId"]]["name"] == f"finetune node {rank // 2}"
        assert (_seconds(span, "startTimeUnixNano"), _seconds(span, "endTimeUnixNano")) == pytest.approx(
            (124.0 + rank * 0.1, 138.0 + rank * 0.1))
        mine = [s for s in spans if s.get("parentSpanId") == span["spanId"]]
        assert sorted(s["name"] for s in mine) == ["first step", "loading the model", "training"]
    node1 = [s for s in spans if s.get("parentSpanId") == named["finetune node 1"][0]["spanId"]]
    assert {"queued", "provisioning", "pulling and starting"} <= {s["name"] for s in node1}
    assert _seconds(named["finetune node 1"][0], "endTimeUnixNano") == pytest.approx(138.3)  # its last rank's finish
    assert len({s["spanId"] for s in spans}) == len(spans)
    # ranks that do not divide over the nodes hang under the attempt
    odd = [r for r in _gang_records() if not r.name.endswith(".rank3")]
    spans = from_otlp(build_trace(odd, pipeline_run=CTX.pipeline_run, submitted_at=100.0).otlp())
    attempt_id = _by_name(spans)["finetune attempt 0"][0]["spanId"]
    assert all(_by_name(spans)[f"finetune rank {r}"][0]["parentSpanId"] == attempt_id for r in range(3))


def test_toward_mlflow_a_joined_trace_keeps_its_id_with_the_parent_as_a_link() -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    joined = build_trace(_records(), pipeline_run=CTX.pipeline_run, submitted_at=100.0, traceparent=parent)
    spans = from_otlp(joined.otlp(root=True))
    (run,) = _by_name(spans)["pipeline llm-finetune"]
    assert "parentSpanId" not in run and run["links"] == [{"traceId": joined.trace_id, "spanId": "00f067aa0ba902b7"}]
    assert {s["traceId"] for s in spans} == {"4bf92f3577b34da6a3ce929d0e0e4736"}
    assert sum("parentSpanId" not in s for s in spans) == 1
    unjoined = build_trace(_records(), pipeline_run=CTX.pipeline_run, submitted_at=100.0)
    assert unjoined.otlp(root=True) == unjoined.otlp()


def test_a_pod_waiting_for_a_new_node_is_provisioning_then_queued_in_time_order() -> None:
    """The autoscaler's node is Ready before the scheduler binds the pod: phases follow the times, never backwards."""
    events = {"pod_created": 1.0, "node_ready": 8.0, "pod_scheduled": 9.0, "container_started": 14.0,
              "process_started": 14.5, "model_loaded": 16.0, "first_step": 17.0, "finished": 20.0}
    recs = [make_record(CTX, "event", "finetune", name, CTX.submitted_at + t) for name, t in events.items()]
    spans = from_otlp(build_trace(recs, pipeline_run=CTX.pipeline_run, submitted_at=100.0).otlp())
    named = _by_name(spans)
    for name, start, end in (("provisioning", 101.0, 108.0), ("queued", 108.0, 109.0),
                             ("pulling and starting", 109.0, 114.0), ("starting", 114.0, 114.5)):
        (span,) = named[name]
        assert (_seconds(span, "startTimeUnixNano"), _seconds(span, "endTimeUnixNano")) == (start, end), name


@pytest.mark.slow  # an MLflow store: seconds on a loaded machine
def test_a_later_sending_joins_the_traceparent_the_record_kept(collector: tuple[str, type[_Collector]],
                                                              fresh_tracking_uri: str) -> None:
    """The closing task in Argo's pod joined its TRACEPARENT; compare --cluster or sync, without one, joins it too."""
    from mlflow.tracking import MlflowClient

    url, handler = collector
    mc = MlflowClient(fresh_tracking_uri)
    run_id = mc.create_run("0").info.run_id
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    otlp = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url}
    assert export_trace(_records(), ctx=CTX, tags={}, finished_at=109.0, env={**otlp, "TRACEPARENT": parent},
                        out_dir=None, mc=mc, run_id=run_id) == "sent"
    tags = mc.get_run(run_id).data.tags
    assert (tags[trace_export.TRACE_TAG] == "0af7651916cd43dd8448eb211c80319c"
            and tags[trace_export.PARENT_TAG] == parent)
    assert export_trace(_records(), ctx=CTX, tags={}, finished_at=109.0, env=otlp, out_dir=None, mc=mc,
                        run_id=run_id) == "sent"
    first, again = (from_otlp(body) for _, body in handler.received)
    assert again == first  # the same trace, the same spans: the store updates them in place
    other = mc.create_run("0").info.run_id  # a record that joined nothing keeps its own trace id, no parent tag
    assert export_trace(_records(), ctx=CTX, tags={}, finished_at=109.0, env=otlp, out_dir=None, mc=mc,
                        run_id=other) == "sent"
    assert trace_export.PARENT_TAG not in mc.get_run(other).data.tags
    assert mc.get_run(other).data.tags[trace_export.TRACE_TAG] == trace_id_of(CTX.pipeline_run)


def test_the_run_span_names_the_pipeline_as_it_is_named() -> None:
    """The trace's pipeline name is the compiled pipeline's (KFP's pipeline name, Argo's generateName)."""
    from components.finetune_pipeline import PIPELINE_NAME
    from components.record import trace

    assert trace.PIPELINE_NAME == PIPELINE_NAME


def test_a_step_that_raised_is_a_failed_span_though_it_has_finished() -> None:
    """``finished`` is recorded however the step ended; its failure metric makes the spans failures."""
    from components.record.telemetry import FAILED_METRIC

    recs = _records() + [make_record(CTX, "metric", "finetune", FAILED_METRIC, 1.0)]
    named = _by_name(from_otlp(build_trace(recs, pipeline_run=CTX.pipeline_run, submitted_at=100.0).otlp()))
    assert named["step finetune"][0]["status"]["code"] == 2 and named["step prepare_data"][0]["status"]["code"] == 1
    (attempt,) = named["finetune attempt 0"]
    assert attempt["status"]["code"] == 2


def test_a_pipeline_of_ones_own_is_named_in_its_trace() -> None:
    """Trial 9: every trace's root span said `pipeline llm-finetune`, whatever the pipeline."""
    from components.record.trace import build_trace

    ctx = RunContext(run_group="rg-t9", pipeline_run="pr-t9", orchestrator="direct", mode="local", submitted_at=100.0)
    records = [make_record(ctx, "event", "count", "process_started", 101.0),
               make_record(ctx, "event", "count", "finished", 102.0)]
    spans = build_trace(records, pipeline_run="pr-t9", submitted_at=100.0, tags={"llmpack.pipeline": "len-stats"})
    payload = json.dumps(spans.otlp())
    assert '"pipeline len-stats"' in payload and "llm-finetune" not in payload
