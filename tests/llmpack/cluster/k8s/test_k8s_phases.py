"""Pod phases from recorded `kubectl get ... -o json` dumps, to the second (bad dumps: ``test_k8s_dumps.py``)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components.errors import InputError
from components.record.cost import billed_seconds
from components.record.telemetry import RunContext, derive_metrics, group_by_step, make_record
from llmpack.cluster.k8s.objects import parse_go_duration, parse_time, pull_seconds_from_message
from llmpack.cluster.k8s.podphases import ROW_FIELDS, analyze
from llmpack.cluster.k8s.slim import slim_event, slim_node, slim_pod
from llmpack.cluster.k8s.step_records import to_step_records
from llmpack.cluster.k8s.timeline import format_table, timeline_from_files

FIXTURES = Path(__file__).parents[3] / "fixtures" / "k8s"
PODS, NODES, EVENTS = FIXTURES / "pods.json", FIXTURES / "nodes.json", FIXTURES / "events.json"
RUN_GROUP = "rg-20250314-085958-7f3a9c"
KFP_RUN_ID = "3f2b6c1e-9d4a-4b8e-a1c7-5e0f2d9b8a61"  # pipeline/runid, from kfp.Client at submit
KFP_RUN = "kfp-20250314-090001-3f2b6c"
ARGO_RUN = "argo-20250314-090003-e4a8c2"
MLFLOW_RUN = "mlflow-20250314-090002-8e41c2"
KFP_DRIVER = "llm-finetune-7tq4m-system-container-driver-2650378426"
KFP_EXECUTOR = "llm-finetune-7tq4m-system-container-impl-1183460071"
ARGO_POD = "llm-finetune-x4w8z-finetune-3094715625"
MLFLOW_POD = "mlflow-20250314-090002-8e41c2-7xk2q"



def ts(hms: str, day: str = "2025-03-14") -> float:
    """Epoch seconds of a UTC wall-clock time, computed independently of the code under test."""
    return datetime.fromisoformat(f"{day}T{hms}+00:00").timestamp()


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    """The run group's rows; KFP pods cannot carry per-run labels, so its run id says which are ours."""
    return {r["pod"]: r for r in timeline_from_files(PODS, NODES, EVENTS, run_group=RUN_GROUP,
                                                     runs={KFP_RUN_ID: KFP_RUN})}


def _items(path: Path) -> list[dict]:
    return json.loads(path.read_text())["items"]


# --------------------------------------------------------------------------- fixtures, to the second


def test_only_the_run_groups_pods_and_their_orchestrator_pods(rows):
    assert set(rows) == {KFP_DRIVER, KFP_EXECUTOR, ARGO_POD, MLFLOW_POD}  # not the MLflow tracking server
    everything = timeline_from_files(PODS, NODES, EVENTS)  # no filter: every llmpack pod and its drivers
    assert [r["pod"] for r in everything] == [MLFLOW_POD, KFP_DRIVER, KFP_EXECUTOR, ARGO_POD]  # by creation time
    assert {r["pod"]: r["run_group"] for r in everything}[KFP_EXECUTOR] is None  # KFP: no per-run labels
    for row in rows.values():
        assert tuple(row) == ROW_FIELDS
        assert row["run_group"] == RUN_GROUP


def test_kfp_executor_on_an_autoscaled_gpu_node(rows):
    r = rows[KFP_EXECUTOR]
    assert (r["orchestrator"], r["role"], r["step"]) == ("kfp", "executor", "finetune")
    assert (r["run_group"], r["pipeline_run"], r["phase"]) == (RUN_GROUP, KFP_RUN, "Running")
    assert r["orchestrator_run"] == KFP_RUN_ID
    assert r["node"] == "ip-10-0-7-141.ec2.internal"
    assert r["instance_type"] == "p5.48xlarge"
    assert r["gpu_product"] == "NVIDIA-H100-80GB-HBM3"
    assert r["created"] == ts("09:00:14")
    assert r["scheduled"] == ts("09:03:41")
    assert r["node_ready"] == ts("09:03:29")  # node created 09:01:02, after the pod: brought up for it
    assert r["sandbox_ready"] == ts("09:03:44")
    assert r["init_done"] == ts("09:03:58")
    assert r["container_started"] == ts("09:05:51")
    assert r["finished"] is None and r["run_s"] is None  # still training when the dump was taken
    assert r["queue_s"] == 207.0
    assert r["provision_s"] == 195.0
    assert r["start_s"] == 337.0
    assert r["image_pull_s"] == pytest.approx(110.874)  # "in 1m50.874s (1m50.874s including waiting)"


