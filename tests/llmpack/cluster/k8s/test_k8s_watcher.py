"""PodWatcher with the real kubernetes client against the stand-in API server on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime

import pytest
from standins.k8s_api import KubeAPIStandIn, node_object, pod_states, pull_events, synthetic_run_group

from components.errors import InputError
from llmpack.cluster.k8s import watcher as watcher_module
from llmpack.cluster.k8s.api import build_api_client
from llmpack.cluster.k8s.podphases import all_terminated
from llmpack.cluster.k8s.watcher import PodWatcher

TOKEN = "standin-token-5f1c9e"
WRONG = "s3cr3t-wrong-token-9a7b"
NS = "llmpack"
RG = "cmp-test-1"
T0 = datetime.fromisoformat("2025-03-14T09:00:00+00:00").timestamp()


def labels(step: str, *, run_group: str = RG, workflow: str = "llm-finetune-w1",
           run: str = "argo-w1") -> dict[str, str]:
    return {
        "llmpack.io/run-group": run_group,
        "llmpack.io/pipeline-run": run,
        "llmpack.io/orchestrator": "argo",
        "llmpack.io/step": step,
        "workflows.argoproj.io/workflow": workflow,
    }


@pytest.fixture
def api():
    with KubeAPIStandIn(token=TOKEN, namespaces=("default", NS)) as server:
        yield server


@pytest.fixture
def client(api):
    return build_api_client(host=api.url, token=TOKEN)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> Callable[[], None]:
    """A play step that blocks until ``predicate()`` holds."""

    def step() -> None:
        end = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > end:
                raise TimeoutError("condition not reached")
            time.sleep(0.005)

    return step


def two_pods():
    """prepare-data on an old CPU node, finetune waiting for an autoscaled GPU node."""
    cpu = node_object("cpu-1", created=T0 - 86400, ready=T0 - 86000, instance_type="m6i.2xlarge")
    gpu = node_object("gpu-1", created=T0 + 40, ready=T0 + 150, instance_type="p5.48xlarge",
                      gpu_product="NVIDIA-H100-80GB-HBM3")
    prep = pod_states(
        "llm-finetune-w1-prepare-data-11", namespace=NS, labels=labels("prepare-data"),
        annotations={"workflows.argoproj.io/node-name": "llm-finetune-w1.prepare-data"},
        created=T0, scheduled=T0 + 1, node="cpu-1", sandbox=T0 + 2, initialized=T0 + 3, started=T0 + 5,
        finished=T0 + 20,
    )
    tune = pod_states(
        "llm-finetune-w1-finetune-22", namespace=NS, labels=labels("finetune"),
        annotations={"workflows.argoproj.io/node-name": "llm-finetune-w1.finetune"},
        created=T0 + 21, scheduled=T0 + 152, node="gpu-1", sandbox=T0 + 154, initialized=T0 + 160, started=T0 + 190,
        finished=T0 + 900, extra_running_updates=5,
    )
    return cpu, gpu, prep, tune


def check_final_rows(rows):
    by_step = {r["step"]: r for r in rows}
    assert set(by_step) == {"prepare-data", "finetune"}
    prep, tune = by_step["prepare-data"], by_step["finetune"]
    assert prep["phase"] == tune["phase"] == "Succeeded"
    assert (prep["queue_s"], prep["provision_s"], prep["start_s"], prep["run_s"]) == (1.0, None, 5.0, 15.0)
    assert prep["instance_type"] == "m6i.2xlarge"
    assert tune["created"] == T0 + 21
    assert tune["scheduled"] == T0 + 152
    assert tune["node_ready"] == T0 + 150
    assert tune["sandbox_ready"] == T0 + 154  # kept although the finished pod's condition turned False
    assert tune["init_done"] == T0 + 160
    assert tune["container_started"] == T0 + 190
    assert tune["finished"] == T0 + 900
    assert (tune["queue_s"], tune["provision_s"], tune["start_s"], tune["run_s"]) == (131.0, 129.0, 169.0, 710.0)
    assert (tune["instance_type"], tune["gpu_product"]) == ("p5.48xlarge", "NVIDIA-H100-80GB-HBM3")
    assert tune["image_pull_s"] == 27.5
    return prep, tune


def run_watcher(watcher: PodWatcher, **kwargs):
    kwargs.setdefault("until", all_terminated(steps=["prepare-data", "finetune"]))
    kwargs.setdefault("timeout_s", 10)
    return watcher.run(**kwargs)


# --------------------------------------------------------------------------- watching


def test_watch_receives_pods_over_time(api, client):
    cpu, gpu, prep, tune = two_pods()
    api.add_node(cpu)
    for event in pull_events("llm-finetune-w1-finetune-22", namespace=NS, pulling=T0 + 161, pulled=T0 + 188,
                             message_seconds="27.5s"):
        api.add_event(event)
    api.apply_pod(prep[0])  # already there when the watcher lists
    steps = [("apply", s) for s in prep[1:]] + [("node", gpu)] + [("apply", s) for s in tune]
    watcher = PodWatcher(client, NS, RG, window_s=1)
    api.play(steps, wait_for_watches=1, delay=0.005)
    rows = run_watcher(watcher)
    api.join_players()

    assert watcher.stopped_by == "condition"
    check_final_rows(rows)
    assert all(r["deleted"] is False for r in rows)
    assert watcher.stats["events"] >= len(steps) - 1  # the node is not a pod event
    assert watcher.pod_count == 2  # memory: one object per pod, whatever the number of events
    selectors = {f"llmpack.io/run-group={RG}"}  # no KFP runs given: one watch
    pod_requests = api.recorded("GET", f"/namespaces/{NS}/pods")
    lists = [r for r in pod_requests if not r.is_watch]
    watches = [r for r in pod_requests if r.is_watch]
    assert {r.query["labelSelector"] for r in lists} == {r.query["labelSelector"] for r in watches} == selectors
    assert all(int(w.query["resourceVersion"]) >= 1000 for w in watches)  # from the list, never "watch from now"
    assert all(r.authorized for r in api.requests)


def test_watch_survives_410_expiry_mid_watch(api, client):
    cpu, gpu, prep, tune = two_pods()
    api.add_node(cpu)
    api.add_node(gpu)
    for event in pull_events("llm-finetune-w1-finetune-22", namespace=NS, pulling=T0 + 161, pulled=T0 + 188,
                             message_seconds="27.5s"):
        api.add_event(event)
    watcher = PodWatcher(client, NS, RG, window_s=5)
    other_group = pod_states("other-1", namespace=NS, labels=labels("finetune", run_group="cmp-other"), created=T0,
                             scheduled=T0 + 1, node="cpu-1")
    steps = (
        [("apply", s) for s in prep]
        + [("apply", s) for s in tune[:3]]
        + [wait_until(lambda: watcher.stats["events"] >= len(prep) + 3)]
        + [("expire", None)]  # compaction: the open watches get ERROR 410 Expired ...
        # ... and these happen while the watcher re-lists: it sees them through the list or the new watch
        + [("delete", (NS, "llm-finetune-w1-prepare-data-11"))]
        + [("apply", s) for s in tune[3:]]
        + [("apply", s) for s in other_group]
    )
    api.play(steps, wait_for_watches=1)
    rows = run_watcher(watcher)
    api.join_players()

    assert api.expired_sent >= 1
    assert watcher.stats["expired"] >= 1 and watcher.stats["relists"] >= 1
    assert watcher.stopped_by == "condition"
    prep_row, _ = check_final_rows(rows)
    assert prep_row["deleted"] is True  # deleted during the gap: its last state is kept
    assert "other-1" not in {r["pod"] for r in rows}


@pytest.mark.parametrize("as_http_status", [False, True], ids=["error-event", "http-410"])
def test_watch_survives_410_on_a_too_old_resource_version(api, client, as_http_status):
    _, _, prep, _ = two_pods()
    api.expire_next_watches(1, as_http_status=as_http_status)  # the first watch is refused
    api.play([("apply", s) for s in prep], wait_for_watches=1)
    watcher = PodWatcher(client, NS, RG, window_s=1)
    rows = watcher.run(until=all_terminated(steps=["prepare-data"]), timeout_s=10)
    assert watcher.stats["relists"] >= 1 and api.expired_sent == 1
    [row] = rows
    assert (row["phase"], row["queue_s"], row["start_s"], row["run_s"]) == ("Succeeded", 1.0, 5.0, 15.0)


def test_window_end_resumes_from_last_resource_version(api, client):
    _, _, prep, _ = two_pods()
    api.play([("sleep", 1.3)] + [("apply", s) for s in prep], wait_for_watches=1)
    watcher = PodWatcher(client, NS, RG, window_s=1)
    rows = watcher.run(until=all_terminated(steps=["prepare-data"]), timeout_s=10)
    assert [r["phase"] for r in rows] == ["Succeeded"]
    watches = [r for r in api.recorded("GET", "/pods") if r.is_watch and RG in r.query["labelSelector"]]
    assert len(watches) >= 2 and int(watches[1].query["resourceVersion"]) >= int(watches[0].query["resourceVersion"])
    assert all(w.query.get("timeoutSeconds") == "1" for w in watches)


def test_kfp_pods_are_found_by_their_run_id(api, client):
    """KFP pod labels are fixed at compile time: no run group on them, only KFP's pipeline/runid."""
    wf = "llm-finetune-k7"
    kfp = {"pipelines.kubeflow.org/v2_component": "true", "workflows.argoproj.io/workflow": wf, "pipeline/runid": "r-1"}
    driver = pod_states(
        f"{wf}-system-container-driver-1", namespace=NS, labels=kfp,
        annotations={"workflows.argoproj.io/node-name": f"{wf}.root.finetune-driver"},
        created=T0, scheduled=T0, node="cpu-1", initialized=T0 + 1, started=T0 + 2, finished=T0 + 6,
    )
    executor = pod_states(
        f"{wf}-system-container-impl-2", namespace=NS,
        labels=kfp | {"llmpack.io/orchestrator": "kfp", "llmpack.io/step": "finetune",
                      "llmpack.io/pipeline": "llm-finetune"},
        annotations={"workflows.argoproj.io/node-name": f"{wf}.root.finetune.executor"},
        created=T0 + 8, scheduled=T0 + 9, node="cpu-1", initialized=T0 + 10, started=T0 + 12, finished=T0 + 30,
    )
    other_run = pod_states(
        "llm-finetune-zz-system-container-impl-9", namespace=NS,
        labels={**kfp, "workflows.argoproj.io/workflow": "llm-finetune-zz", "pipeline/runid": "r-2",
                "llmpack.io/orchestrator": "kfp", "llmpack.io/step": "finetune"},
        created=T0, scheduled=T0, node="cpu-1", initialized=T0 + 1, started=T0 + 2, finished=T0 + 3,
    )
    argo = pod_states("llm-finetune-w1-prepare-data-11", namespace=NS, labels=labels("prepare-data"), created=T0,
                      scheduled=T0 + 1, node="cpu-1", initialized=T0 + 3, started=T0 + 5, finished=T0 + 20)
    api.play([("apply", s) for s in driver + other_run + argo + executor], wait_for_watches=2)
    watcher = PodWatcher(client, NS, RG, window_s=1, run_ids={"r-1": "kfp-r1"})
    rows = watcher.run(until=all_terminated(steps=["finetune", "prepare-data"], min_pods=3), timeout_s=10)
    by_pod = {r["pod"]: r for r in rows}
    assert set(by_pod) == {driver[0]["metadata"]["name"], executor[0]["metadata"]["name"], argo[0]["metadata"]["name"]}
    d, e = by_pod[driver[0]["metadata"]["name"]], by_pod[executor[0]["metadata"]["name"]]
    assert ((d["role"], d["step"], d["run_group"], d["pipeline_run"], d["start_s"])
            == ("driver", "finetune", RG, "kfp-r1", 2.0))
    assert ((e["role"], e["step"], e["run_group"], e["pipeline_run"], e["start_s"])
            == ("executor", "finetune", RG, "kfp-r1", 4.0))
    selectors = {r.query["labelSelector"] for r in api.recorded("GET", "/pods") if r.is_watch}
    assert selectors == {f"llmpack.io/run-group={RG}",
                         "pipelines.kubeflow.org/v2_component=true,!llmpack.io/run-group,pipeline/runid in (r-1)"}
    assert watcher.pod_count == 3  # the other KFP run's pod was never sent


