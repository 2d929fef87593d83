"""``llmpack doctor`` against the real control plane: all ✓ on a good setup, and real faults made real.

The good setup is what first-run-on-a-cluster.md asks for the MLflow path, made on the real API
server: namespace, the tracking Secret, the artifacts PVC bound to a PersistentVolume by the
real PV controller. Each fault then changes one thing for real (a node cordoned by the API,
a ServiceAccount with no rights and a real token, a CRD not served, ...) and ``llmpack doctor``
runs as a user types it, with the kubeconfig ``make cluster-up`` writes (or the
ServiceAccount's). Each fault must give its own ✗ line and exit code 1.

Faults the doctor does not see today are listed in :data:`MISSED` and asserted missed ("all ...
checks hold", exit 0), so a doctor that learns to see one flips its case.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.realcluster.apiserver import make_namespace, wait_until
from tests.realcluster.conftest import RealCluster

pytestmark = pytest.mark.cluster

NS = "llmpack-doctor"
GPU_NODES = ("h100-0", "h100-1")


def doctor(kubeconfig: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``llmpack doctor --path mlflow`` in a process of its own, on ``kubeconfig``."""
    return subprocess.run([sys.executable, "-m", "llmpack", "doctor", "--path", "mlflow", "--namespace", NS,
                           "--kubeconfig", str(kubeconfig), *flags], cwd=REPO, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def good(real_cluster: RealCluster) -> RealCluster:
    """Namespace, tracking Secret, and the artifacts PVC Bound to a PV by the real PV controller."""
    from kubernetes import client

    core = client.CoreV1Api(real_cluster.api)
    make_namespace(real_cluster.api, NS)
    core.create_namespaced_secret(NS, {"metadata": {"name": "llmpack-mlflow"},
                                       "stringData": {"tracking-uri": "http://mlflow.mlflow.svc.cluster.local:5000"}})
    core.create_persistent_volume({"metadata": {"name": "doctor-artifacts"},
                                   "spec": {"capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteOnce"],
                                            "storageClassName": "", "nfs": {"server": "127.0.0.1", "path": "/a"}}})
    core.create_namespaced_persistent_volume_claim(NS, {
        "metadata": {"name": "llmpack-artifacts"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "resources": {"requests": {"storage": "50Gi"}}}})
    wait_until(lambda: core.read_namespaced_persistent_volume_claim("llmpack-artifacts", NS).status.phase == "Bound",
               timeout_s=60, what="PVC llmpack-artifacts Bound by the PV controller")
    return real_cluster


def test_all_checks_hold_on_a_good_setup(good: RealCluster) -> None:
    """Every line ✓, exit 0, the server's real version read."""
    done = doctor(good.kubeconfig)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith("✗")], done.stdout
    assert any("answers (v1.36.1)" in line for line in lines), done.stdout
    assert "PersistentVolumeClaim llmpack-artifacts in llmpack-doctor is Bound" in done.stdout
    assert lines[-1].startswith("all ") and lines[-1].endswith(" checks hold"), lines[-1]


# --------------------------------------------------------------------------- faults made real


@dataclass
class Fault:
    """One thing broken for real (``make``, undone by ``undo``), the ✗ line it must give, extra doctor flags."""

    expect: str
    make: Callable[[RealCluster], Any]
    undo: Callable[[RealCluster], Any] = lambda cluster: None
    flags: tuple[str, ...] = ()
    kubeconfig: Callable[[RealCluster, Path], Path] | None = None
    alone: bool = True  # the only ✗ line (a fault that takes more away fails more checks)


def _core(cluster: RealCluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cluster.api)


def _cordon(cluster: RealCluster, value: bool) -> None:
    for node in GPU_NODES:
        _core(cluster).patch_node(node, {"spec": {"unschedulable": value}})


def _taint(cluster: RealCluster, on: bool) -> None:
    for node in GPU_NODES:
        taints = [t for t in _core(cluster).read_node(node).spec.taints or [] if t.key != "example.com/maintenance"]
        body = [{"key": t.key, "effect": t.effect, **({"value": t.value} if t.value else {})} for t in taints]
        if on:
            body.append({"key": "example.com/maintenance", "value": "true", "effect": "NoExecute"})
        _core(cluster).patch_node(node, {"spec": {"taints": body}})


def _delete_secret(cluster: RealCluster) -> None:
    _core(cluster).delete_namespaced_secret("llmpack-mlflow", NS)


