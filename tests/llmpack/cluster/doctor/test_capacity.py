"""The capacity and admission checks of ``llmpack doctor`` on plain objects, as the API server sends them
(the real control plane makes each fault for real: tests/realcluster/test_doctor_real.py).

The GPU pods are read from the committed artifacts and from a compiled 2 x 8 gang; the cluster is a
small reader answering fixed node, ResourceQuota and LimitRange lists.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from llmpack.cluster.doctor import capacity
from llmpack.cluster.doctor.checks import Check, gpu_placement
from llmpack.cluster.doctor.pods import committed_root
from llmpack.cluster.doctor.reader import Missing

GPU_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}


def node(name: str, cpu: str, memory: str, gpus: str = "8", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"taints": [GPU_TAINT], **spec},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus}}}


class Reader:
    """Answers ``nodes`` and ``listed`` as :class:`llmpack.cluster.doctor.reader.ClusterReader` does."""

    def __init__(self, nodes: list[dict[str, Any]] = (), **lists: list[dict[str, Any]]) -> None:
        self._nodes, self._lists = list(nodes), lists

    def nodes(self, label_selector: str) -> list[dict[str, Any]]:
        return self._nodes

    def everywhere(self, group: str, version: str, plural: str, field_selector: str = "") -> list[Any]:
        return self._lists.get(plural, [])  # no pod bound anywhere unless given

    def listed(self, group: str, version: str, namespace: str, plural: str, limit: int | None = None) -> list[Any]:
        if plural not in self._lists:
            raise Missing(f"{plural} not served")
        return self._lists[plural]


@pytest.fixture(scope="module")
def mlflow_pods() -> list[capacity.GpuPod]:
    return capacity.gpu_pods(committed_root(), "mlflow", gang=False)


def test_the_compiled_mlflow_pod_is_read_from_its_job_template(mlflow_pods: list[capacity.GpuPod]) -> None:
    (pod,) = mlflow_pods
    assert pod.requests == {"cpu": Decimal(8), "memory": Decimal(64 * 2**30), "nvidia.com/gpu": Decimal(1)}
    assert pod.count == 1


def test_the_gang_node_pod_counts_numnodes() -> None:
    pods = capacity.gpu_pods(committed_root() / "examples" / "multinode", "mlflow", gang=True)
    (gang,) = [p for p in pods if p.where == "TrainJob node pod"]
    assert gang.count == 2 and gang.requests["nvidia.com/gpu"] == 4 and gang.requests["cpu"] == 32


def test_a_node_too_small_for_cpu_and_memory_is_named(mlflow_pods: list[capacity.GpuPod]) -> None:
    placement = gpu_placement()
    (fits,) = capacity.node_fit(Reader([node("big", "192", "2048Gi")]), placement, mlflow_pods)
    assert fits.ok, fits
    (small,) = capacity.node_fit(Reader([node("small", "4", "16Gi")]), placement, mlflow_pods)
    assert not small.ok and "fits 0 GPU node(s), needs 1: small lacks 8 cpu (has 4 cpu); 64Gi memory" in small.what
    cordoned = node("big", "192", "2048Gi", unschedulable=True)
    assert capacity.node_fit(Reader([cordoned]), placement, mlflow_pods) == []  # gpu_nodes says why: its taint


def test_the_gang_needs_numnodes_nodes_that_fit() -> None:
    pod = capacity.GpuPod("TrainJob node pod", {"cpu": Decimal(64), "nvidia.com/gpu": Decimal(8)}, count=2)
    (one,) = capacity.node_fit(Reader([node("a", "192", "2Ti"), node("b", "32", "2Ti")]), gpu_placement(), [pod])
    assert not one.ok and "fits 1 GPU node(s), needs 2: b lacks 64 cpu (has 32 cpu)" in one.what


def quota(name: str, hard: dict[str, str], used: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"hard": hard}, "status": {"hard": hard, "used": used or {}}}


@pytest.mark.parametrize(("hard", "used", "words"), [
    ({"requests.nvidia.com/gpu": "0"}, None, "leaves 0 requests.nvidia.com/gpu; the run's GPU pods need 1"),
    ({"requests.cpu": "16"}, {"requests.cpu": "12"}, "leaves 4 requests.cpu; the run's GPU pods need 8"),
    ({"requests.nvidia.com/gpu": "1"}, None, None),  # exactly the pod's GPU: admitted
    ({"limits.memory": "1Ti"}, None, None),  # the pod sets its memory limit: 64Gi fits
    ({"limits.ephemeral-storage": "1Ti"}, None, "tracks limits.ephemeral-storage, which mlflow pod does not set"),
    ({"pods": "1"}, {"pods": "1"}, "leaves 0 pods; the run's GPU pods need 1"),
])
def test_a_quota_is_held_to_hard_less_used(mlflow_pods: list[capacity.GpuPod], hard: dict[str, str],
                                           used: dict[str, str] | None, words: str | None) -> None:
    check = capacity.quotas(Reader(resourcequotas=[quota("q", hard, used)]), "ns", mlflow_pods)
    assert check.ok is (words is None), check
    if words:
        # a quota too small: a patch raising its hard limit by the shortfall; one tracking an unset field: describe
        verb = "describe resourcequota q" if "tracks" in words else "patch resourcequota q --type merge -p '"
        assert words in check.what and check.fix.startswith(f"kubectl -n ns {verb}"), check.fix


def test_no_quota_api_is_no_quota(mlflow_pods: list[capacity.GpuPod]) -> None:
    assert capacity.quotas(Reader(), "ns", mlflow_pods) == Check(True, "ResourceQuota in ns: none")


@pytest.mark.parametrize(("item", "words"), [
    ({"type": "Container", "max": {"memory": "16Gi"}},
     "caps a Container's memory at 16Gi memory; mlflow pod asks 64Gi"),
    ({"type": "Container", "max": {"cpu": "64"}}, None),
    ({"type": "PersistentVolumeClaim", "max": {"storage": "1Gi"}}, None),
])
def test_a_limit_range_caps_or_admits(mlflow_pods: list[capacity.GpuPod], item: dict[str, Any],
                                      words: str | None) -> None:
    check = capacity.limit_ranges(Reader(limitranges=[{"metadata": {"name": "lr"}, "spec": {"limits": [item]}}]), "ns",
                                  mlflow_pods)
    assert check.ok is (words is None) and (words is None or words in check.what), check


def test_a_default_limit_below_the_request_is_refused() -> None:
    pod = capacity.GpuPod("p", {"cpu": Decimal(8), "nvidia.com/gpu": Decimal(1)}, {"nvidia.com/gpu": Decimal(1)})
    item = {"type": "Container", "default": {"cpu": "2"}}
    check = capacity.limit_ranges(Reader(limitranges=[{"metadata": {"name": "lr"}, "spec": {"limits": [item]}}]),
                                  "ns", [pod])
    assert not check.ok and "default cpu limit of 2 cpu, below its request 8 cpu" in check.what


def test_served_kinds_and_the_compiled_namespace(tmp_path: Path) -> None:
    kinds = capacity.created_kinds(committed_root() / "examples" / "multinode", "mlflow", gang=True)
    assert kinds == {("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainjob/finetune-trainjob.yaml"}
    (missing,) = capacity.served(Reader(), "ns", kinds)
    assert not missing.ok and "TrainJob (trainer.kubeflow.org/v1alpha1) is not served" in missing.what
    assert "runtimes?ref=v2.3.0" in missing.fix
    assert capacity.served(Reader(trainjobs=[]), "ns", kinds)[0].ok
    assert capacity.compiled_namespace(committed_root()) == "llmpack"
    other = capacity.namespace_match("the artifacts in x", "ml-train", "llmpack")
    assert not other.ok and "compiled for namespace ml-train, not llmpack" in other.what
    assert capacity.compiled_namespace(tmp_path) is None
