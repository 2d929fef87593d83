"""``llmpack cluster doctor --compiled DIR`` alone on a compiled 2-node x 8-GPU gang, on the real control plane with
the real JobSet, Trainer and Kueue controllers running (issue 50: the review's twelve faults, as a user runs it).

A control plane of this module's own (``LLMPACK_CLUSTER_CONTROLLERS=jobset,trainer,kueue``). The namespace is
made healthy as first-run-on-a-cluster.md asks (restricted Pod Security, the tracking Secret, launcher RBAC, the
claims Bound by the real PV controller with the access modes the gang needs, a LocalQueue on a ClusterQueue of 16
GPUs): doctor exits 0. Each fault then changes one thing for real and doctor, with no flag but ``--path mlflow``,
gives its own ✗ line with its fix and exit 1; the healthy variants (a claim Pending under a WaitForFirstConsumer
class, a ResourceQuota of exactly the gang's 16 GPUs) exit 0. The Trainer controller stopped (its CRDs still
served) runs last: its process is killed, the real API server then refuses the compiled TrainJob.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.realcluster.apiserver import create, make_namespace, wait_until
from tests.realcluster.conftest import RealCluster, started_cluster
from tests.realcluster.test_kueue_real import GPU_PRODUCT, _built

pytestmark = pytest.mark.cluster

NS = "ml-gang"
FLAGS = ("--namespace", NS, "--nodes", "2", "--gpus", "8", "--gpu-type", "h100", "--cache-pvc", "llmpack-shared",
         "--queue", "team-a", "--checkpoint-pvc", "llmpack-ckpt", "--model-pvc", "llmpack-models")
CLAIMS = {"llmpack-shared": "ReadWriteMany", "llmpack-ckpt": "ReadWriteMany", "llmpack-models": "ReadOnlyMany",
          "llmpack-artifacts": "ReadWriteOnce"}
KUEUE = ("kueue.x-k8s.io", "v1beta2")
STATE: dict[str, Any] = {}


@pytest.fixture(scope="module")
def gang_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    _built("--controllers")
    _built("--kueue")
    with started_cluster(tmp_path_factory.mktemp("doctorgang") / "state",
                         settings={"LLMPACK_CLUSTER_CONTROLLERS": "jobset,trainer,kueue"}) as cluster:
        yield cluster


def _core(cluster: RealCluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cluster.api)


def _custom(cluster: RealCluster) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(cluster.api)


def _claim(cluster: RealCluster, name: str, mode: str, storage_class: str = "", volume: bool = True) -> None:
    """Claim ``name`` (re)made with access mode ``mode``; Bound by the real PV controller to a volume of its own."""
    from kubernetes.client.exceptions import ApiException

    core = _core(cluster)
    for delete, listed in ((lambda: core.delete_namespaced_persistent_volume_claim(name, NS),
                            lambda: core.list_namespaced_persistent_volume_claim(NS).items),
                           (lambda: core.delete_persistent_volume(f"pv-{name}"),
                            lambda: core.list_persistent_volume().items)):
        try:
            delete()
        except ApiException:
            continue
        wait_until(lambda listed=listed: all(o.metadata.name not in (name, f"pv-{name}") for o in listed()),
                   timeout_s=60, what=f"{name} deleted")
    spec: dict[str, Any] = {"accessModes": [mode], "storageClassName": storage_class,
                            "resources": {"requests": {"storage": "1Ti"}}}
    if volume:
        core.create_persistent_volume({"metadata": {"name": f"pv-{name}"}, "spec": {
            "capacity": {"storage": "1Ti"}, "accessModes": [mode], "storageClassName": storage_class,
            "nfs": {"server": "127.0.0.1", "path": f"/{name}"}}})
        spec["volumeName"] = f"pv-{name}"
    core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": name}, "spec": spec})
    if volume:
        wait_until(lambda: core.read_namespaced_persistent_volume_claim(name, NS).status.phase == "Bound",
                   timeout_s=60, what=f"{name} Bound")


def _local_queue(cluster: RealCluster, cluster_queue: str | None) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        _custom(cluster).delete_namespaced_custom_object(*KUEUE, NS, "localqueues", "team-a")
        wait_until(lambda: not _custom(cluster).list_namespaced_custom_object(*KUEUE, NS, "localqueues")["items"],
                   timeout_s=30, what="LocalQueue deleted")
    except ApiException:
        pass
    if cluster_queue:
        made = create(cluster.api, {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue",
                                    "metadata": {"name": "team-a"}, "spec": {"clusterQueue": cluster_queue}},
                      namespace=NS, dry_run=False)
        assert made.status == 201, made


@pytest.fixture(scope="module")
def healthy(gang_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> RealCluster:
    """The gang compiled, and its namespace made as first-run-on-a-cluster.md asks."""
    out = tmp_path_factory.mktemp("gang")
    done = subprocess.run([sys.executable, "-m", "llmpack", "compile", "--out", str(out), *FLAGS], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    STATE["compiled"] = out
    api = gang_cluster.api
    make_namespace(api, NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    _core(gang_cluster).create_namespaced_secret(NS, {"metadata": {"name": "llmpack-mlflow"}, "stringData": {
        "tracking-uri": "http://mlflow.mlflow:5000", "signing-key": "7a" * 32}})
    for doc in yaml.safe_load_all((out / "trainjob" / "launcher-rbac.yaml").read_text()):
        if doc:
            assert create(api, doc, namespace=NS, dry_run=False).status == 201
    for name, mode in CLAIMS.items():
        _claim(gang_cluster, name, mode)
    for obj in ({"kind": "ResourceFlavor", "metadata": {"name": "h100"},
                 "spec": {"nodeLabels": {"nvidia.com/gpu.product": GPU_PRODUCT}}},
                {"kind": "ClusterQueue", "metadata": {"name": "gpu-h100"}, "spec": {
                    "namespaceSelector": {}, "resourceGroups": [{
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [{"name": "h100", "resources": [
                            {"name": "cpu", "nominalQuota": "384"}, {"name": "memory", "nominalQuota": "4Ti"},
                            {"name": "nvidia.com/gpu", "nominalQuota": "16"}]}]}]}}):
        assert create(api, {"apiVersion": "/".join(KUEUE), **obj}, dry_run=False).status == 201
    _local_queue(gang_cluster, "gpu-h100")
    return gang_cluster


def doctor(cluster: RealCluster) -> subprocess.CompletedProcess[str]:
    """``llmpack cluster doctor --compiled DIR`` as a user types it: no flag repeats what the artifacts say."""
    return subprocess.run([sys.executable, "-m", "llmpack", "cluster", "doctor", "--path", "mlflow",
                           "--kubeconfig", str(cluster.kubeconfig), "--compiled", str(STATE["compiled"])],
                          cwd=REPO, capture_output=True, text=True, timeout=180)


def test_the_healthy_gang_passes_from_the_compiled_folder_alone(healthy: RealCluster) -> None:
    done = doctor(healthy)
    assert done.returncode == 0, done.stdout + done.stderr
    for words in ("(gang: 2 nodes)", "✓ Kubeflow Trainer controller runs: it renews its leader Lease",
                  "✓ JobSet controller runs", "✓ Kueue controller runs", "✓ ClusterTrainingRuntime torch-distributed",
                  "✓ Kueue ClusterQueue gpu-h100 (of LocalQueue team-a) has 16 nvidia.com/gpu nominal quota",
                  f"✓ PersistentVolumeClaim llmpack-ckpt in {NS} is Bound, ReadWriteMany",
                  f"✓ PersistentVolumeClaim llmpack-models in {NS} is Bound, ReadOnlyMany"):
        assert words in done.stdout, (words, done.stdout)


def _quota(cluster: RealCluster, gpus: int | None) -> None:
    core = _core(cluster)
    if gpus is None:
        core.delete_namespaced_resource_quota("gpus", NS)
        return
    core.create_namespaced_resource_quota(NS, {"metadata": {"name": "gpus"},
                                               "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}}})
    wait_until(lambda: (core.read_namespaced_resource_quota("gpus", NS).status.hard or {}) != {}, timeout_s=60,
               what="ResourceQuota gpus status")


def _runtime(cluster: RealCluster, on: bool) -> None:
    args = ("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", "torch-distributed")
    if not on:
        found = _custom(cluster).get_cluster_custom_object(*args)
        STATE["runtime"] = {"apiVersion": found["apiVersion"], "kind": found["kind"],
                            "metadata": {"name": "torch-distributed",
                                         "labels": found["metadata"].get("labels") or {}}, "spec": found["spec"]}
        _custom(cluster).delete_cluster_custom_object(*args)
    else:
        assert create(cluster.api, STATE["runtime"], dry_run=False).status == 201


def _hold_gpus(cluster: RealCluster, on: bool) -> None:
    """Another team's pod holding all 8 GPUs of h100-1 (bound there, Running by kwok)."""
    core = _core(cluster)
    if not on:
        core.delete_namespaced_pod("holder", "other-team", grace_period_seconds=0)
        wait_until(lambda: not core.list_namespaced_pod("other-team").items, timeout_s=60, what="holder gone")
        return
    if "other-team" not in [n.metadata.name for n in core.list_namespace().items]:
        make_namespace(cluster.api, "other-team")
    core.create_namespaced_pod("other-team", {"metadata": {"name": "holder"}, "spec": {
        "nodeName": "h100-1", "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "c", "image": "registry.example/x:1",
                        "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
    wait_until(lambda: core.read_namespaced_pod("holder", "other-team").status.phase == "Running", timeout_s=60,
               what="holder Running")


def _nominal(cluster: RealCluster, gpus: int) -> None:
    patch = [{"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/resources/2/nominalQuota",
              "value": str(gpus)}]
    cluster.kubectl("patch", "clusterqueue", "gpu-h100", "--type", "json", "-p", json.dumps(patch))


# the review's faults (issue 50), each: make, undo, its ✗ line's start, words its fix line holds
GANG_FAULTS: dict[str, tuple[Callable[[RealCluster], Any], Callable[[RealCluster], Any], str, str]] = {
    "checkpoint claim ReadWriteOnce": (
        lambda c: _claim(c, "llmpack-ckpt", "ReadWriteOnce"), lambda c: _claim(c, "llmpack-ckpt", "ReadWriteMany"),
        f"✗ PersistentVolumeClaim llmpack-ckpt in {NS} is ReadWriteOnce, not ReadWriteMany (the gang's 2 node pods",
        '"accessModes":["ReadWriteMany"]'),
    "ResourceQuota of 8 GPUs for a 16-GPU gang": (
        lambda c: _quota(c, 8), lambda c: _quota(c, None),
        f"✗ ResourceQuota gpus in {NS} leaves 8 requests.nvidia.com/gpu; the run's GPU pods need 16",
        "patch resourcequota gpus --type merge -p '{\"spec\":{\"hard\":{\"requests.nvidia.com/gpu\":\"16\"}}}'"),
    "torch-distributed runtime deleted": (
        lambda c: _runtime(c, False), lambda c: _runtime(c, True),
        "✗ ClusterTrainingRuntime torch-distributed missing (the TrainJob's runtimeRef)", "runtimes?ref=v2.3.0"),
    "LocalQueue missing": (
        lambda c: _local_queue(c, None), lambda c: _local_queue(c, "gpu-h100"),
        f"✗ Kueue LocalQueue team-a missing in {NS}", '"kind":"LocalQueue"'),
    "GPUs held by another team's pod": (
        lambda c: _hold_gpus(c, True), lambda c: _hold_gpus(c, False),
        "✗ TrainJob node pod (8 nvidia.com/gpu, 64 cpu, 512Gi memory) fits 1 GPU node(s), needs 2: h100-1 lacks 8 "
        "nvidia.com/gpu (has 0 nvidia.com/gpu free, 8 held by other pods)", "spec.nodeName=h100-1"),
    "LocalQueue on a missing ClusterQueue": (
        lambda c: _local_queue(c, "gpu-gone"), lambda c: _local_queue(c, "gpu-h100"),
        f"✗ Kueue ClusterQueue gpu-gone missing (LocalQueue team-a in {NS} points at it", '"kind":"ClusterQueue"'),
    "ClusterQueue of 8 GPUs": (
        lambda c: _nominal(c, 8), lambda c: _nominal(c, 16),
        "✗ Kueue ClusterQueue gpu-h100 (of LocalQueue team-a) has 8 nvidia.com/gpu nominal quota; the gang needs 16",
        "kubectl patch clusterqueue gpu-h100 --type json"),
    "model claim ReadWriteOnce on several nodes": (
        lambda c: _claim(c, "llmpack-models", "ReadWriteOnce"),
        lambda c: _claim(c, "llmpack-models", "ReadOnlyMany"),
        f"✗ PersistentVolumeClaim llmpack-models in {NS} is ReadWriteOnce, not ReadWriteMany or ReadOnlyMany",
        "delete pvc llmpack-models"),
}


@pytest.mark.parametrize("name", list(GANG_FAULTS), ids=[n.replace(" ", "-") for n in GANG_FAULTS])
def test_each_gang_fault_is_its_own_cross_with_its_fix(healthy: RealCluster, name: str) -> None:
    make, undo, expect, fix = GANG_FAULTS[name]
    make(healthy)
    try:
        done = doctor(healthy)
    finally:
        undo(healthy)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    crosses = [line for line in lines if line.startswith("✗")]
    assert len(crosses) == 1 and crosses[0].startswith(expect), (name, crosses)
    assert fix in lines[lines.index(crosses[0]) + 1], (name, lines[lines.index(crosses[0]) + 1])


def _wait_for_first_consumer(cluster: RealCluster, on: bool) -> None:
    from kubernetes import client

    if on:
        client.StorageV1Api(cluster.api).create_storage_class({"metadata": {"name": "wffc"},
                                                               "provisioner": "example.com/none",
                                                               "volumeBindingMode": "WaitForFirstConsumer"})
        _claim(cluster, "llmpack-shared", "ReadWriteMany", storage_class="wffc", volume=False)
    else:
        _claim(cluster, "llmpack-shared", "ReadWriteMany")
        client.StorageV1Api(cluster.api).delete_storage_class("wffc")


HEALTHY = {
    "claim Pending under WaitForFirstConsumer": (
        lambda c: _wait_for_first_consumer(c, True), lambda c: _wait_for_first_consumer(c, False),
        f"✓ PersistentVolumeClaim llmpack-shared in {NS} is Pending until its first pod (WaitForFirstConsumer)"),
    "ResourceQuota of exactly the gang's 16 GPUs": (
        lambda c: _quota(c, 16), lambda c: _quota(c, None), f"✓ ResourceQuota in {NS}: 1 admit the run's GPU pods"),
}


@pytest.mark.parametrize("name", list(HEALTHY), ids=[n.replace(" ", "-") for n in HEALTHY])
def test_healthy_variants_exit_0(healthy: RealCluster, name: str) -> None:
    make, undo, words = HEALTHY[name]
    make(healthy)
    try:
        done = doctor(healthy)
    finally:
        undo(healthy)
    assert done.returncode == 0 and words in done.stdout, done.stdout + done.stderr


def test_trainer_controller_stopped_last(healthy: RealCluster) -> None:
    """The Trainer process killed (its CRDs, runtime and webhook registrations left): its leader Lease is no longer
    renewed, doctor's own ✗ with the install command; the real API server refuses the compiled TrainJob (its
    webhook does not answer). Last in this module: the controller is not started again."""
    pids = dict(line.split() for line in (healthy.state_dir / "pids").read_text().splitlines() if line.strip())
    os.kill(int(pids["trainer-controller"]), signal.SIGKILL)
    done = doctor(healthy)
    lines = done.stdout.splitlines()
    crosses = [line for line in lines if line.startswith("✗")]
    assert done.returncode == 1 and len(crosses) == 1, done.stdout + done.stderr
    assert crosses[0].startswith("✗ Kubeflow Trainer controller not running: its leader Lease "
                                 "kubeflow-system/trainer.kubeflow.org was not renewed"), crosses
    assert "kubectl apply --server-side -k" in lines[lines.index(crosses[0]) + 1]
    (job,) = [d for d in yaml.safe_load_all((Path(STATE["compiled"]) / "trainjob" / "finetune-trainjob.yaml")
                                            .read_text()) if d]
    refused = create(healthy.api, job, namespace=NS)
    assert refused.status >= 400 and "failed calling webhook" in refused.message, refused