def test_kfp_driver_pod(rows):
    r = rows[KFP_DRIVER]
    assert (r["orchestrator"], r["role"], r["step"]) == ("kfp", "driver", "finetune")
    assert (r["run_group"], r["pipeline_run"], r["orchestrator_run"]) == (RUN_GROUP, KFP_RUN, KFP_RUN_ID)
    assert (r["node"], r["instance_type"], r["gpu_product"]) == ("ip-10-0-1-23.ec2.internal", "m6i.2xlarge", None)
    assert r["created"] == r["scheduled"] == ts("09:00:04")
    assert r["node_ready"] is None and r["provision_s"] is None  # an old node
    assert r["sandbox_ready"] is None  # PodReadyToStartContainers turned False when the pod finished
    assert r["init_done"] == ts("09:00:06")
    assert r["container_started"] == ts("09:00:07")
    assert r["finished"] == ts("09:00:11")
    assert (r["queue_s"], r["start_s"], r["run_s"]) == (0.0, 3.0, 4.0)
    assert r["image_pull_s"] == 0.0  # "already present on machine"


def test_argo_pod_with_init_wait_main(rows):
    r = rows[ARGO_POD]
    assert (r["orchestrator"], r["role"], r["step"], r["pipeline_run"]) == ("argo", "executor", "finetune", ARGO_RUN)
    assert r["orchestrator_run"] == "llm-finetune-x4w8z"
    assert r["instance_type"] == "p5.48xlarge" and r["node"] == "ip-10-0-7-58.ec2.internal"
    assert r["created"] == r["scheduled"] == ts("09:00:21")
    assert r["node_ready"] is None and r["provision_s"] is None  # node up since the day before
    assert r["init_done"] == ts("09:00:26")
    assert r["container_started"] == ts("09:00:51")  # main, not wait (09:00:27)
    assert r["finished"] == ts("09:24:40")  # main, not wait (09:24:41)
    assert (r["queue_s"], r["start_s"], r["run_s"]) == (0.0, 30.0, 1429.0)
    assert r["image_pull_s"] == pytest.approx(21.904)  # waited for the MLflow pod's pull of the same image


def test_mlflow_job_pod(rows):
    r = rows[MLFLOW_POD]
    # the Job runs the whole pipeline (entry point "main") in one pod
    assert (r["orchestrator"], r["role"], r["step"], r["pipeline_run"]) == ("mlflow", "executor", "main", MLFLOW_RUN)
    assert r["orchestrator_run"] == MLFLOW_RUN  # the Job is named after the pipeline run
    assert r["created"] == ts("09:00:03")
    assert r["scheduled"] == ts("09:00:09")
    assert r["init_done"] == ts("09:00:10")
    assert r["container_started"] == ts("09:00:50")  # the container named after the MLflow project
    assert r["finished"] == ts("09:22:58")
    assert (r["queue_s"], r["provision_s"], r["start_s"], r["run_s"]) == (6.0, None, 47.0, 1328.0)
    assert r["image_pull_s"] == pytest.approx(37.902)


def test_without_nodes_and_events_those_fields_are_unknown():
    rows = {r["pod"]: r for r in timeline_from_files(PODS)}
    r = rows[KFP_EXECUTOR]
    assert (r["instance_type"], r["gpu_product"], r["node_ready"], r["provision_s"], r["image_pull_s"]) == (None,) * 5
    assert r["queue_s"] == 207.0 and r["start_s"] == 337.0


def test_run_group_filter():
    labelled = timeline_from_files(PODS, NODES, EVENTS, run_group=RUN_GROUP)
    assert {r["pod"] for r in labelled} == {ARGO_POD, MLFLOW_POD}  # KFP pods only through their run id
    assert len(timeline_from_files(PODS, NODES, EVENTS, run_group=RUN_GROUP, runs={KFP_RUN_ID: KFP_RUN})) == 4
    with pytest.raises(InputError, match=r"pods\.json: no pods of run group 'other'"):
        timeline_from_files(PODS, run_group="other")
    kfp_only = timeline_from_files(PODS, run_group="other", runs={KFP_RUN_ID: None})
    assert {(r["pod"], r["run_group"], r["pipeline_run"]) for r in kfp_only} == {
        (KFP_DRIVER, "other", None), (KFP_EXECUTOR, "other", None)}