def test_memory_is_one_object_per_pod(api, client):
    pods = [
        pod_states(f"llm-finetune-w1-s{i}-{i}", namespace=NS, labels=labels(f"s{i}"), created=T0 + i,
                   scheduled=T0 + i + 1, node="cpu-1", initialized=T0 + i + 2, started=T0 + i + 3,
                   finished=T0 + i + 60, extra_running_updates=40)
        for i in range(3)
    ]
    steps = [("apply", s) for group in zip(*pods, strict=True) for s in group]
    api.play(steps, wait_for_watches=1)
    watcher = PodWatcher(client, NS, RG, window_s=1)
    rows = watcher.run(until=all_terminated(min_pods=3), timeout_s=10)
    assert watcher.stats["events"] == len(steps) == 3 * 45
    assert watcher.pod_count == 3 and len(rows) == 3
    assert all(r["phase"] == "Succeeded" for r in rows)


def test_a_backlog_sent_at_once_is_taken_whole_with_every_node_and_pull(api, client):
    """The benchmark's load (benchmarks/watcher_bench.py): every event logged at once, so the watch
    receives one backlog as fast as it reads; 6 nodes to read as pods land on them."""
    nodes, none_apart, stream = synthetic_run_group(48, 480, run_group=RG, namespace=NS, pulls_in_stream=True)
    for node in nodes:
        api.add_node(node)
    assert none_apart == []  # the pull events come in the backlog, as the kubelet makes them
    api.play([api.burst(stream)], wait_for_watches=2)
    watcher = PodWatcher(client, NS, RG, window_s=5)
    rows = watcher.run(until=all_terminated(min_pods=48), timeout_s=30)
    api.join_players()
    assert watcher.stopped_by == "condition" and watcher.stats["events"] == 480 and len(rows) == 48
    assert watcher.event_stats["listings"] == 1  # the event watch had every pull: no listing at the end
    assert all(r["phase"] == "Succeeded" and r["start_s"] is not None for r in rows)
    assert {r["instance_type"] for r in rows} == {"p5.48xlarge"} and {r["image_pull_s"] for r in rows} == {18.5}
    assert sorted(f["name"] for f in watcher.nodes()) == sorted(n["metadata"]["name"] for n in nodes)
    reads = api.recorded("GET", "/api/v1/nodes/")
    assert len(reads) == 2 * len(nodes)  # each node read once as a pod landed on it, and once more at the end


