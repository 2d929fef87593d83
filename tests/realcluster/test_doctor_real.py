"""``llmpack doctor`` against the real control plane: all ✓ on a good setup, and real faults made real.

The good setup is what first-run-on-a-cluster.md asks for the MLflow path, made on the real API
server: namespace, the tracking Secret, the artifacts PVC bound to a PersistentVolume by the
real PV controller. Each fault then changes one thing for real (a node cordoned by the API,
a ServiceAccount with no rights and a real token, a CRD not served, ...) and ``llmpack doctor``
runs as a user types it, with the kubeconfig ``make cluster-up`` writes (or the
ServiceAccount's). Each fault must give its own ✗ line and exit code 1.

The doctor checks what was compiled (``--compiled``): the fixture compiles the MLflow path for this
namespace, and a 2-node gang beside it. Where a fault is one the doctor could once not see (nodes too
small, a quota, a LimitRange), the real component's own refusal of a pod of the compiled size is
asserted beside the ✗ line (:data:`REAL`), so the fault is shown real, not imagined.
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
from tests.realcluster import crds
from tests.realcluster.apiserver import make_namespace, wait_until
from tests.realcluster.conftest import RealCluster

pytestmark = pytest.mark.cluster

NS = "llmpack-doctor"
GPU_NODES = ("h100-0", "h100-1")


COMPILED: dict[str, Path] = {}  # "single", "gang" -> what llmpack compile --out wrote (the module fixture)
GANG_FLAGS = ("--nodes", "2", "--gpus", "8", "--cache-pvc", "llmpack-artifacts")


def doctor(kubeconfig: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``llmpack doctor --path mlflow`` in a process of its own, on ``kubeconfig``, on the compiled artifacts
    (``{single}``/``{gang}`` in ``flags``: those folders; without ``--compiled``: the single-node one)."""
    flags = tuple(f.format(**{k: str(v) for k, v in COMPILED.items()}) for f in flags)
    compiled = () if "--compiled" in flags else ("--compiled", str(COMPILED["single"]))
    namespace = () if "--namespace" in flags else ("--namespace", NS)
    return subprocess.run([sys.executable, "-m", "llmpack", "doctor", "--path", "mlflow", *namespace,
                           "--kubeconfig", str(kubeconfig), *compiled, *flags], cwd=REPO, capture_output=True,
                          text=True, timeout=180)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``llmpack compile --namespace llmpack-doctor``, and the same as a 2 x 8 GPU gang."""
    for name, flags in (("single", ()), ("gang", GANG_FLAGS)):
        out = tmp_path_factory.mktemp(f"compiled-{name}")
        done = subprocess.run([sys.executable, "-m", "llmpack", "compile", "--namespace", NS, "--out", str(out),
                               *flags],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        COMPILED[name] = out
    return COMPILED


@pytest.fixture(scope="module")
def good(real_cluster: RealCluster, compiled: dict[str, Path]) -> RealCluster:
    """Namespace, tracking Secret, and the artifacts PVC Bound to a PV by the real PV controller."""
    from kubernetes import client

    core = client.CoreV1Api(real_cluster.api)
    make_namespace(real_cluster.api, NS)
    core.create_namespaced_secret(NS, {"metadata": {"name": "llmpack-mlflow"},
                                       "stringData": {"tracking-uri": "http://mlflow.mlflow.svc.cluster.local:5000",
                                                      "signing-key": GOOD_KEY}})
    core.create_persistent_volume({"metadata": {"name": "doctor-artifacts"},
                                   "spec": {"capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteOnce"],
                                            "storageClassName": "", "nfs": {"server": "127.0.0.1", "path": "/a"}}})
    core.create_namespaced_persistent_volume_claim(NS, {
        "metadata": {"name": "llmpack-artifacts"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "resources": {"requests": {"storage": "50Gi"}}}})
    wait_until(lambda: core.read_namespaced_persistent_volume_claim("llmpack-artifacts", NS).status.phase == "Bound",
               timeout_s=60, what="PVC llmpack-artifacts Bound by the PV controller")
    return real_cluster


def test_all_checks_hold_on_a_good_setup(good: RealCluster) -> None:
    """Every line ✓, exit 0, the server's real version read, each capacity and admission check made."""
    done = doctor(good.kubeconfig)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith("✗")], done.stdout
    assert any("answers (v1.36.1)" in line for line in lines), done.stdout
    assert "PersistentVolumeClaim llmpack-artifacts in llmpack-doctor is Bound" in done.stdout
    for line in (f"✓ the artifacts in {COMPILED['single']} are compiled for namespace {NS}",
                 "✓ mlflow pod (1 nvidia.com/gpu, 8 cpu, 64Gi memory) fits 2 GPU node(s) (need 1)",
                 f"✓ ResourceQuota in {NS}: none", f"✓ LimitRange in {NS}: none"):
        assert line in lines, (line, done.stdout)
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
    fix: str = ""  # words the fix line under it must hold


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


