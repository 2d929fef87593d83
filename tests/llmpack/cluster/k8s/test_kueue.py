"""Kueue's Workload of a TrainJob is found whichever of its API versions the cluster serves."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s
from standins.k8s_api import TRAINJOBS, WORKLOADS, WORKLOADS_V1BETA2, CustomResource, KubeAPIStandIn

from llmpack.cluster.k8s import kueue

TOKEN = "kueue-standin-token"
NS = "llmpack"


def _workload(version: str, owner: str) -> dict:
    return {"apiVersion": f"kueue.x-k8s.io/{version}", "kind": "Workload",
            "metadata": {"name": f"trainjob-{owner}-x1y2z", "namespace": NS,
                         "creationTimestamp": "2026-12-02T10:00:00Z",
                         "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                              "name": owner, "uid": "u-1", "controller": True}]},
            "status": {"conditions": [
                {"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-02T10:00:12Z"},
                {"type": "Admitted", "status": "True", "lastTransitionTime": "2026-12-02T10:00:15Z"}]}}


@pytest.mark.parametrize(("served", "asked"), [
    ((WORKLOADS, WORKLOADS_V1BETA2), ["v1beta2"]),  # Kueue 0.15-0.19: both, the newest read
    ((WORKLOADS,), ["v1beta2", "v1beta1"]),  # before 0.15: v1beta1 only
    ((WORKLOADS_V1BETA2,), ["v1beta2"]),  # once v1beta1 is no longer served
])
def test_the_newest_served_version_is_read(served: tuple[CustomResource, ...], asked: list[str]) -> None:
    with KubeAPIStandIn(token=TOKEN, namespaces=(NS,), custom_resources=(TRAINJOBS, *served)) as api:
        api.apply_custom_object(_workload(served[0].version, "ft-other"))
        api.apply_custom_object(_workload(served[0].version, "ft-run-7"))
        cfg = k8s.Configuration(host=api.url, api_key={"authorization": f"Bearer {TOKEN}"})
        found = kueue.find_workload(k8s.ApiClient(cfg), NS, "ft-run-7")
        assert found is not None and found["metadata"]["name"] == "trainjob-ft-run-7-x1y2z"
        assert found["apiVersion"] == f"kueue.x-k8s.io/{asked[-1]}"
        assert kueue.waits(found) == {"quota_wait_s": 12.0, "admission_checks_s": 3.0}
        assert [r.path.split("/")[3] for r in api.recorded("GET", "/workloads")] == asked


def test_without_kueue_there_is_no_workload_and_no_error() -> None:
    with KubeAPIStandIn(token=TOKEN, namespaces=(NS,), custom_resources=(TRAINJOBS,)) as api:
        cfg = k8s.Configuration(host=api.url, api_key={"authorization": f"Bearer {TOKEN}"})
        assert kueue.find_workload(k8s.ApiClient(cfg), NS, "ft-run-7") is None
        assert kueue.waits(None) == {"quota_wait_s": None, "admission_checks_s": None}