def test_rows_are_analysed_again_only_after_a_change(api, client, monkeypatch):
    calls = []
    real = watcher_module.analyze

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(watcher_module, "analyze", counted)
    cpu, _, prep, tune = two_pods()
    api.add_node(cpu)
    watcher = PodWatcher(client, NS, RG, window_s=1).start(timeout_s=30)
    api.play([("apply", s) for s in prep], wait_for_watches=1)
    wait_until(lambda: watcher.stats["events"] >= len(prep))()
    wait_until(lambda: len(watcher.nodes()) == 1)()
    first = watcher.rows()
    before = len(calls)
    again = watcher.rows()
    assert again == first and len(calls) == before  # the same state: the last analysis, not a new one
    again[0]["phase"] = "changed by the caller"
    assert watcher.rows()[0]["phase"] == "Succeeded"  # each caller gets its own rows
    api.apply_pod(tune[0])
    wait_until(lambda: watcher.stats["events"] >= len(prep) + 1)()
    assert [r["step"] for r in watcher.rows()] == ["prepare-data", "finetune"] and len(calls) == before + 1
    rows = watcher.finish()
    assert {r["step"]: r["phase"] for r in rows} == {"prepare-data": "Succeeded", "finetune": "Pending"}


def test_stop_from_another_thread_and_deadline(api, client):
    _, _, prep, _ = two_pods()
    api.apply_pod(prep[2])  # initialized, never finishes
    watcher = PodWatcher(client, NS, RG, window_s=1)
    threading.Timer(0.3, watcher.stop).start()
    start = time.monotonic()
    rows = watcher.run(timeout_s=10)
    assert watcher.stopped_by == "stop" and time.monotonic() - start < 3
    assert [r["phase"] for r in rows] == ["Pending"]

    watcher = PodWatcher(client, NS, RG, window_s=1)
    start = time.monotonic()
    watcher.run(timeout_s=0.4)
    assert watcher.stopped_by == "deadline" and time.monotonic() - start < 3


