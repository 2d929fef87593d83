"""The real control plane's own answers: kwok's simulated GPU nodes, the real scheduler's verdicts, pod validation.

These hold whatever the pack compiles; they show the parts under the artifact tests
(test_production_shape.py) decide for real: kubectl built from the pinned kubernetes lists the
nodes of tools/cluster/nodes.json as Ready with their GPUs, the real kube-scheduler leaves a pod
larger than any node Pending/Unschedulable and binds one that fits (kwok then runs it), and the
real API server refuses a pod with two mounts at one path.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.realcluster.apiserver import create, make_namespace, wait_until
from tests.realcluster.conftest import TOOLS, RealCluster

pytestmark = pytest.mark.cluster

GROUPS = json.loads((TOOLS / "nodes.json").read_text())["groups"]


def _pod(name: str, *, requests: dict[str, str], gpu: bool = True, mounts: list[dict[str, Any]] | None = None,
         volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A small Pod Security ``restricted`` pod asking for ``requests`` (GPU pods tolerate the GPU taint)."""
    container = {"name": "main", "image": "registry.example/x@sha256:" + "0" * 64, "command": ["true"],
                 "resources": {"requests": requests,
                               "limits": {k: v for k, v in requests.items() if k == "nvidia.com/gpu"}},
                 "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                     "runAsNonRoot": True, "runAsUser": 1000,
                                     "seccompProfile": {"type": "RuntimeDefault"}},
                 "volumeMounts": mounts or []}
    spec: dict[str, Any] = {"containers": [container], "volumes": volumes or [], "restartPolicy": "Never"}
    if gpu:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_kubectl_lists_the_simulated_gpu_nodes_ready(real_cluster: RealCluster) -> None:
    """`kubectl get nodes` with the written kubeconfig: every node of nodes.json, Ready, with its GPUs, labels and
    taints."""
    listed = real_cluster.kubectl("get", "nodes", "-o", "json")
    nodes = {n["metadata"]["name"]: n for n in json.loads(listed.stdout)["items"]}
    want = {f"{g['name']}-{i}" for g in GROUPS for i in range(g["count"])}
    assert set(nodes) == want
    for group in GROUPS:
        for i in range(group["count"]):
            node = nodes[f"{group['name']}-{i}"]
            ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
            assert ready == ["True"], node["status"]["conditions"]
            assert node["status"]["allocatable"]["cpu"] == group["cpu"]
            assert node["status"]["allocatable"].get("nvidia.com/gpu") == (str(group["gpus"]) if group.get("gpus")
                                                                           else None)
            labels = node["metadata"]["labels"]
            assert labels["node.kubernetes.io/instance-type"] == group["instanceType"]
            assert labels.get("nvidia.com/gpu.product") == group.get("gpuProduct")
            assert [t["key"] for t in node["spec"].get("taints") or []] == [t["key"] for t in group.get("taints") or []]
    table = real_cluster.kubectl("get", "nodes").stdout
    assert "h100-0" in table and " Ready " in table, table


def test_a_pod_larger_than_any_node_stays_pending_unschedulable(real_cluster: RealCluster) -> None:
    """16 GPUs (the nodes have 8) and 64 CPU / 512Gi: the real scheduler says why, per node, and never binds it."""
    from kubernetes import client

    core = client.CoreV1Api(real_cluster.api)
    make_namespace(real_cluster.api, "sched-big")
    core.create_namespaced_pod("sched-big", _pod("too-big", requests={"nvidia.com/gpu": "16", "cpu": "64",
                                                                        "memory": "512Gi"}))

    def unschedulable() -> Any:
        pod = core.read_namespaced_pod("too-big", "sched-big")
        found = [c for c in pod.status.conditions or [] if c.type == "PodScheduled" and c.reason == "Unschedulable"]
        return found and (pod, found[0])

    pod, condition = wait_until(unschedulable, timeout_s=30, what="PodScheduled=False/Unschedulable on pod too-big")
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    total = sum(g["count"] for g in GROUPS)
    assert condition.message.startswith(f"0/{total} nodes are available:"), condition.message
    assert "Insufficient nvidia.com/gpu" in condition.message, condition.message


def test_a_pod_that_fits_is_bound_to_a_gpu_node_and_kwok_runs_it(real_cluster: RealCluster) -> None:
    """8 GPUs with the GPU taint tolerated and the H100 product selected: bound to an h100 node, Running by kwok's
    stages."""
    from kubernetes import client

    core = client.CoreV1Api(real_cluster.api)
    make_namespace(real_cluster.api, "sched-fit")
    pod = _pod("fits", requests={"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"})
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    core.create_namespaced_pod("sched-fit", pod)
    running = wait_until(lambda: (p := core.read_namespaced_pod("fits", "sched-fit")).status.phase == "Running" and p,
                         timeout_s=60, what="pod fits Running")
    assert running.spec.node_name.startswith("h100-")


def test_the_api_server_refuses_two_mounts_at_one_path(real_cluster: RealCluster) -> None:
    """Pod validation (not Pod Security, not a schema): a duplicate mountPath is a 422 naming the field."""
    make_namespace(real_cluster.api, "dup-mount")
    pod = _pod("dup", requests={"cpu": "1"}, gpu=False,
               mounts=[{"name": "dshm", "mountPath": "/dev/shm"},
                       {"name": "m", "mountPath": "/dev/shm", "readOnly": True}],
               volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory"}},
                        {"name": "m", "persistentVolumeClaim": {"claimName": "m"}}])
    answer = create(real_cluster.api, pod, namespace="dup-mount")
    assert answer.status == 422
    assert ('spec.containers[0].volumeMounts[1].mountPath: Invalid value: "/dev/shm": must be unique'
            in answer.message), answer.message
