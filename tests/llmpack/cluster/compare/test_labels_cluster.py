"""On the loopback cluster, the pods a run makes carry the recommended labels and the ``--label``s.

``compare --cluster --nodes 2 --gpus 4 --label ...`` for kfp, argo and mlflow, once (module-wide): the
stand-in cluster makes each path's pods from the artifacts as compiled (KFP's executors' pod
metadata, the Argo templates' with the Workflow's parameters filled in, the MLflow Job's pod
template, the TrainJob's ``runtimePatches`` as the launcher set them), and the real Kubernetes client
lists them by the user's label, as OpenCost or Kubecost would group them (all but KFP's own driver
pods, which no pipeline setting reaches).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from standins.loopback import K8S_TOKEN, LoopbackCluster, isolate

from components.podspec import COMPONENT_LABEL, INSTANCE_LABEL, MANAGED_BY_LABEL, RECOMMENDED
from llmpack.cluster.compare import cluster
from llmpack.cluster.k8s.api import build_api_client
from llmpack.compile.pod_options import PodOptions

pytestmark = [pytest.mark.usefixtures("loopback_env"), pytest.mark.slow]  # three gang runs: seconds each

USER = {"team": "ml-platform", "example.com/owner": "ana"}


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], LoopbackCluster]]:
    tmp = tmp_path_factory.mktemp("labels")
    pod = PodOptions.from_flags(labels=tuple(f"{k}={v}" for k, v in USER.items()))
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, tmp)
        with LoopbackCluster(tmp, f"sqlite:///{tmp / 'mlflow.db'}") as c:
            result = cluster.compare_cluster(**c.options(nodes=2, gpus=4, pod=pod))
            c.fake.wait_idle()
            yield result, c


def _pods(c: LoopbackCluster, selector: str) -> list[Any]:
    core = k8s.CoreV1Api(build_api_client(host=c.kube.url, token=K8S_TOKEN))
    return core.list_pod_for_all_namespaces(label_selector=selector).items


def kfp_driver(pod: Any) -> bool:
    """KFP's own driver pods (its image, its pod spec): KFP puts a task's ``podMetadata`` on the executor
    pod only, so no label of ours reaches them (they carry KFP's ``pipeline/runid``; docs/internals/decisions.md)."""
    return pod.spec.containers[-1].image.startswith("ghcr.io/kubeflow/kfp-driver")


def test_every_pod_of_every_path_carries_the_labels(compared: tuple[dict[str, Any], LoopbackCluster],
                                                    tmp_path: Path) -> None:
    result, c = compared
    runs = {r["orchestrator"]: r for r in result["runs"]}
    assert list(runs) == ["kfp", "argo", "mlflow"] and result["failed"] == []
    everything = [p for p in _pods(c, "") if not kfp_driver(p)]
    assert everything
    by_team = _pods(c, "team=ml-platform,example.com/owner=ana")  # what a cost tool groups by
    assert {p.metadata.name for p in by_team} == {p.metadata.name for p in everything}
    for orch, run in runs.items():
        pods = [p for p in everything if (p.metadata.labels or {}).get("llmpack.io/orchestrator") == orch
                or (p.metadata.labels or {}).get("llmpack.io/pipeline-run") == run["pipeline_run"]]
        assert pods, orch
        gang = c.fake.scripts[run["pipeline_run"]].gang
        node_pods = [p for p in pods if p.metadata.name.startswith(gang["trainjob"])]
        assert len(node_pods) == 2, orch  # the TrainJob's two node pods are among them
        for p in pods:
            labels = p.metadata.labels
            assert USER.items() <= labels.items(), (orch, p.metadata.name)
            wanted = set(RECOMMENDED) - ({INSTANCE_LABEL} if orch == "kfp" and p not in node_pods else set())
            assert wanted <= set(labels), (orch, p.metadata.name, sorted(wanted - set(labels)))
            if INSTANCE_LABEL in labels:  # the run, resolved: never a placeholder
                assert labels[INSTANCE_LABEL] == run["pipeline_run"], (orch, p.metadata.name)
        steps = {p.metadata.labels[COMPONENT_LABEL] for p in pods}
        assert "finetune" in steps, orch
        managers = {p.metadata.labels[MANAGED_BY_LABEL] for p in pods}
        assert managers == {orch, "kubeflow-trainer"}, orch