def test_start_in_the_background_and_finish(api, client):
    """The CLI's pattern: start watching, wait for the orchestrator to report the run over, finish."""
    _, _, prep, tune = two_pods()
    watcher = PodWatcher(client, NS, RG, window_s=1).start(timeout_s=30)
    api.play([("apply", s) for s in prep + tune], wait_for_watches=1)
    api.join_players()
    wait_until(lambda: watcher.stats["events"] >= len(prep) + len(tune))()
    rows = watcher.finish()
    assert watcher.stopped_by == "stop"
    assert {r["step"]: r["phase"] for r in rows} == {"prepare-data": "Succeeded", "finetune": "Succeeded"}

    wrong = build_api_client(host=api.url, token=WRONG)
    assert "401 Unauthorized" in _input_error(lambda: PodWatcher(wrong, NS, RG).start())  # at once, not in finish()


# --------------------------------------------------------------------------- image-pull events: watched


def _event_requests(api, *, watch: bool):
    return [r for r in api.recorded("GET", f"/namespaces/{NS}/events") if r.is_watch == watch]


def test_pull_events_are_watched_and_kept_after_the_server_expires_them(api, client):
    """The API server deletes events after an hour (--event-ttl): a run longer than that lost its
    first pulls to a listing at the end. Watched, they are kept, and no listing is needed at the end."""
    cpu, gpu, prep, tune = two_pods()
    api.add_node(cpu)
    api.add_node(gpu)
    pulls = pull_events("llm-finetune-w1-finetune-22", namespace=NS, pulling=T0 + 161, pulled=T0 + 188,
                        message_seconds="27.5s")
    prep_pulls = pull_events("llm-finetune-w1-prepare-data-11", namespace=NS, pulling=T0 + 3, pulled=T0 + 4)
    watcher = PodWatcher(client, NS, RG, window_s=5)
    steps = (
        [("apply", s) for s in prep] + [("event", e) for e in prep_pulls]
        + [("apply", s) for s in tune[:4]]  # initialized: kubelet pulls next
        + [("event", e) for e in pulls]
        + [wait_until(lambda: watcher.event_stats["events"] >= 4)]
        + [lambda: [api.delete_event(NS, e["metadata"]["name"]) for e in (*pulls, *prep_pulls)]]  # an hour went by
        + [("apply", s) for s in tune[4:]]
    )
    api.play(steps, wait_for_watches=2)  # the pod watch and the event watch
    rows = run_watcher(watcher)
    api.join_players()

    assert not api._events  # the server has none of them any more
    check_final_rows(rows)  # finetune's image_pull_s 27.5 among them
    assert {r["step"]: r["image_pull_s"] for r in rows}["prepare-data"] == 1.0
    assert len(_event_requests(api, watch=False)) == 1  # listed once at the start, not at the end
    watches = _event_requests(api, watch=True)
    assert watches and {w.query["fieldSelector"] for w in watches} == {"involvedObject.kind=Pod"}
    assert watcher.event_stats["events"] >= 8 and not watcher.warnings  # 4 ADDED, 4 DELETED


