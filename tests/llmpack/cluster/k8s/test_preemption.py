"""Preemption as its own outcome (llmpack.cluster.k8s.preemption): read from DisruptionTarget, a node's
termination and Kueue's Workload conditions; kept by the watcher's slim pods; its waste priced.

Pure functions on API-shaped objects: quick (well under a second together).
"""

from __future__ import annotations

from typing import Any

import pytest
from standins.k8s_api import _iso, iter_pod_states, node_object

from components.record.telemetry import StepTimes
from llmpack.cluster.k8s import kueue
from llmpack.cluster.k8s.podphases import analyze
from llmpack.cluster.k8s.preemption import (
    attempt_outcome,
    node_terminated_at,
    preemption_metrics,
    workload_disruption,
)
from llmpack.cluster.k8s.slim import slim_node, slim_pod

T0 = 1_780_000_000.0
LABELS = {"llmpack.io/run-group": "rg", "llmpack.io/pipeline-run": "p", "llmpack.io/step": "finetune",
          "llmpack.io/orchestrator": "argo"}


def pod(name: str, *, created: float, finished: float, failed: bool = False, node: str = "gpu-1",
        disruption: str | None = None) -> dict[str, Any]:
    states = list(iter_pod_states(name, labels=LABELS, created=created, scheduled=created + 1, node=node,
                                  initialized=created + 2, started=created + 3, finished=finished, failed=failed))
    last = states[-1]
    if disruption:
        last["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": disruption,
                                             "lastTransitionTime": _iso(finished - 1)})
    return last


def gpu_node(**extra: Any) -> dict[str, Any]:
    node = node_object("gpu-1", created=T0 - 100, ready=T0 - 90, instance_type="p5.48xlarge", gpu_product="NVIDIA-H100")
    node["metadata"].update(extra.get("metadata", {}))
    node["spec"].update(extra.get("spec", {}))
    return node


@pytest.mark.parametrize("reason", ["PreemptionByScheduler", "DeletionByTaintManager", "EvictionByEvictionAPI",
                                    "TerminationByKubelet"])
def test_disruption_target_makes_the_attempt_preempted_and_slim_keeps_it(reason: str) -> None:
    pods = [pod("a", created=T0, finished=T0 + 30, failed=True, disruption=reason)]
    full = analyze(pods, [gpu_node()])
    slim = analyze([slim_pod(p) for p in pods], [slim_node(gpu_node())])
    assert full == slim
    row = full[0]
    assert (row["outcome"], row["disruption"], row["disrupted_at"]) == ("preempted", reason, T0 + 29)


def test_a_plain_failure_is_failed_and_a_success_succeeded() -> None:
    rows = analyze([pod("a", created=T0, finished=T0 + 30, failed=True), pod("b", created=T0 + 40, finished=T0 + 80)],
                   [gpu_node()])
    assert [(r["pod"], r["outcome"], r["disruption"]) for r in rows] == [("a", "failed", None),
                                                                         ("b", "succeeded", None)]
    assert attempt_outcome({"phase": "Running"}) == "running"
    assert attempt_outcome({"phase": "Running", "deleted": True}) == "failed"


def test_the_node_going_away_while_the_pod_ran_is_a_preemption() -> None:
    spot = {"spec": {"taints": [{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule",
                                 "timeAdded": _iso(T0 + 20)}]}}
    rows = analyze([pod("a", created=T0, finished=T0 + 30, failed=True)], [slim_node(gpu_node(**spot))])
    assert ((rows[0]["outcome"], rows[0]["disruption"], rows[0]["disrupted_at"])
            == ("preempted", "NodeTermination", T0 + 20))
    # removed after the pod finished: the usual scale-down, no preemption
    later = gpu_node(metadata={"deletionTimestamp": _iso(T0 + 600)})
    assert analyze([pod("a", created=T0, finished=T0 + 30)], [later])[0]["outcome"] == "succeeded"
    assert node_terminated_at(later) == T0 + 600
    assert node_terminated_at(gpu_node()) is None


def test_kueue_evicted_or_preempted_workload() -> None:
    wl = {"status": {"conditions": [
        {"type": "Admitted", "status": "True", "lastTransitionTime": _iso(T0)},
        {"type": "Evicted", "status": "True", "reason": "Preempted", "lastTransitionTime": _iso(T0 + 50)}]}}
    assert workload_disruption(wl) == ("KueuePreempted", T0 + 50)
    assert kueue.evicted(wl) == ("KueuePreempted", T0 + 50)
    wl["status"]["conditions"][1]["status"] = "False"
    assert kueue.evicted(wl) is None and kueue.evicted(None) is None


