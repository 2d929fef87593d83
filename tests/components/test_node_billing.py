"""Node billing on a cluster (``components.record.cost.bill_nodes``): GPU nodes billed the way clouds
bill them, from node Ready to removal, or to the last pod's finish + the autoscaler's
scale-down delay when the watcher did not see the removal; shared nodes split by pod time."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.errors import InputError
from components.record.cost import DEFAULT_SCALE_DOWN_DELAY_S, NodeSpan, PodSpan, bill_nodes
from llmpack.cluster.k8s import billing
from llmpack.cluster.k8s.dumps import load_events, load_nodes, load_pods
from llmpack.cluster.k8s.podphases import analyze
from llmpack.cluster.k8s.slim import node_facts, slim_node
from llmpack.report import rebill

FIXTURES = Path(__file__).parents[1] / "fixtures" / "k8s"
T0 = 1_800_000_000.0
GPUS = {"prepare-data": 0, "tokenize": 0, "finetune": 1, "evaluate": 1, "register": 0}


def pod(run: str, node: str = "gpu-1", *, created: float, scheduled: float, started: float, finished: float | None,
        gpus: int = 1) -> PodSpan:
    return PodSpan(run=run, node=node, gpus=gpus, created=T0 + created, scheduled=T0 + scheduled, started=T0 + started,
                   finished=None if finished is None else T0 + finished)


def new_node(removed: float | None = None, gpus: int = 8) -> dict[str, NodeSpan]:
    """A node the autoscaler brought up for a pod created at T0: object at +5 s, Ready at +65 s."""
    return {"gpu-1": NodeSpan(name="gpu-1", gpus=gpus, created=T0 + 5, ready=T0 + 65,
                              removed=None if removed is None else T0 + removed)}


def test_removal_seen_bills_ready_to_removal() -> None:
    pods = [pod("r1", created=0, scheduled=66, started=80, finished=380),
            pod("r1", created=390, scheduled=391, started=392, finished=452)]
    bill = bill_nodes(new_node(removed=500), pods)["r1"]
    assert bill.gpu_seconds == 8 * (500 - 65)  # Ready -> removal, all 8 GPUs of the node
    assert bill.tail_gpus == 0 and bill.nodes == ("gpu-1",)


def test_removal_not_seen_bills_the_scale_down_delay() -> None:
    pods = [pod("r1", created=0, scheduled=66, started=80, finished=380),
            pod("r1", created=390, scheduled=391, started=392, finished=452)]
    assert DEFAULT_SCALE_DOWN_DELAY_S == 600
    bill = bill_nodes(new_node(), pods)["r1"]
    assert bill.gpu_seconds == 8 * (452 + 600 - 65)  # last pod's finish + 10 minutes
    assert bill.tail_gpus == 8
    assert bill_nodes(new_node(), pods, scale_down_delay_s=60)["r1"].gpu_seconds == 8 * (452 + 60 - 65)


def test_a_removal_before_the_last_pod_finished_still_bills_that_pod() -> None:
    pods = [pod("r1", created=0, scheduled=66, started=80, finished=380)]
    assert bill_nodes(new_node(removed=300), pods)["r1"].gpu_seconds == 8 * (380 - 65)


def test_a_node_already_running_is_billed_from_the_first_pods_scheduling() -> None:
    nodes = {"gpu-1": NodeSpan(name="gpu-1", gpus=4, created=T0 - 7200, ready=T0 - 7100)}
    pods = [pod("r1", created=0, scheduled=2, started=30, finished=330)]
    assert bill_nodes(nodes, pods)["r1"].gpu_seconds == 4 * (330 + 600 - 2)


def test_a_shared_node_is_billed_once_and_split_by_pod_gpu_seconds() -> None:
    # Two runs on one new node: r1 held it 100 s, r2 300 s (container start to finish).
    pods = [pod("r1", created=0, scheduled=66, started=70, finished=170),
            pod("r2", created=10, scheduled=66, started=75, finished=375)]
    bills = bill_nodes(new_node(), pods)
    node_s = 8 * (375 + 600 - 65)
    assert bills["r1"].gpu_seconds + bills["r2"].gpu_seconds == pytest.approx(node_s)
    assert (bills["r1"].gpu_seconds == pytest.approx(node_s / 4)
            and bills["r2"].gpu_seconds == pytest.approx(node_s * 3 / 4))
    assert bills["r1"].tail_gpus == pytest.approx(2) and bills["r2"].tail_gpus == pytest.approx(6)


def test_a_node_reused_by_a_later_run_within_the_delay_is_billed_once() -> None:
    # r2 lands on r1's node 100 s after r1 ended (inside the 600 s delay): one window, not two.
    pods = [pod("r1", created=0, scheduled=66, started=70, finished=370),
            pod("r2", created=470, scheduled=471, started=472, finished=772)]
    bills = bill_nodes(new_node(), pods)
    assert sum(b.gpu_seconds for b in bills.values()) == pytest.approx(8 * (772 + 600 - 65))
    alone = [bill_nodes(new_node(), [p])[p.run].gpu_seconds for p in pods]
    assert sum(alone) > sum(b.gpu_seconds for b in bills.values())  # billed apart, the overlap counts twice


def test_pods_on_unknown_nodes_and_cpu_pods_are_not_node_billed() -> None:
    pods = [pod("r1", node="unread", created=0, scheduled=1, started=2, finished=3),
            pod("r1", created=0, scheduled=66, started=70, finished=170, gpus=0)]
    assert bill_nodes(new_node(), pods) == {}


def test_recorded_shared_node_mlflow_and_argo() -> None:
    """The recorded dump: MLflow's Job pod and Argo's finetune pod shared ip-10-0-7-58, a GPU node
    up for hours before (billed from the first pod's scheduling); its removal is not in the dump."""
    rows = analyze(load_pods(FIXTURES / "pods.json"), load_nodes(FIXTURES / "nodes.json"),
                   load_events(FIXTURES / "events.json"))
    pods = billing.pod_spans(rows, GPUS)
    nodes = billing.node_spans([node_facts(slim_node(n)) for n in load_nodes(FIXTURES / "nodes.json")], pods)
    assert nodes["ip-10-0-7-58.ec2.internal"].gpus == 8
    bills = bill_nodes(nodes, pods)
    by_step = {r["pipeline_run"]: r for r in rows if r["pipeline_run"]}
    ml, argo = by_step["mlflow-20250314-090002-8e41c2"], by_step["argo-20250314-090003-e4a8c2"]
    node_s = 8 * (argo["finished"] + 600 - ml["scheduled"])
    held = {k: r["finished"] - r["container_started"] for k, r in by_step.items()}
    for run, bill in bills.items():
        assert bill.gpu_seconds == pytest.approx(node_s * held[run] / sum(held.values()))
    assert set(bills) == set(by_step)  # the KFP pod has no pipeline run in a bare dump: not billed here


def test_node_facts_see_removal_through_slim_node() -> None:
    base = {"metadata": {"name": "n", "creationTimestamp": "2027-01-15T08:00:00Z",
                         "labels": {"nvidia.com/gpu.count": "4"}},
            "status": {"conditions": [{"type": "Ready", "status": "True",
                                       "lastTransitionTime": "2027-01-15T08:01:00Z"}]}}
    facts = node_facts(slim_node(base))
    assert (facts["gpus"], facts["ready"] - facts["created"], facts["removed"]) == (4, 60.0, None)
    deleting = {**base, "metadata": {**base["metadata"], "deletionTimestamp": "2027-01-15T09:00:00Z"}}
    assert node_facts(slim_node(deleting))["removed"] - facts["created"] == 3600.0
    tainted = {**base, "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler",
                                            "value": str(int(facts["created"]) + 1800), "effect": "NoSchedule"},
                                           {"key": "other", "value": "x"}]},
               "status": {**base["status"], "capacity": {"nvidia.com/gpu": "8", "cpu": "96"}}}
    slim = slim_node(tainted)
    assert slim["spec"]["taints"] == [{"key": "ToBeDeletedByClusterAutoscaler",
                                       "value": str(int(facts["created"]) + 1800), "timeAdded": None}]
    assert node_facts(slim)["removed"] - facts["created"] == 1800.0 and node_facts(slim)["gpus"] == 8