def test_a_started_pod_without_its_pulled_event_gets_a_last_listing(api, client):
    """The watch ran to the end, yet a pod that started a container has no Pulled event: the
    events are listed once more (what today's servers still hold), so a lost one is found."""
    _, _, prep, _ = two_pods()
    api.play([("apply", s) for s in prep], wait_for_watches=2)
    watcher = PodWatcher(client, NS, RG, window_s=5)
    [row] = watcher.run(until=all_terminated(steps=["prepare-data"]), timeout_s=10)
    api.join_players()
    assert row["image_pull_s"] is None
    assert len(_event_requests(api, watch=False)) == 2  # at the start, and the last one


def test_an_event_watch_refused_by_rbac_falls_back_to_listing():
    """RBAC with list but not watch on events: one warning, then the listing as before, the last at the end."""
    with KubeAPIStandIn(token=TOKEN, namespaces=(NS,), forbidden={"watch events"}) as api:
        client = build_api_client(host=api.url, token=TOKEN)
        _, _, prep, _ = two_pods()
        pulls = pull_events("llm-finetune-w1-prepare-data-11", namespace=NS, pulling=T0 + 3, pulled=T0 + 6)
        watcher = PodWatcher(client, NS, RG, window_s=1)
        api.play([("apply", s) for s in prep[:3]] + [("event", e) for e in pulls]
                 + [wait_until(lambda: watcher.warnings)] + [("apply", s) for s in prep[3:]], wait_for_watches=1)
        [row] = watcher.run(until=all_terminated(steps=["prepare-data"]), timeout_s=10)
        api.join_players()
        assert row["image_pull_s"] == 3.0
        assert [w for w in watcher.warnings if "watching events failed (403" in w]
        assert len(_event_requests(api, watch=False)) == 2