def test_waste_is_gpu_time_since_the_checkpoint_plus_the_retrys_spin_up() -> None:
    """A 2-GPU finetune pod preempted at T0+33 (checkpoint at T0+30); the retry pod starts at T0+43, its first step
    T0+50."""
    rows = analyze([pod("a", created=T0, finished=T0 + 34, failed=True, disruption="PreemptionByScheduler"),
                    pod("b", created=T0 + 40, finished=T0 + 90)], [gpu_node()])
    a0 = StepTimes(step="finetune", events={"process_started": T0 + 4, "model_loaded": T0 + 6, "first_step": T0 + 8,
                                            "checkpoint_saved": T0 + 30}, metrics={}, attempt=0)
    a1 = StepTimes(step="finetune", events={"process_started": T0 + 44, "model_loaded": T0 + 47, "first_step": T0 + 50,
                                            "finished": T0 + 88}, metrics={"train_s": 38.0}, attempt=1)
    steps = {"finetune": StepTimes(step="finetune", events=a1.events, metrics=a1.metrics, attempt=1, attempts=(a0, a1))}
    retry_h = 2 * 31 / 3600.0  # what billing counts as the retried attempt: container start to finish
    m, attempts = preemption_metrics(rows, steps, {"finetune": 2}, 4.0, retry_gpu_hours=retry_h)
    assert [a["outcome"] for a in attempts] == ["preempted", "succeeded"]
    waste_s = 2 * ((33 - 30) + (50 - 43))  # GPUs x (since checkpoint + retry container start -> first step)
    assert m["preemptions"] == 1
    assert m["preemption_waste_gpu_hours"] == pytest.approx(waste_s / 3600.0)
    assert m["preemption_waste_usd"] == pytest.approx(waste_s / 3600.0 * 4.0)
    assert m["time_to_recover_s"] == pytest.approx(50 - 33)
    assert m["preempted_gpu_hours"] == pytest.approx(2 * (34 - 3) / 3600.0)
    assert m["failure_retry_gpu_hours"] == pytest.approx(0.0)
    assert m["kept_train_s"] == pytest.approx(38.0 + (30 - 8))
    # no checkpoint: everything since the container started is lost
    a0.events.pop("checkpoint_saved")
    m, _ = preemption_metrics(rows, steps, {"finetune": 2}, None)
    assert m["preemption_waste_gpu_hours"] == pytest.approx(2 * ((33 - 3) + 7) / 3600.0)
    assert m["preemption_waste_usd"] is None and m["kept_train_s"] == pytest.approx(38.0)


def test_a_preempted_pod_whose_end_was_never_seen_is_billed_to_its_disruption() -> None:
    """The node went away under a running pod, which was deleted with it: the watcher's last state
    of the pod is Running, with no finish. The bill counts its GPU time to the node's termination,
    as the preemption figures do, so failure retries are not the preempted attempt's hours again."""
    from components.record import cost
    from llmpack.cluster.k8s.billing import cluster_cost

    gone = {"spec": {"taints": [{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule",
                                 "timeAdded": _iso(T0 + 33)}]}}
    states = list(iter_pod_states("a", labels=LABELS, created=T0, scheduled=T0 + 1, node="gpu-1", initialized=T0 + 2,
                                  started=T0 + 3, finished=T0 + 600))
    running = next(s for s in states if s["status"]["phase"] == "Running")  # the last state the watcher saw
    rows = analyze([running, pod("b", created=T0 + 40, finished=T0 + 90)], [slim_node(gpu_node(**gone))])
    rows[0]["deleted"] = True
    assert (rows[0]["finished"], rows[0]["disrupted_at"], attempt_outcome(rows[0])) == (None, T0 + 33, "preempted")
    for row in rows:
        row["outcome"] = attempt_outcome(row)
    a1 = StepTimes(step="finetune", events={"process_started": T0 + 44, "first_step": T0 + 50, "finished": T0 + 88},
                   metrics={"train_s": 38.0}, attempt=1)
    steps = {"finetune": StepTimes(step="finetune", events=a1.events, metrics=a1.metrics, attempt=1,
                                   attempts=(StepTimes(step="finetune", events={}, metrics={}, attempt=0), a1))}
    uses = [cost.GpuUse(step="finetune", gpus=2, gpu_type="nvidia-h100-80gb")]
    bill = cluster_cost(steps, rows, uses, "argo", None)
    assert bill["gpu_hours"] * 3600 == pytest.approx(2 * ((33 - 3) + (90 - 43)))  # was the retry's alone
    assert bill["retry_gpu_hours"] * 3600 == pytest.approx(2 * 30)
    m, _ = preemption_metrics(rows, steps, {"finetune": 2}, None, retry_gpu_hours=bill["retry_gpu_hours"])
    assert m["preempted_gpu_hours"] == pytest.approx(bill["retry_gpu_hours"])  # the same hours, both ways
    assert m["failure_retry_gpu_hours"] == pytest.approx(0.0)