def test_node_cost_splits_compute_and_overhead() -> None:
    from components.record.cost import NodeBill

    events = {"finetune": {"model_loaded": T0 + 100, "finished": T0 + 400},
              "evaluate": {"model_loaded": T0 + 500, "finished": T0 + 560}}
    m = billing.node_cost(NodeBill(gpu_seconds=3600.0, tail_gpus=8, nodes=("n",)), events, GPUS, 10.0,
                          train_s=290.0, train_tokens=1e6)
    assert m["cost_usd"] == pytest.approx(10.0)
    assert m["cost_compute_usd"] == pytest.approx(360 * 10 / 3600)  # 1 GPU x (300 + 60) s
    assert m["cost_overhead_usd"] == pytest.approx(10.0 - 1.0)
    assert m["usd_per_1m_tokens"] == pytest.approx(10.0) and m["goodput"] == pytest.approx(290 / 3600)
    assert billing.node_cost(NodeBill(gpu_seconds=60.0, tail_gpus=0, nodes=()), {}, GPUS, None,
                             train_s=None, train_tokens=None)["cost_usd"] is None


def test_rebill_with_another_delay_is_linear_in_the_tail() -> None:
    run = {"metrics": {"node_gpu_hours": 2.0, "node_tail_gpus": 8.0, "cost_usd": 20.0, "cost_compute_usd": 1.0,
                       "cost_overhead_usd": 19.0, "usd_per_1m_tokens": 20.0, "goodput": 0.1},
           "tags": {"llmpack.cost_basis": "node", "llmpack.scale_down_delay_s": "600",
                    "llmpack.price_per_gpu_hour": "10"}}
    rebill.rebill([run], 150)
    m = run["metrics"]
    assert m["node_gpu_hours"] == pytest.approx(2.0 - 8 * 450 / 3600) and m["cost_usd"] == pytest.approx(10.0)
    assert m["cost_compute_usd"] == 1.0 and m["cost_overhead_usd"] == pytest.approx(9.0)
    assert m["usd_per_1m_tokens"] == pytest.approx(10.0) and m["goodput"] == pytest.approx(0.2)
    assert run["tags"]["llmpack.scale_down_delay_s"] == "150"
    container = {"metrics": {"cost_usd": 5.0}, "tags": {"llmpack.cost_basis": "container"}}
    assert rebill.rebill([container], 0)[0]["metrics"] == {"cost_usd": 5.0}
    with pytest.raises(InputError, match="--scale-down-delay-s"):
        rebill.rebill([run], -1)