def test_the_event_watch_survives_410_expiry(api, client):
    _, _, prep, _ = two_pods()
    pulls = pull_events("llm-finetune-w1-prepare-data-11", namespace=NS, pulling=T0 + 3, pulled=T0 + 5)
    watcher = PodWatcher(client, NS, RG, window_s=5)
    steps = (
        [("apply", s) for s in prep[:3]]
        + [("expire", None)]  # both watches get ERROR 410 Expired; the pulls come while they re-list
        + [("event", e) for e in pulls]
        + [wait_until(lambda: watcher.event_stats["expired"] >= 1 and watcher.stats["expired"] >= 1)]
        + [("apply", s) for s in prep[3:]]
    )
    api.play(steps, wait_for_watches=2)
    [row] = watcher.run(until=all_terminated(steps=["prepare-data"]), timeout_s=10)
    api.join_players()
    assert row["image_pull_s"] == 2.0 and not watcher.warnings
    # the first listing and the re-list after the 410; none at the end
    assert len(_event_requests(api, watch=False)) == 2


def test_an_error_beside_the_started_pod_watch_leaves_no_watch_running(api, client, monkeypatch):
    """The pod watches start before the node reads and the event listing: an error there stops them."""
    from llmpack.cluster.k8s.sidereads import SideReads

    def broken(self):
        raise RuntimeError("a bug in the node reads")

    monkeypatch.setattr(SideReads, "fetch_nodes", broken)
    watcher = PodWatcher(client, NS, RG, window_s=1)
    with pytest.raises(RuntimeError, match="a bug in the node reads"):
        watcher.run(timeout_s=10)
    wait_until(lambda: api.open_watches == 0, timeout=5)()  # the window ended and no watch was reopened
    time.sleep(1.2)
    assert api.open_watches == 0


def test_forbidden_nodes_and_events_degrade_with_warnings():
    with KubeAPIStandIn(token=TOKEN, namespaces=(NS,), forbidden={"nodes", "events"}) as api:
        client = build_api_client(host=api.url, token=TOKEN)
        cpu, _, prep, _ = two_pods()
        api.add_node(cpu)
        api.play([("apply", s) for s in prep], wait_for_watches=1)
        watcher = PodWatcher(client, NS, RG, window_s=1)
        [row] = watcher.run(until=all_terminated(steps=["prepare-data"]), timeout_s=10)
    assert row["start_s"] == 5.0 and row["instance_type"] is None and row["image_pull_s"] is None
    assert any("nodes" in w for w in watcher.warnings) and any("events" in w for w in watcher.warnings)


# --------------------------------------------------------------------------- errors: one line, never the token