def _restore_secret(cluster: RealCluster) -> None:
    _core(cluster).create_namespaced_secret(NS, {"metadata": {"name": "llmpack-mlflow"},
                                                 "stringData": {"tracking-uri": "http://mlflow:5000"}})


def _nobody_kubeconfig(cluster: RealCluster, tmp: Path) -> Path:
    """A kubeconfig with a real token of ServiceAccount ``nobody`` (no Role bound), from the TokenRequest API."""
    import yaml

    core = _core(cluster)
    core.create_namespaced_service_account(NS, {"metadata": {"name": "nobody"}})
    token = core.create_namespaced_service_account_token("nobody", NS, {"spec": {"expirationSeconds": 3600}}).status.token
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    admin["users"] = [{"name": "nobody", "user": {"token": token}}]
    admin["contexts"] = [{"name": "llmpack", "context": {"cluster": "llmpack", "user": "nobody"}}]
    path = tmp / "nobody.kubeconfig"
    path.write_text(yaml.safe_dump(admin))
    path.chmod(0o600)
    return path


def _unbind(cluster: RealCluster) -> None:
    core = _core(cluster)
    core.delete_namespaced_persistent_volume_claim("llmpack-artifacts", NS)
    wait_until(lambda: not core.list_namespaced_persistent_volume_claim(NS).items, timeout_s=30, what="PVC deleted")
    core.create_namespaced_persistent_volume_claim(NS, {
        "metadata": {"name": "llmpack-artifacts"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "resources": {"requests": {"storage": "5Ti"}}}})


def _rebind(cluster: RealCluster) -> None:
    core = _core(cluster)
    core.delete_namespaced_persistent_volume_claim("llmpack-artifacts", NS)
    wait_until(lambda: not core.list_namespaced_persistent_volume_claim(NS).items, timeout_s=30, what="PVC deleted")
    core.delete_persistent_volume("doctor-artifacts")
    wait_until(lambda: not [p for p in core.list_persistent_volume().items if p.metadata.name == "doctor-artifacts"],
               timeout_s=30, what="PV deleted")
    core.create_persistent_volume({"metadata": {"name": "doctor-artifacts"},
                                   "spec": {"capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteOnce"],
                                            "storageClassName": "", "nfs": {"server": "127.0.0.1", "path": "/a"}}})
    core.create_namespaced_persistent_volume_claim(NS, {
        "metadata": {"name": "llmpack-artifacts"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "resources": {"requests": {"storage": "50Gi"}}}})
    wait_until(lambda: core.read_namespaced_persistent_volume_claim("llmpack-artifacts", NS).status.phase == "Bound",
               timeout_s=60, what="PVC Bound again")


def _nothing(cluster: RealCluster) -> None:
    return None


def _allocatable(cluster: RealCluster, cpu: str, memory: str) -> None:
    """Set the GPU nodes' allocatable CPU and memory (status, as a kubelet reports it; kwok's heartbeat keeps it)."""
    for node in GPU_NODES:
        _core(cluster).patch_node_status(node, {"status": {"allocatable": {"cpu": cpu, "memory": memory}}})