GOOD_KEY = "7a" * 32  # the tracking Secret's signing-key: doctor checks it is there, never prints it


def _restore_secret(cluster: RealCluster) -> None:
    _core(cluster).create_namespaced_secret(NS, {"metadata": {"name": "llmpack-mlflow"},
                                                 "stringData": {"tracking-uri": "http://mlflow:5000",
                                                                "signing-key": GOOD_KEY}})


def _nobody_kubeconfig(cluster: RealCluster, tmp: Path) -> Path:
    """A kubeconfig with a real token of ServiceAccount ``nobody`` (no Role bound), from the TokenRequest API."""
    import yaml

    core = _core(cluster)
    core.create_namespaced_service_account(NS, {"metadata": {"name": "nobody"}})
    token = core.create_namespaced_service_account_token("nobody", NS,
                                                         {"spec": {"expirationSeconds": 3600}}).status.token
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
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "resources": {"requests": {"storage": "5Ti"}}}})


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
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "resources": {"requests": {"storage": "50Gi"}}}})
    wait_until(lambda: core.read_namespaced_persistent_volume_claim("llmpack-artifacts", NS).status.phase == "Bound",
               timeout_s=60, what="PVC Bound again")


def _nothing(cluster: RealCluster) -> None:
    return None


def _allocatable(cluster: RealCluster, cpu: str, memory: str) -> None:
    """Set the GPU nodes' allocatable CPU and memory (status, as a kubelet reports it; kwok's heartbeat keeps it)."""
    for node in GPU_NODES:
        _core(cluster).patch_node_status(node, {"status": {"allocatable": {"cpu": cpu, "memory": memory}}})


def _quota(cluster: RealCluster, on: bool, name: str = "no-gpus", hard: dict[str, str] | None = None) -> None:
    if on:
        _core(cluster).create_namespaced_resource_quota(
            NS, {"metadata": {"name": name}, "spec": {"hard": hard or {"requests.nvidia.com/gpu": "0"}}})
        # until the quota controller fills in status.hard, admission answers "status unknown for quota"
        wait_until(lambda: (_core(cluster).read_namespaced_resource_quota(name, NS).status.hard or {}) != {},
                   timeout_s=60, what=f"ResourceQuota {name} status")
    else:
        _core(cluster).delete_namespaced_resource_quota(name, NS)


def _limit_range(cluster: RealCluster, on: bool) -> None:
    if on:
        _core(cluster).create_namespaced_limit_range(NS, {"metadata": {"name": "small-containers"}, "spec": {
            "limits": [{"type": "Container", "max": {"memory": "16Gi"}}]}})
    else:
        _core(cluster).delete_namespaced_limit_range("small-containers", NS)


