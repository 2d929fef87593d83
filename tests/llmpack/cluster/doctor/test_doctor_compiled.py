"""``llmpack cluster doctor --compiled DIR`` alone, as a user runs it (issue 50): the gang's nodes, GPUs, queue,
runtime and claims come from the artifacts, not from flags repeated by hand.

A 2-node x 8-GPU gang is compiled once (queue team-a, checkpoint and model claims). On the ready stand-in
cluster it exits 0; each of the twelve faults of the platform engineer's review, planted alone, gives its own ✗
with a fix and exit 1; three healthy variants that an earlier doctor failed (a PVC Pending under a
WaitForFirstConsumer class, a ResourceQuota of exactly the gang's GPUs, KFP >= 2.16 under restricted) exit 0. A
flag that says otherwise than the artifacts is one line, exit 2, nothing sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from standins.argo_server import ArgoServerStandIn
from standins.k8s_api import KubeAPIStandIn
from standins.kfp_api import KFPAPIStandIn
from standins.loopback import CLIENT_ENV, write_kubeconfig
from standins.ready_cluster import (
    CKPT_PVC,
    CLUSTER_QUEUE,
    CONTROLLERS,
    MODEL_PVC,
    QUEUE,
    RUN_NAMESPACE,
    SHARED_PVC,
    WFFC_CLASS,
    WORKFLOWS,
    cluster_queue,
    deployment,
    gpu_pod,
    plant_ready,
    pvc,
)

from llmpack.cli import main

K8S_TOKEN, KFP_TOKEN, ARGO_TOKEN = "compiled-k8s-token-3e1", "compiled-kfp-token-3e1", "compiled-argo-token-3e1"


@pytest.fixture(scope="module")
def gang_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``llmpack compile --nodes 2 --gpus 8 --cache-pvc llmpack-shared --queue team-a --checkpoint-pvc llmpack-ckpt
    --model-pvc llmpack-models``."""
    out = tmp_path_factory.mktemp("gang2x8")
    flags = ["--nodes", "2", "--gpus", "8", "--cache-pvc", SHARED_PVC, "--queue", QUEUE, "--checkpoint-pvc", CKPT_PVC,
             "--model-pvc", MODEL_PVC]
    result = CliRunner().invoke(main, ["compile", *flags, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


class Cluster:
    def __init__(self, kube: KubeAPIStandIn, kfp: KFPAPIStandIn, kubeconfig: Path, compiled: Path) -> None:
        self.kube, self.kfp, self.kubeconfig, self.compiled = kube, kfp, kubeconfig, compiled

    def doctor(self, *flags: str) -> tuple[int, str]:
        result = CliRunner().invoke(main, ["cluster", "doctor", "--kubeconfig", str(self.kubeconfig), "--compiled",
                                           str(self.compiled), "--kfp-host", self.kfp.url, "--path", "kfp,argo",
                                           *flags], env={"KFP_TOKEN": KFP_TOKEN}, prog_name="llmpack")
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        return result.exit_code, result.output


@pytest.fixture()
def cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gang_dir: Path) -> Iterator[Cluster]:
    for name in CLIENT_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with KubeAPIStandIn(token=K8S_TOKEN, namespaces=()) as kube, KFPAPIStandIn(token=KFP_TOKEN) as kfp, \
            ArgoServerStandIn(token=ARGO_TOKEN):
        plant_ready(kube)
        yield Cluster(kube, kfp, write_kubeconfig(tmp_path / "kubeconfig", kube.url, K8S_TOKEN), gang_dir)


def failed(out: str) -> list[tuple[str, str]]:
    lines = out.splitlines()
    return [(line, lines[i + 1].strip() if i + 1 < len(lines) else "") for i, line in enumerate(lines)
            if line.startswith("✗")]


def _quota(gpus: int) -> Callable[[KubeAPIStandIn], Any]:
    return lambda api: api.apply_custom_object({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": RUN_NAMESPACE},
        "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}},
        "status": {"hard": {"requests.nvidia.com/gpu": str(gpus)}, "used": {"requests.nvidia.com/gpu": "0"}}})


def _controller(name: str, ready: int = 0) -> Callable[[KubeAPIStandIn], Any]:
    namespace, deployment_name = CONTROLLERS[name]
    if ready < 0:
        return lambda api: api.delete_custom_object("deployments.apps", namespace, deployment_name)
    return lambda api: api.apply_custom_object(deployment(namespace, deployment_name, ready=ready))


def _unserve_workflows(api: KubeAPIStandIn) -> None:
    with api._cond:
        api.custom_resources.pop((WORKFLOWS.group, WORKFLOWS.version, WORKFLOWS.plural))


# The review's twelve (issue 50), each: how it is planted, its ✗ line's words, its fix's words.
FAULTS: dict[str, tuple[Callable[[KubeAPIStandIn], Any], str, str]] = {
    "checkpoint-claim-rwo": (lambda api: api.apply_custom_object(pvc(modes=("ReadWriteOnce",), name=CKPT_PVC)),
                             "llmpack-ckpt in llmpack is ReadWriteOnce, not ReadWriteMany (the gang's 2 node pods",
                             '"accessModes":["ReadWriteMany"]'),
    "quota-below-gang": (_quota(8), "ResourceQuota gpus in llmpack leaves 8 requests.nvidia.com/gpu; the run's GPU "
                         "pods need 16", "ask for requests.nvidia.com/gpu: 8 more"),
    "runtime-deleted": (lambda api: api.delete_custom_object("clustertrainingruntimes.trainer.kubeflow.org", "",
                                                             "torch-distributed"),
                        "ClusterTrainingRuntime torch-distributed missing", "manifests/overlays/runtimes"),
    "local-queue-missing": (lambda api: api.delete_custom_object("localqueues.kueue.x-k8s.io", RUN_NAMESPACE, QUEUE),
                            "Kueue LocalQueue team-a missing in llmpack", '"kind":"LocalQueue"'),
    "trainer-controller-down": (_controller("trainer"), "Kubeflow Trainer controller kubeflow-system/kubeflow-trainer-"
                                "controller-manager has 0 of 1 replicas ready", "rollout status deployment"),
    "gpus-held": (lambda api: api.apply_pod(gpu_pod("gpu-node-1")),
                  "TrainJob node pod (8 nvidia.com/gpu, 64 cpu, 512Gi memory) fits 1 GPU node(s), needs 2: gpu-node-1 "
                  "lacks 8 nvidia.com/gpu (has 0 nvidia.com/gpu free, 8 held by other pods)",
                  "kubectl get pods -A --field-selector spec.nodeName=gpu-node-1,status.phase=Running"),
    "cluster-queue-missing": (lambda api: api.delete_custom_object("clusterqueues.kueue.x-k8s.io", "", CLUSTER_QUEUE),
                              "Kueue ClusterQueue gpus missing (LocalQueue team-a in",
                              '"kind":"ClusterQueue"'),
    "cluster-queue-too-small": (lambda api: api.apply_custom_object(cluster_queue(gpus=8)),
                                "Kueue ClusterQueue gpus (of LocalQueue team-a) has 8 nvidia.com/gpu nominal quota; "
                                "the gang needs 16 at once (8 short",
                                "kubectl patch clusterqueue gpus --type json -p '[{\"op\":\"replace\",\"path\":\"/spec/"
                                "resourceGroups/0/flavors/0/resources/2/nominalQuota\",\"value\":\"16\"}]'"),
    "model-claim-rwo-on-three-nodes": (lambda api: api.apply_custom_object(pvc(modes=("ReadWriteOnce",),
                                                                               name=MODEL_PVC)),
                                       "llmpack-models in llmpack is ReadWriteOnce, not ReadWriteMany or ReadOnlyMany "
                                       "(the gang's 2 node pods and its launcher mount it on several nodes at once)",
                                       "delete pvc llmpack-models"),
    "jobset-controller-missing": (_controller("jobset", ready=-1), "JobSet controller not running: no Deployment "
                                  "jobset-controller-manager in any namespace", "manifests/overlays/runtimes"),
    "kueue-controller-down": (_controller("kueue"), "Kueue controller kueue-system/kueue-controller-manager has 0 of 1",
                              "kubectl -n kueue-system scale deployment kueue-controller-manager --replicas=1"),
    "workflow-type-not-served": (_unserve_workflows, "Workflow (argoproj.io/v1alpha1) is not served",
                                 "releases/download/v3.7.3/install.yaml"),
}


def test_the_ready_cluster_passes_from_the_compiled_folder_alone(cluster: Cluster) -> None:
    code, out = cluster.doctor()
    assert code == 0, out
    for words in ("(gang: 2 nodes)", "ClusterTrainingRuntime torch-distributed exists",
                  "Kueue ClusterQueue gpus (of LocalQueue team-a) has 16 nvidia.com/gpu nominal quota "
                  "(the gang needs 16)",
                  "TrainJob node pod (8 nvidia.com/gpu", "llmpack-ckpt in llmpack is Bound, ReadWriteMany",
                  "llmpack-models in llmpack is Bound, ReadOnlyMany", "Kubeflow Trainer controller",
                  "JobSet controller",
                  "Kueue controller", "Argo controller", "Argo Server not checked"):
        assert words in out, (words, out)


@pytest.mark.slow  # a doctor per fault, the matrix in the slow tier (CI runs it whole); the ready cluster stays quick
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_review_fault_is_its_own_line_with_its_fix(cluster: Cluster, fault: str) -> None:
    plant, line, fix = FAULTS[fault]
    plant(cluster.kube)
    code, out = cluster.doctor()
    assert code == 1, out
    (found,) = failed(out)
    assert line in found[0], out
    assert found[1].startswith("fix: ") and fix in found[1], out


def _wffc(api: KubeAPIStandIn) -> None:
    claim = pvc(phase="Pending")
    claim["spec"]["storageClassName"] = WFFC_CLASS
    api.apply_custom_object(claim)


def _default_class_wffc(api: KubeAPIStandIn) -> None:
    claim = pvc(phase="Pending", name=CKPT_PVC)
    del claim["spec"]["storageClassName"]  # the cluster's default class: WaitForFirstConsumer
    api.apply_custom_object(claim)


def _kfp_restricted(api: KubeAPIStandIn) -> None:
    api.add_namespace("kubeflow", {"pod-security.kubernetes.io/enforce": "restricted"})


HEALTHY: dict[str, tuple[Callable[[KubeAPIStandIn], Any], str]] = {
    "wait-for-first-consumer": (_wffc, "llmpack-shared in llmpack is Pending until its first pod "
                                "(WaitForFirstConsumer)"),
    "default-class-wait-for-first-consumer": (_default_class_wffc,
                                              "llmpack-ckpt in llmpack is Pending until its first"),
    "quota-equals-gang": (_quota(16), "ResourceQuota in llmpack: 1 admit the run's GPU pods"),
    "kfp-2.16-under-restricted": (_kfp_restricted, "Pod Security (kfp): kubeflow enforces restricted; its server "
                                  "(2.16.0) sets the pods' security context itself"),
}


@pytest.mark.slow  # a doctor per fault, the matrix in the slow tier (CI runs it whole); the ready cluster stays quick
@pytest.mark.parametrize("variant", sorted(HEALTHY))
def test_healthy_variants_pass(cluster: Cluster, variant: str) -> None:
    plant, words = HEALTHY[variant]
    plant(cluster.kube)
    if variant.startswith("kfp"):
        cluster.kfp.tag_name = "2.16.0"
    code, out = cluster.doctor()
    assert code == 0 and words in out, out


def test_kfp_before_2_16_under_restricted_still_fails_and_says_why(cluster: Cluster) -> None:
    _kfp_restricted(cluster.kube)
    code, out = cluster.doctor()
    assert code == 1, out
    ((line, fix),) = failed(out)
    assert "Pod Security (kfp): kubeflow enforces restricted" in line
    assert "kfp 2.16 or later, which sets these fields itself (its server is 2.5.0)" in fix


@pytest.mark.parametrize(("flags", "message"), [
    (("--nodes", "3"), "--nodes 3: the artifacts in DIR compile a 2-node gang"),
    (("--gpus", "4"), "--gpus 4: the artifacts in DIR give each gang node 8 GPUs"),
    (("--queue", "team-b"), "--queue team-b: the artifacts in DIR label the TrainJob with queue team-a"),
])
@pytest.mark.slow  # a doctor per fault, the matrix in the slow tier (CI runs it whole); the ready cluster stays quick
def test_a_flag_contradicting_the_artifacts_is_one_line_exit_2(cluster: Cluster, flags: tuple[str, ...],
                                                              message: str) -> None:
    code, out = cluster.doctor(*flags)
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert message.replace("DIR", str(cluster.compiled)) in out, out
    assert not cluster.kube.recorded("POST", "selfsubjectaccessreviews")  # nothing sent
    code, out = cluster.doctor("--nodes", "2", "--gpus", "8", "--queue", QUEUE)  # agreeing flags: accepted
    assert code == 0, out