def test_slim_objects_give_the_same_rows():
    pods, nodes, events = _items(PODS), _items(NODES), _items(EVENTS)
    full = analyze(pods, nodes, events)
    slim = analyze([slim_pod(p) for p in pods], [slim_node(n) for n in nodes], [slim_event(e) for e in events])
    assert slim == full
    assert "mlflow-tracking.llmpack.svc" not in json.dumps([slim_pod(p) for p in pods])  # env values dropped
    # The watcher slims a list page by page and slims again when it applies a pod: the second pass changes nothing.
    assert [slim_pod(slim_pod(p)) for p in pods] == [slim_pod(p) for p in pods]


def test_format_table(rows):
    text = format_table(list(rows.values()))
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["POD", "ORCH", "ROLE", "STEP"]
    assert len(lines) == 5
    executor = next(line for line in lines if KFP_EXECUTOR in line)
    assert "207.0" in executor and "195.0" in executor and "337.0" in executor and "110.9" in executor


# --------------------------------------------------------------------------- telemetry records


def _ctx(orchestrator: str, pipeline_run: str) -> RunContext:
    return RunContext(
        run_group=RUN_GROUP, pipeline_run=pipeline_run, orchestrator=orchestrator, mode="cluster",
        submitted_at=ts("09:00:00")
    )


def test_to_step_records_kfp_finetune(rows):
    ctx = _ctx("kfp", KFP_RUN)
    records = to_step_records(rows.values(), ctx)
    assert [(r.step, r.name, r.value) for r in records] == [
        ("finetune", "pod_created", ts("09:00:14")),
        ("finetune", "pod_scheduled", ts("09:03:41")),
        ("finetune", "node_ready", ts("09:03:29")),
        ("finetune", "container_started", ts("09:05:51")),
    ]  # the executor, not the driver
    assert all(r.kind == "event" and r.pipeline_run == KFP_RUN and r.mode == "cluster" for r in records)
    assert records[0].key == f"{KFP_RUN}/finetune/event/pod_created"
    assert records[0] == make_record(ctx, "event", "finetune", "pod_created", ts("09:00:14"))

    # Into the metrics of docs/telemetry-and-cost.md, with the step's own events.
    steps = group_by_step([*records, make_record(ctx, "event", "finetune", "finished", ts("09:31:07"))])
    metrics = derive_metrics(steps, submitted_at=ctx.submitted_at)
    assert metrics["queue_s"] == 207.0
    assert metrics["provision_s"] == 195.0
    assert metrics["spinup_s"] == 351.0  # container_started - submitted_at
    # billed: container start to finish, plus the node provisioned for the pod
    assert billed_seconds(steps["finetune"]) == (ts("09:31:07") - ts("09:05:51")) + 195.0


def test_to_step_records_argo_has_no_node_ready(rows):
    records = to_step_records(rows.values(), _ctx("argo", ARGO_RUN))
    assert [r.name for r in records] == ["pod_created", "pod_scheduled", "container_started"]
    assert records[-1].value == ts("09:00:51")


def test_to_step_records_mlflow_main_pod_is_the_training_step(rows):
    ctx = _ctx("mlflow", MLFLOW_RUN)
    records = to_step_records(rows.values(), ctx)
    assert [(r.step, r.name, r.value) for r in records] == [
        ("finetune", "pod_created", ts("09:00:03")),
        ("finetune", "pod_scheduled", ts("09:00:09")),
        ("finetune", "container_started", ts("09:00:50")),
    ]
    assert [r.step for r in to_step_records(rows.values(), ctx, aliases={})] == ["main"] * 3


def test_to_step_records_filters_steps_and_runs(rows):
    assert to_step_records(rows.values(), _ctx("mlflow", MLFLOW_RUN), steps=["evaluate"]) == []
    assert to_step_records(rows.values(), _ctx("kfp", "kfp-other")) == []