def test_the_watcher_sees_a_node_removed_before_it_stops() -> None:
    """A node read while the run went on and gone (404) when the watcher re-reads it at its end:
    removed at that re-read (an upper bound); a node still there has no removal."""
    import time

    from standins.k8s_api import KubeAPIStandIn, node_object, pod_states

    from llmpack.cluster.k8s.api import build_api_client
    from llmpack.cluster.k8s.watcher import PodWatcher

    labels = {"llmpack.io/run-group": "rg-nodes", "llmpack.io/pipeline-run": "argo-n1",
              "llmpack.io/orchestrator": "argo", "llmpack.io/step": "finetune",
              "workflows.argoproj.io/workflow": "wf-n1"}
    with KubeAPIStandIn(token="tok-nodes-1", namespaces=("llmpack",)) as api:
        for name in ("gpu-1", "gpu-2"):
            api.add_node(node_object(name, created=T0 + 5, ready=T0 + 65, instance_type="p5.48xlarge",
                                     gpu_product="NVIDIA-H100-80GB-HBM3"))
        for i, name in enumerate(("gpu-1", "gpu-2")):
            api.apply_pod(pod_states(f"wf-n1-finetune-{i}", namespace="llmpack", labels=labels, created=T0,
                                     scheduled=T0 + 66, node=name, sandbox=T0 + 67, initialized=T0 + 68,
                                     started=T0 + 70, finished=T0 + 170)[-1])
        watcher = PodWatcher(build_api_client(host=api.url, token="tok-nodes-1"), "llmpack", "rg-nodes").start()
        end = time.monotonic() + 5
        while len(watcher.nodes()) < 2 and time.monotonic() < end:
            time.sleep(0.01)
        with api._cond:  # the stand-in has no node deletion: the autoscaler deleted gpu-1
            del api._nodes["gpu-1"]
        before = time.time()
        watcher.finish()
        facts = {f["name"]: f for f in watcher.nodes()}
    assert before <= facts["gpu-1"]["removed"] <= time.time()
    assert facts["gpu-2"]["removed"] is None and facts["gpu-2"]["gpus"] == 8