def _input_error(fn: Callable[[], object]) -> str:
    with pytest.raises(InputError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message and TOKEN not in message and WRONG not in message
    return message


def test_wrong_token_is_a_clear_401_without_the_token(api, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    client = build_api_client(host=api.url, token=WRONG)
    message = _input_error(lambda: PodWatcher(client, NS, RG, window_s=1).run(timeout_s=5))
    assert message == (f"Kubernetes API at {api.url}: 401 Unauthorized: "
                       "the token or kubeconfig credentials were rejected")
    captured = capsys.readouterr()
    assert WRONG not in caplog.text + captured.out + captured.err
    assert not any(r.authorized for r in api.requests)


def test_forbidden_pods_is_a_clear_403():
    with KubeAPIStandIn(token=TOKEN, namespaces=(NS,), forbidden={"pods"}) as api:
        client = build_api_client(host=api.url, token=TOKEN)
        message = _input_error(lambda: PodWatcher(client, NS, RG).run(timeout_s=5))
    assert message.startswith(f"Kubernetes API at {api.url}: 403 Forbidden: "
                              "not allowed to list pods in namespace 'llmpack'")


def test_unknown_namespace(api, client):
    message = _input_error(lambda: PodWatcher(client, "nope", RG).run(timeout_s=5))
    assert message == f"namespace 'nope' not found on the Kubernetes API at {api.url}"


def test_unreachable_endpoint():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = build_api_client(host=f"http://127.0.0.1:{port}", token=TOKEN)
    start = time.monotonic()
    message = _input_error(lambda: PodWatcher(client, NS, RG).run(timeout_s=5))
    assert message.startswith(f"cannot reach the Kubernetes API at http://127.0.0.1:{port} (connection refused)")
    assert time.monotonic() - start < 5


def test_no_kubeconfig_and_no_endpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    message = _input_error(build_api_client)
    assert message.startswith("no Kubernetes cluster configured") and "--kubeconfig" in message
    assert "host and token" in message
    assert (_input_error(lambda: build_api_client(kubeconfig=tmp_path / "missing"))
            == f"--kubeconfig {tmp_path / 'missing'}: no such file")
    assert "http" in _input_error(lambda: build_api_client(host="127.0.0.1:6443"))


def _kubeconfig(tmp_path, server: str, token: str, context: str = "standin") -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "standin", "cluster": {"server": server}}],
        "users": [{"name": "runner", "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": "standin", "user": "runner", "namespace": NS}}],
        "current-context": context,
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return str(path)


def test_client_from_kubeconfig(api, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", _kubeconfig(tmp_path, api.url, TOKEN))
    client = build_api_client()
    _, _, prep, _ = two_pods()
    api.play([("apply", s) for s in prep], wait_for_watches=1)
    [row] = PodWatcher(client, NS, RG, window_s=1).run(until=all_terminated(steps=["prepare-data"]), timeout_s=10)
    assert row["run_s"] == 15.0

    message = _input_error(lambda: build_api_client(kubeconfig=_kubeconfig(tmp_path, api.url, TOKEN), context="absent"))
    assert message.startswith(f"kubeconfig {tmp_path / 'kubeconfig'}: ")
    (tmp_path / "broken").write_text(f"users: [{{token: {TOKEN}\n")  # YAML errors would quote the token
    message = _input_error(lambda: build_api_client(kubeconfig=tmp_path / "broken"))
    assert message.startswith(f"kubeconfig {tmp_path / 'broken'}: not a usable kubeconfig (")


def test_kubeconfig_with_a_wrong_token(api, tmp_path):
    client = build_api_client(kubeconfig=_kubeconfig(tmp_path, api.url, WRONG))
    message = _input_error(lambda: PodWatcher(client, NS, RG).run(timeout_s=5))
    assert "401 Unauthorized" in message


def test_tls_to_a_plain_http_endpoint_is_named(api):
    client = build_api_client(host=api.url.replace("http://", "https://"), token=TOKEN)
    message = _input_error(lambda: PodWatcher(client, NS, RG).run(timeout_s=5))
    assert message.startswith(f"cannot reach the Kubernetes API at https://127.0.0.1:{api.port} (TLS error: ")


def test_token_with_bearer_prefix_and_from_a_file(api, tmp_path):
    _, _, prep, _ = two_pods()
    api.apply_pod(prep[-1])
    rows = PodWatcher(build_api_client(host=api.url, token=f"Bearer {TOKEN}"), NS, RG, window_s=1).run(timeout_s=5)
    assert [r["phase"] for r in rows] == ["Succeeded"]
    (tmp_path / "token").write_text(TOKEN + "\n")
    rows = PodWatcher(build_api_client(host=api.url, token_file=tmp_path / "token"), NS, RG,
                      window_s=1).run(timeout_s=5)
    assert [r["phase"] for r in rows] == ["Succeeded"]
    assert _input_error(lambda: build_api_client(host=api.url, token_file=tmp_path / "nope")).startswith(
        f"{tmp_path / 'nope'}: cannot read the token file"
    )