# --------------------------------------------------------------------------- --preempt on a real cluster: an Eviction


@pytest.fixture()
def kube() -> Any:
    from standins.k8s_api import KubeAPIStandIn

    api = KubeAPIStandIn(token="t0k", namespaces=("llmpack",)).start()
    yield api
    api.close()


def running_pod(name: str, started: float) -> dict[str, Any]:
    states = list(iter_pod_states(name, labels=LABELS, created=started - 3, scheduled=started - 2, node="gpu-1",
                                  initialized=started - 1, started=started))
    return states[-1]


def test_the_injector_evicts_the_step_pod_when_due_and_the_record_reads_a_preemption(kube: Any) -> None:
    import time

    from llmpack.cluster.k8s.api import build_api_client
    from llmpack.cluster.k8s.preempt_inject import PreemptInjector
    from llmpack.cluster.k8s.preemption import PreemptSpec
    from llmpack.cluster.k8s.watcher import PodWatcher

    started = float(int(time.time())) - 10
    kube.apply_pod(running_pod("ft-0", started))
    client = build_api_client(host=kube.url, token="t0k")
    watcher = PodWatcher(client, "llmpack", "rg").start()
    try:
        now = [started + 29.0]
        inject = PreemptInjector(client, PreemptSpec(step="finetune", at_s=30), watcher.rows, pod_steps={"finetune"},
                                 clock=lambda: now[0])
        assert inject.step() is False and inject.evictions == []  # not due yet
        now[0] = started + 30.0
        assert inject.step() is False
        assert [e["pod"] for e in inject.evictions] == ["ft-0"] and kube.evictions == [("llmpack", "ft-0")]
        deadline = time.monotonic() + 5
        while not any(r.get("deleted") for r in watcher.rows()) and time.monotonic() < deadline:
            time.sleep(0.02)
        row = next(r for r in watcher.rows() if r["pod"] == "ft-0")
        assert (row["outcome"], row["disruption"], row["deleted"]) == ("preempted", "EvictionByEvictionAPI", True)
        # the retry pod runs on: a fixed moment preempts once
        kube.apply_pod(running_pod("ft-1", started + 40))
        now[0] = started + 200.0
        assert inject.step() is True and len(kube.evictions) == 1
    finally:
        watcher.finish()
        client.close()


def test_the_injector_does_nothing_when_the_cluster_preempted_first() -> None:
    from llmpack.cluster.k8s.preempt_inject import PreemptInjector
    from llmpack.cluster.k8s.preemption import PreemptSpec

    rows = [{"pod": "a", "step": "finetune", "role": "executor", "created": T0, "container_started": T0 + 3,
             "phase": "Failed", "disruption": "PreemptionByScheduler"},
            {"pod": "b", "step": "finetune", "role": "executor", "created": T0 + 40, "container_started": T0 + 43,
             "phase": "Running"}]
    inject = PreemptInjector(None, PreemptSpec(step="finetune", at_s=5), lambda: rows, pod_steps={"finetune"},
                             clock=lambda: T0 + 1000)
    assert inject.step() is True and inject.evictions == []


# -------------------------------------------------------------------- a TrainJob gang: one attempt of all its node pods


def gang_row(pod: str, node: int, *, created: float, started: float, finished: float, ok: bool,
             disrupted: float | None = None) -> dict[str, Any]:
    return {"pod": pod, "step": "finetune", "role": "executor", "gang": "tj", "gang_node": node, "gang_gpus": 4,
            "created": created, "node_ready": created - 60, "container_started": started, "finished": finished,
            "phase": "Succeeded" if ok else "Failed", "deleted": not ok,
            "disruption": "PreemptionByScheduler" if disrupted else None, "disrupted_at": disrupted}