def _uninstall_trainer(cluster: RealCluster) -> None:
    """Trainer's CRDs deleted again, until the API server no longer serves TrainJobs."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(cluster.api)
    names = [c.metadata.name for c in ext.list_custom_resource_definition().items
             if c.spec.group == "trainer.kubeflow.org"]
    for name in names:
        ext.delete_custom_resource_definition(name)
    wait_until(lambda: not [c for c in ext.list_custom_resource_definition().items
                            if c.spec.group == "trainer.kubeflow.org"], timeout_s=60, what="Trainer CRDs deleted")


def _lose(cluster: RealCluster) -> None:
    """The artifacts PVC made Lost by the real PV controller: bound once (bind-completed) to a volume that is gone."""
    core = _core(cluster)
    core.delete_namespaced_persistent_volume_claim("llmpack-artifacts", NS)
    wait_until(lambda: not core.list_namespaced_persistent_volume_claim(NS).items, timeout_s=30, what="PVC deleted")
    core.create_namespaced_persistent_volume_claim(NS, {
        "metadata": {"name": "llmpack-artifacts", "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": "a-volume-that-is-gone",
                 "resources": {"requests": {"storage": "50Gi"}}}})
    wait_until(lambda: core.read_namespaced_persistent_volume_claim("llmpack-artifacts", NS).status.phase == "Lost",
               timeout_s=60, what="PVC llmpack-artifacts Lost by the PV controller")


FAULTS = {
    "GPU nodes cordoned": Fault(
        expect="✗ every GPU node has a taint the GPU pods do not tolerate "
               "(e.g. node.kubernetes.io/unschedulable:NoSchedule",
        make=lambda c: _cordon(c, True), undo=lambda c: _cordon(c, False), fix="kubectl uncordon h100-"),
    "GPU nodes tainted": Fault(
        expect="✗ every GPU node has a taint the GPU pods do not tolerate (e.g. example.com/maintenance=true:NoExecute",
        make=lambda c: _taint(c, True), undo=lambda c: _taint(c, False)),
    "no node of the GPU type": Fault(expect="✗ no node is a nvidia-a100-80gb node by its labels", make=_nothing,
                                     flags=("--gpu-type", "a100")),
    "GPUs per node too few": Fault(expect="✗ 0 tolerated GPU node(s) with 16 allocatable nvidia.com/gpu, "
                                          "need 1 (most: 8)",
                                   make=_nothing, flags=("--gpus", "16")),
    "tracking Secret missing": Fault(expect="✗ Secret llmpack-mlflow missing in llmpack-doctor",
                                     make=_delete_secret, undo=_restore_secret),
    # the committed artifacts, compiled for namespace llmpack, which this cluster lacks
    "namespace missing": Fault(expect="✗ namespace llmpack does not exist", make=_nothing,
                               flags=("--namespace", "llmpack", "--compiled", str(REPO)),
                               fix="kubectl create namespace llmpack"),
    "PVC Pending (no volume fits)": Fault(
        expect="✗ PersistentVolumeClaim llmpack-artifacts in llmpack-doctor is Pending, not Bound",
        make=_unbind, undo=_rebind),
    "TrainJob API not served": Fault(
        expect="✗ TrainJob (trainer.kubeflow.org/v1alpha1) is not served by this API server; "
               "trainjob/finetune-trainjob.yaml creates one",
        make=_nothing, flags=(*GANG_FLAGS, "--compiled", "{gang}"), alone=False, fix="runtimes?ref=v2.3.0"),
    "RBAC: a real ServiceAccount with no Role": Fault(
        expect="✗ RBAC (pod watcher): you may not list nodes in the cluster",
        make=_nothing, kubeconfig=_nobody_kubeconfig, alone=False),
}

FAULTS.update({
    "GPU nodes too small for the pod's CPU and memory": Fault(
        expect="✗ mlflow pod (1 nvidia.com/gpu, 8 cpu, 64Gi memory) fits 0 GPU node(s), needs 1: h100-0 lacks 8 cpu "
               "(has 4 cpu); 64Gi memory (has 16Gi memory)",
        make=lambda c: _allocatable(c, "4", "16Gi"), undo=lambda c: _allocatable(c, "192", "2048Gi")),
    "GPU nodes too small for the pod's memory": Fault(
        expect="✗ mlflow pod (1 nvidia.com/gpu, 8 cpu, 64Gi memory) fits 0 GPU node(s), needs 1: h100-0 lacks 64Gi "
               "memory (has 32Gi memory)",
        make=lambda c: _allocatable(c, "192", "32Gi"), undo=lambda c: _allocatable(c, "192", "2048Gi")),
    "ResourceQuota admits no GPU": Fault(
        expect=f"✗ ResourceQuota no-gpus in {NS} leaves 0 requests.nvidia.com/gpu; the run's GPU pods need 1",
        make=lambda c: _quota(c, True), undo=lambda c: _quota(c, False)),
    "ResourceQuota too small for the pod's CPU": Fault(
        expect=f"✗ ResourceQuota few-cpus in {NS} leaves 4 requests.cpu; the run's GPU pods need 8",
        make=lambda c: _quota(c, True, "few-cpus", {"requests.cpu": "4"}),
        undo=lambda c: _quota(c, False, "few-cpus")),
    "LimitRange caps the pod's memory": Fault(
        expect=f"✗ LimitRange small-containers in {NS} caps a Container's memory at 16Gi memory; "
               "mlflow pod asks 64Gi memory",
        make=lambda c: _limit_range(c, True), undo=lambda c: _limit_range(c, False)),
    "Trainer installed, no ClusterTrainingRuntime": Fault(
        expect="✗ ClusterTrainingRuntime torch-distributed missing (the TrainJob's runtimeRef)",
        make=lambda c: crds.install(c.api, "trainer-v2.3"), undo=_uninstall_trainer,
        flags=(*GANG_FLAGS, "--compiled", "{gang}"), alone=False, fix="runtimes?ref=v2.3.0"),
    "Argo Workflow API not served": Fault(
        expect="✗ Workflow (argoproj.io/v1alpha1) is not served by this API server; "
               "argo_workflows/finetune.yaml creates one",
        make=_nothing, flags=("--path", "argo"), alone=False),
    "artifacts compiled for another namespace": Fault(
        expect=f"✗ the artifacts in {REPO} are compiled for namespace llmpack, not {NS}",
        make=_nothing, flags=("--compiled", str(REPO)), fix="llmpack cluster doctor --namespace llmpack"),
    "PVC Lost (its volume gone)": Fault(
        expect=f"✗ PersistentVolumeClaim llmpack-artifacts in {NS} is Lost, not Bound (its PersistentVolume is gone",
        make=_lose, undo=_rebind),
})

def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


NOWHERE = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
TRACKING: dict[str, Any] = {}  # the guarded tracking server while a fault runs it
TRACKING_USER, TRACKING_PASSWORD = "ml-platform", "doctor-real-Pa55"


def _guarded_tracking_server(cluster: RealCluster, password: str) -> None:
    """The real MLflow tracking server app on loopback behind basic auth (as an ingress with auth fronts it), and
    MLflow's credential variables set to ``password`` for the doctor's process."""
    import os
    import threading

    from mlflow.server.constants import ARTIFACT_ROOT_ENV_VAR, BACKEND_STORE_URI_ENV_VAR
    from werkzeug.serving import make_server

    from tests.llmpack.cluster.doctor.test_doctor_tracking import basic_auth

    root = Path(str(cluster.state_dir)) / "tracking"
    root.mkdir(exist_ok=True)
    os.environ[BACKEND_STORE_URI_ENV_VAR] = f"sqlite:///{root / 'mlflow.db'}"
    os.environ[ARTIFACT_ROOT_ENV_VAR] = str(root / "artifacts")
    from mlflow.server import app

    server = make_server("127.0.0.1", 0, basic_auth(app, TRACKING_USER, TRACKING_PASSWORD), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    TRACKING["server"] = server
    COMPILED["tracking"] = f"http://127.0.0.1:{server.server_port}"  # type: ignore[assignment] - a flag's value
    os.environ.update(MLFLOW_TRACKING_USERNAME=TRACKING_USER, MLFLOW_TRACKING_PASSWORD=password)


def _stop_tracking_server(cluster: RealCluster) -> None:
    import os

    TRACKING.pop("server").shutdown()
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        os.environ.pop(name, None)


def _tracking_secret(cluster: RealCluster, data: dict[str, str]) -> None:
    _core(cluster).replace_namespaced_secret("llmpack-mlflow", NS, {"metadata": {"name": "llmpack-mlflow"},
                                                                     "stringData": data})


def _good_tracking_secret(cluster: RealCluster) -> None:
    _core(cluster).delete_namespaced_secret("llmpack-mlflow", NS)
    _restore_secret(cluster)


FAULTS.update({
    "tracking server unreachable": Fault(
        expect=f"✗ MLflow tracking server at {NOWHERE} unreachable (ConnectionError)", make=_nothing,
        flags=("--tracking-uri", NOWHERE), fix="port-forward"),
    "tracking server refuses the credentials": Fault(
        expect="✗ MLflow tracking server at http://127.0.0.1:", make=lambda c: _guarded_tracking_server(c, "wrong"),
        undo=_stop_tracking_server, flags=("--tracking-uri", "{tracking}"), fix="MLFLOW_TRACKING_PASSWORD"),
    "tracking Secret without its tracking-uri key": Fault(
        expect=f"✗ Secret llmpack-mlflow in {NS} has no tracking-uri key",
        make=lambda c: _tracking_secret(c, {"username": "u"}), undo=_good_tracking_secret),
    "tracking Secret without its signing-key": Fault(
        expect=f"✗ Secret llmpack-mlflow in {NS} has no signing-key key",
        make=lambda c: _tracking_secret(c, {"tracking-uri": "http://mlflow:5000"}), undo=_good_tracking_secret,
        fix="openssl rand -hex 32"),
    "tracking-uri not a server's URL": Fault(
        expect=f"✗ Secret llmpack-mlflow in {NS}: tracking-uri is not an http(s) URL",
        make=lambda c: _tracking_secret(c, {"tracking-uri": "sqlite:///mlflow.db"}), undo=_good_tracking_secret),
    "HF token Secret missing": Fault(expect=f"✗ Secret hf-token missing in {NS}", make=_nothing,
                                     flags=("--hf-token-secret", "hf-token")),
    "image pull Secret missing": Fault(expect=f"✗ image pull Secret regcred missing in {NS}", make=_nothing,
                                       flags=("--image-pull-secret", "regcred")),
    "model PVC missing": Fault(expect=f"✗ PersistentVolumeClaim models missing in {NS}", make=_nothing,
                               flags=("--model-pvc", "models")),
    "checkpoint PVC missing": Fault(expect=f"✗ PersistentVolumeClaim ckpt missing in {NS}", make=_nothing,
                                    flags=("--checkpoint-pvc", "ckpt")),
})


def test_the_tracking_server_answers_good_credentials_and_the_password_never_shows(good: RealCluster) -> None:
    """The guarded tracking server with the right password: ✓ its own line, exit 0, the password nowhere."""
    _guarded_tracking_server(good, TRACKING_PASSWORD)
    try:
        done = doctor(good.kubeconfig, "--tracking-uri", "{tracking}")
    finally:
        _stop_tracking_server(good)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"✓ MLflow tracking server at {COMPILED['tracking']} answers an authenticated read" in done.stdout
    assert TRACKING_PASSWORD not in done.stdout + done.stderr


# fault -> the real component's words refusing a pod of the compiled MLflow Job's size (asserted beside the ✗ line)
REAL: dict[str, str] = {
    "GPU nodes too small for the pod's CPU and memory": "Insufficient cpu",  # the real scheduler's reason
    "GPU nodes too small for the pod's memory": "Insufficient memory",
    "ResourceQuota admits no GPU": "exceeded quota: no-gpus",                 # ResourceQuota admission's
    "ResourceQuota too small for the pod's CPU": "exceeded quota: few-cpus",
    "LimitRange caps the pod's memory": "must be less than or equal to memory limit of 16Gi",  # LimitRanger's default
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


def test_enough_real_faults() -> None:
    """Each fault below is made for real and gives its own ✗ line: at least 25 distinct ones."""
    assert len(FAULTS) >= 25, len(FAULTS)


@pytest.mark.parametrize("name", list(FAULTS), ids=[n.replace(" ", "-") for n in FAULTS])
def test_each_real_fault_gives_its_own_cross_and_exit_1(good: RealCluster, tmp_path: Path, name: str) -> None:
    """The fault made for real, the doctor run as a user runs it: exit 1 and a ✗ line starting with the expected words
    (and its fix line holding the expected words); where :data:`REAL` names it, the real component refuses the pod."""
    fault = FAULTS[name]
    fault.make(good)
    try:
        kubeconfig = fault.kubeconfig(good, tmp_path) if fault.kubeconfig else good.kubeconfig
        done = doctor(kubeconfig, *fault.flags)
        real = _mlflow_sized_pod(good) if name in REAL else {}
    finally:
        fault.undo(good)
    if name in REAL:
        assert REAL[name] in str(real), (name, real)  # the fault is real: the cluster would not run the pod
    assert done.returncode == 1, f"{name}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    lines = done.stdout.splitlines()
    crosses = [line for line in lines if line.startswith("✗")]
    assert crosses, done.stdout
    mine = [line for line in crosses if line.startswith(fault.expect)]
    assert mine, (name, crosses)
    assert len(crosses) == 1 or not fault.alone, (name, crosses)
    if fault.fix:
        assert fault.fix in lines[lines.index(mine[0]) + 1], (name, lines[lines.index(mine[0]) + 1])


def test_a_claim_pending_under_wait_for_first_consumer_is_healthy_immediate_is_not(good: RealCluster) -> None:
    """The real PV controller leaves a claim of a WaitForFirstConsumer class Pending until a pod uses it: doctor
    says ✓ (it once said ✗, failing most clouds' default class); the same claim under an Immediate class with no
    volume to bind stays Pending for good: ✗."""
    from kubernetes import client

    core, storage = client.CoreV1Api(good.api), client.StorageV1Api(good.api)
    for mode in ("WaitForFirstConsumer", "Immediate"):
        name = f"doctor-{mode.lower()}"
        storage.create_storage_class({"metadata": {"name": name}, "provisioner": "example.com/none",
                                      "volumeBindingMode": mode})
        core.create_namespaced_persistent_volume_claim(NS, {
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": name,
                     "resources": {"requests": {"storage": "1Gi"}}}})
    try:
        wait_until(lambda: all(core.read_namespaced_persistent_volume_claim(f"doctor-{m}", NS).status.phase
                               == "Pending" for m in ("waitforfirstconsumer", "immediate")),
                   timeout_s=30, what="both claims Pending, as the real PV controller leaves them")
        done = doctor(good.kubeconfig, "--model-pvc", "doctor-waitforfirstconsumer")
        assert done.returncode == 0, done.stdout + done.stderr
        assert (f"✓ PersistentVolumeClaim doctor-waitforfirstconsumer in {NS} is Pending until its first pod "
                "(WaitForFirstConsumer)") in done.stdout, done.stdout
        done = doctor(good.kubeconfig, "--model-pvc", "doctor-immediate")
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"✗ PersistentVolumeClaim doctor-immediate in {NS} is Pending, not Bound" in done.stdout, done.stdout
    finally:
        for mode in ("waitforfirstconsumer", "immediate"):
            core.delete_namespaced_persistent_volume_claim(f"doctor-{mode}", NS)
            storage.delete_storage_class(f"doctor-{mode}")