def test_to_step_records_numbers_every_attempt_by_pod_creation():
    base = {k: None for k in ROW_FIELDS} | {"orchestrator": "argo", "role": "executor", "step": "finetune",
                                            "pipeline_run": "p"}
    first = base | {"pod": "a", "created": 100.0, "scheduled": 101.0, "container_started": 110.0}
    retry = base | {"pod": "b", "created": 500.0, "scheduled": 501.0, "container_started": 505.0}
    ctx = RunContext(run_group="g", pipeline_run="p", orchestrator="argo", mode="cluster", submitted_at=90.0)
    records = to_step_records([retry, first], ctx)
    assert [(r.attempt, r.value) for r in records] == [(0, 100.0), (0, 101.0), (0, 110.0),
                                                       (1, 500.0), (1, 501.0), (1, 505.0)]
    assert (records[0].key == "p/finetune/event/pod_created"
            and records[3].key == "p/finetune/event/pod_created/attempt1")
    assert records[3].mlflow_key == "event.finetune.pod_created.attempt1"
    finetune = group_by_step(records)["finetune"]
    assert finetune.events["container_started"] == 505.0  # the step's own view: its last attempt
    assert finetune.first_start == 110.0  # spin-up: the first attempt's start, a retry does not move it
    assert [a.attempt for a in finetune.retried] == [0]


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-03-14T09:00:14Z", ts("09:00:14")),
        ("2025-03-14T09:00:10.204518Z", ts("09:00:10") + 0.204518),
        ("2025-03-14T09:00:10.123456789Z", ts("09:00:10") + 0.123456789),
        ("2025-03-14T11:00:14+02:00", ts("09:00:14")),
        ("2025-03-14T04:30:14-04:30", ts("09:00:14")),
        ("2025-03-14t09:00:14z", ts("09:00:14")),
        (None, None),
        ("", None),
    ],
)
def test_parse_time(text, expected):
    if expected is None:
        assert parse_time(text) is None
    else:
        assert parse_time(text) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("bad", ["yesterday", "2025-03-14", "2025-03-14T09:00:14", "2025-13-14T09:00:14Z", 1741942814])
def test_parse_time_rejects(bad):
    with pytest.raises(ValueError):
        parse_time(bad)


@given(
    st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2200, 1, 1)),
    st.integers(min_value=0, max_value=999_999),
    st.integers(min_value=-14 * 60, max_value=14 * 60),
)
def test_parse_time_round_trip(moment, micros, offset_min):
    moment = moment.replace(microsecond=micros, tzinfo=timezone.utc)
    local = moment.astimezone(timezone(timedelta(minutes=offset_min)))
    text = local.isoformat().replace("+00:00", "Z")
    assert parse_time(text) == pytest.approx(moment.timestamp(), abs=1e-6)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1m50.874s", 110.874), ("12.3s", 12.3), ("812.5ms", 0.8125), ("1h2m3s", 3723.0), ("0s", 0.0), ("250µs", 0.00025)],
)
def test_go_durations(text, seconds):
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "12", "s", "1m50.874", "abc", "1.2.3s"])
def test_go_durations_rejected(text):
    assert parse_go_duration(text) is None


@pytest.mark.parametrize(
    ("message", "seconds"),
    [
        ('Successfully pulled image "a/b:1" in 1m50.874s (1m50.874s including waiting). Image size: 9 bytes.', 110.874),
        ('Successfully pulled image "a/b:1" in 1.118s (21.904s including waiting). Image size: 9 bytes.', 21.904),
        ('Successfully pulled image "a/b:1" in 12.3s (12.3s including waiting)', 12.3),
        ('Successfully pulled image "a/b:1" in 47.912684205s', 47.912684205),
        ('Container image "a/b:1" already present on machine', 0.0),
        ('Successfully pulled image "a/b:1"', None),
        ('Pulling image "a/b:1"', None),
    ],
)
def test_pull_messages(message, seconds):
    got = pull_seconds_from_message(message)
    if seconds is None:
        assert got is None
    else:
        assert got == pytest.approx(seconds)


# --------------------------------------------------------------------------- classification and edge cases


def _pod(name: str, *, labels=None, annotations=None, containers=("main",), statuses=None, conditions=None, **meta):
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2025-03-14T09:00:00Z",
                     "labels": labels or {}, "annotations": annotations or {}, **meta},
        "spec": {"containers": [{"name": c} for c in containers], "nodeName": "n1"},
        "status": {"phase": "Running", "conditions": conditions or [], "containerStatuses": statuses or []},
    }


def test_kfp_roles_and_steps_from_node_names():
    wf = {"workflows.argoproj.io/workflow": "wf-1", "pipelines.kubeflow.org/v2_component": "true"}
    driver = _pod("wf-1-2650378426", labels=wf,
                  annotations={"workflows.argoproj.io/node-name": "wf-1.root.tokenize-driver"})
    executor = _pod("wf-1-1183460071", labels=wf,
                    annotations={"workflows.argoproj.io/node-name": "wf-1.root.tokenize.executor(0)"})
    root = _pod("wf-1-system-dag-driver-77", labels=wf,
                annotations={"workflows.argoproj.io/node-name": "wf-1.root-driver"})
    by_image = _pod("wf-1-9", labels=wf)
    by_image["spec"]["containers"] = [{"name": "wait"},
                                      {"name": "main", "image": "gcr.io/ml-pipeline/kfp-driver:2.3.0"}]
    rows = {r["pod"]: r for r in analyze([driver, executor, root, by_image])}
    assert ((rows[driver["metadata"]["name"]]["role"], rows[driver["metadata"]["name"]]["step"])
            == ("driver", "tokenize"))
    assert ((rows[executor["metadata"]["name"]]["role"], rows[executor["metadata"]["name"]]["step"])
            == ("executor", "tokenize"))
    assert (rows[root["metadata"]["name"]]["role"], rows[root["metadata"]["name"]]["step"]) == ("driver", "root")
    assert rows["wf-1-9"]["role"] == "driver"
    assert all(r["orchestrator"] == "kfp" for r in rows.values())