GANG_ROWS = [
    {"pod": "launcher", "step": "finetune", "role": "executor", "created": T0, "container_started": T0 + 2,
     "finished": T0 + 82, "phase": "Succeeded"},
    gang_row("tj-node-0-0-a", 0, created=T0 + 10, started=T0 + 20, finished=T0 + 40, ok=False),
    gang_row("tj-node-0-1-b", 1, created=T0 + 10, started=T0 + 22, finished=T0 + 40, ok=False, disrupted=T0 + 39),
    gang_row("tj-node-0-0-c", 0, created=T0 + 41, started=T0 + 44, finished=T0 + 80, ok=True),  # JobSet's restart
    gang_row("tj-node-0-1-d", 1, created=T0 + 41, started=T0 + 45, finished=T0 + 80, ok=True),
]


def test_a_preempted_gang_is_one_attempt_its_waste_over_every_node_pod() -> None:
    """Node 1 of a 2x4 gang preempted at T0+39 (the gang's checkpoint at T0+35); JobSet recreates both node pods,
    which start at T0+44/45; the restarted gang's first step at T0+50."""
    a0 = StepTimes(step="finetune", events={"first_step": T0 + 25, "checkpoint_saved": T0 + 35}, metrics={}, attempt=0)
    a1 = StepTimes(step="finetune", events={"first_step": T0 + 50, "finished": T0 + 81}, metrics={"train_s": 30.0},
                   attempt=1)
    steps = {"finetune": StepTimes(step="finetune", events=a1.events, metrics=a1.metrics, attempt=1, attempts=(a0, a1))}
    m, attempts = preemption_metrics(GANG_ROWS, steps, {"finetune": 0}, 4.0, retry_gpu_hours=0.01)
    assert [(a["outcome"], bool(a.get("gang"))) for a in attempts] == [("succeeded", False), ("preempted", True),
                                                                       ("succeeded", True)]
    gang = attempts[1]
    assert gang["pods"] == ["tj-node-0-0-a", "tj-node-0-1-b"] and gang["gpus"] == 8
    assert (gang["reason"], gang["disrupted_at"]) == ("PreemptionByScheduler", T0 + 39)
    waste_s = 4 * (39 - 35) * 2 + 4 * (50 - 44) + 4 * (50 - 45)  # every node pod since the checkpoint; every respin
    assert m["preemptions"] == 1
    assert m["preemption_waste_gpu_hours"] == pytest.approx(waste_s / 3600.0)
    assert m["preemption_waste_usd"] == pytest.approx(waste_s / 3600.0 * 4.0)
    assert (gang["lost_s"], gang["respin_s"]) == (pytest.approx(4.0), pytest.approx(6.0))
    assert m["time_to_recover_s"] == pytest.approx(50 - 39)
    assert m["preempted_gpu_hours"] == pytest.approx(4 * ((40 - 20) + (40 - 22)) / 3600.0)
    assert m["failure_retry_gpu_hours"] == pytest.approx(0.01)  # a gang's pods are never in the failure retries
    assert m["kept_train_s"] == pytest.approx(30.0 + (35 - 25))
    # the ranks logged no attempt of the preempted gang (a real gang's ranks log the launcher's attempt number):
    # no checkpoint is known, so every node pod's GPU time since its start is lost
    only = {"finetune": StepTimes(step="finetune", events=a1.events, metrics=a1.metrics, attempt=0)}
    m, _ = preemption_metrics(GANG_ROWS, only, {"finetune": 0}, None)
    assert m["preemption_waste_gpu_hours"] == pytest.approx((4 * (39 - 20) + 4 * (39 - 22) + 4 * 6 + 4 * 5) / 3600.0)


def test_the_injector_evicts_a_node_pod_of_a_gang_never_its_launcher() -> None:
    from llmpack.cluster.k8s.preempt_inject import PreemptInjector
    from llmpack.cluster.k8s.preemption import PreemptSpec

    rows = [dict(r, phase="Running", finished=None, deleted=False, disruption=None) for r in GANG_ROWS[:3]]
    inject = PreemptInjector(None, PreemptSpec(step="finetune", at_s=5), lambda: rows, pod_steps={"finetune"},
                             clock=lambda: T0 + 26, gang=True)
    evicted: list[str] = []
    inject._evict = lambda row: evicted.append(row["pod"])  # type: ignore[method-assign]
    assert inject.step() is False and evicted == []  # due 5 s after the newest node pod's start (T0+22)
    inject.clock = lambda: T0 + 27
    assert inject.step() is False and evicted == ["tj-node-0-1-b"]
    rows[2]["disruption"] = "EvictionByEvictionAPI"
    assert inject.step() is True  # once: the gang was preempted