def _quota(cluster: RealCluster, on: bool) -> None:
    if on:
        _core(cluster).create_namespaced_resource_quota(NS, {"metadata": {"name": "no-gpus"},
                                                             "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}})
    else:
        _core(cluster).delete_namespaced_resource_quota("no-gpus", NS)


FAULTS = {
    "GPU nodes cordoned": Fault(
        expect="✗ every GPU node has a taint the GPU pods do not tolerate (e.g. node.kubernetes.io/unschedulable:NoSchedule",
        make=lambda c: _cordon(c, True), undo=lambda c: _cordon(c, False)),
    "GPU nodes tainted": Fault(
        expect="✗ every GPU node has a taint the GPU pods do not tolerate (e.g. example.com/maintenance=true:NoExecute",
        make=lambda c: _taint(c, True), undo=lambda c: _taint(c, False)),
    "no node of the GPU type": Fault(expect="✗ no node is a nvidia-a100-80gb node by its labels", make=_nothing,
                                     flags=("--gpu-type", "a100")),
    "GPUs per node too few": Fault(expect="✗ 0 tolerated GPU node(s) with 16 allocatable nvidia.com/gpu, need 1 (most: 8)",
                                   make=_nothing, flags=("--gpus", "16")),
    "tracking Secret missing": Fault(expect="✗ Secret llmpack-mlflow missing in llmpack-doctor",
                                     make=_delete_secret, undo=_restore_secret),
    "namespace missing": Fault(expect="✗ namespace llmpack-absent", make=_nothing, flags=("--namespace", "llmpack-absent")),
    "PVC Pending (no volume fits)": Fault(
        expect="✗ PersistentVolumeClaim llmpack-artifacts in llmpack-doctor is Pending, not Bound", make=_unbind, undo=_rebind),
    "Trainer API not served": Fault(expect="✗ Kubeflow Trainer is not installed", make=_nothing,
                                    flags=("--nodes", "2", "--gpus", "8", "--cache-pvc", "llmpack-artifacts"), alone=False),
    "RBAC: a real ServiceAccount with no Role": Fault(expect="✗ RBAC (pod watcher): you may not list nodes in the cluster",
                                                      make=_nothing, kubeconfig=_nobody_kubeconfig, alone=False),
}

FAULTS.update({
    "GPU nodes too small for the pod's CPU and memory": Fault(
        expect="", make=lambda c: _allocatable(c, "4", "16Gi"), undo=lambda c: _allocatable(c, "192", "2048Gi")),
    "ResourceQuota admits no GPU": Fault(expect="", make=lambda c: _quota(c, True), undo=lambda c: _quota(c, False)),
})

# fault -> what the real cluster does that the doctor does not see today (asserted: the doctor
# says "all ... checks hold" with exit 0, and the real component refuses the run's pod)
MISSED: dict[str, str] = {
    "GPU nodes too small for the pod's CPU and memory": "Insufficient cpu",  # the real scheduler's reason
    "ResourceQuota admits no GPU": "exceeded quota: no-gpus",                 # ResourceQuota admission's
}


def _mlflow_sized_pod(cluster: RealCluster) -> dict[str, Any]:
    """A pod the size of the compiled MLflow Job's (1 GPU, 8 CPU, 64Gi), tolerating the GPU taint; created for real.

    Returns the server's refusal message, or the scheduler's Unschedulable message once it gives one.
    """
    from kubernetes.client.exceptions import ApiException

    requests = {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi"}
    pod = {"metadata": {"name": "mlflow-sized"}, "spec": {
        "restartPolicy": "Never",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "main", "image": "registry.example/x@sha256:" + "0" * 64,
                        "resources": {"requests": requests, "limits": {"nvidia.com/gpu": "1"}}}]}}
    core = _core(cluster)
    try:
        core.create_namespaced_pod(NS, pod)
    except ApiException as err:
        return {"refused": str(err.body)}

    def reason() -> str | None:
        conditions = core.read_namespaced_pod("mlflow-sized", NS).status.conditions or []
        return next((c.message for c in conditions if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)

    try:
        return {"unschedulable": wait_until(reason, timeout_s=30, what="pod mlflow-sized Unschedulable")}
    finally:
        core.delete_namespaced_pod("mlflow-sized", NS, grace_period_seconds=0)


@pytest.mark.parametrize("name", list(FAULTS), ids=[n.replace(" ", "-") for n in FAULTS])
def test_each_real_fault_gives_its_own_cross_and_exit_1(good: RealCluster, tmp_path: Path, name: str) -> None:
    """The fault made for real, the doctor run as a user runs it: exit 1 and a ✗ line starting with the expected words."""
    fault = FAULTS[name]
    fault.make(good)
    try:
        kubeconfig = fault.kubeconfig(good, tmp_path) if fault.kubeconfig else good.kubeconfig
        done = doctor(kubeconfig, *fault.flags)
        real = _mlflow_sized_pod(good) if name in MISSED else {}
    finally:
        fault.undo(good)
    if name in MISSED:
        assert MISSED[name] in str(real), (name, real)  # the fault is real: the cluster would not run the pod
        assert done.returncode == 0 and "checks hold" in done.stdout, (f"{name}: the doctor sees it now? then "
                                                                        f"remove it from MISSED", done.stdout)
        return
    assert done.returncode == 1, f"{name}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    crosses = [line for line in done.stdout.splitlines() if line.startswith("✗")]
    assert crosses, done.stdout
    assert any(line.startswith(fault.expect) for line in crosses), (name, crosses)
    assert len(crosses) == 1 or not fault.alone, (name, crosses)