def test_argo_step_from_node_name_with_retry_suffix():
    pod = _pod(
        "wf-2-finetune-1",
        labels={"workflows.argoproj.io/workflow": "wf-2"},
        annotations={"workflows.argoproj.io/node-name": "wf-2.finetune(1)"},
        containers=("wait", "main"),
    )
    [row] = analyze([pod])
    assert (row["orchestrator"], row["role"], row["step"]) == ("argo", "executor", "finetune")


def test_mlflow_job_pod_recognised_without_our_labels():
    pod = _pod("proj-2025-x", labels={"job-name": "proj-2025"}, containers=("proj",))
    pod["spec"]["containers"][0]["env"] = [{"name": "MLFLOW_RUN_ID", "value": "abc"}]
    plain_job = _pod("other-job-x", labels={"job-name": "other-job"})
    [row] = analyze([pod, plain_job])
    assert ((row["pod"], row["orchestrator"], row["step"], row["orchestrator_run"])
            == ("proj-2025-x", "mlflow", None, "proj-2025"))


def test_unknown_orchestrator_label_value_and_unscheduled_pod():
    pod = _pod(
        "p",
        labels={"llmpack.io/orchestrator": "airflow", "llmpack.io/step": "finetune"},
        conditions=[{"type": "PodScheduled", "status": "False", "lastTransitionTime": "2025-03-14T09:00:00Z",
                     "reason": "Unschedulable"}],
    )
    [row] = analyze([pod])
    assert row["orchestrator"] == "unknown"
    assert row["scheduled"] is None and row["queue_s"] is None


def test_restarted_container_keeps_its_first_start():
    status = {
        "name": "main",
        "state": {"running": {"startedAt": "2025-03-14T09:10:00Z"}},
        "lastState": {"terminated": {"startedAt": "2025-03-14T09:01:00Z", "finishedAt": "2025-03-14T09:09:00Z"}},
    }
    [row] = analyze([_pod("p", labels={"llmpack.io/step": "finetune"}, statuses=[status])])
    assert row["container_started"] == ts("09:01:00") and row["finished"] is None


def _event(reason, pod, *, field_path=None, message="", event_time=None, first=None, uid=None):
    obj = {"kind": "Pod", "name": pod, "namespace": "ns"}
    if field_path:
        obj["fieldPath"] = field_path
    if uid:
        obj["uid"] = uid
    return {"metadata": {"name": f"{pod}.{reason}", "namespace": "ns"}, "reason": reason, "message": message,
            "involvedObject": obj, "eventTime": event_time, "firstTimestamp": first, "lastTimestamp": first}


def test_image_pull_from_event_times_when_the_message_has_no_duration():
    pod = _pod("p", labels={"llmpack.io/step": "finetune"})
    events = [
        _event("Pulling", "p", field_path="spec.containers{main}", event_time="2025-03-14T09:00:10.204518Z"),
        _event("Pulled", "p", field_path="spec.containers{main}", event_time="2025-03-14T09:00:48.318042Z",
               message='Successfully pulled image "x"'),
        _event("Pulling", "p", field_path="spec.initContainers{init}", first="2025-03-14T09:00:01Z"),
        _event("Pulled", "p", field_path="spec.initContainers{init}", first="2025-03-14T09:00:09Z"),
    ]
    [row] = analyze([pod], events=events)
    assert row["image_pull_s"] == pytest.approx(38.113524)  # the main container's only


def test_image_pull_events_without_field_path_and_of_another_pod_uid():
    pod = _pod("p", labels={"llmpack.io/step": "finetune"}, uid="uid-new")
    events = [
        _event("Pulling", "p", first="2025-03-14T09:00:10Z"),
        _event("Pulled", "p", first="2025-03-14T09:00:25Z"),
    ]
    [row] = analyze([pod], events=events)
    assert row["image_pull_s"] == 15.0
    stale = [{**e, "involvedObject": {**e["involvedObject"], "uid": "uid-old"}} for e in events]
    [row] = analyze([pod], events=stale)  # same name, earlier pod
    assert row["image_pull_s"] is None
