"""``llmpack cluster compare`` on the REAL control plane: argo vs mlflow, spin-up from the real controllers.

A control plane of this module's own with Argo's workflow-controller and the Argo Server
(``LLMPACK_CLUSTER_CONTROLLERS=argo,argo-server``); kwok's nodes cordoned, so every pod lands on
the process kubelet's two nodes (container mode: root only), shaped as production's: one H100 of
a p5.48xlarge (the ``nvidia.com/gpu`` taint the compiled GPU steps tolerate) and an m6i.4xlarge
for the CPU steps. Nothing is rewritten for the test: the committed artifacts are what the CLI
submits (the argo path's Workflow through the real Argo Server, with a ServiceAccount token, run
by the real workflow-controller and argoexec; the mlflow path's Job made by the real Job
controller, its container run in ``/opt/llmpack/mlflow_projects/finetune-k8s`` of the image
folder). Each pod waits the node provisioning delay ``DELAY_MS`` + uniform(0, ``JITTER_MS``)
before its containers start (kwok's stage delay, played by the process kubelet), so spin-up is
not "Ready at once". kfp is not in it: the KFP API server and KFP's own compiler are out of reach
(docs/internals/stand-ins.md), so kfp stays the loopback stand-in's.

The CLI runs as a user types it (a subprocess); its table is printed on the test's output (``-s``)
and written to ``$LLMPACK_COMPARE_REAL_OUT`` when set. docs/internals/real-cluster.md, "compare
on the real controllers".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.realcluster.apiserver import make_namespace
from tests.realcluster.conftest import RealCluster, started_cluster
from tests.realcluster.process_kubelet import ProcessKubelet, ProcessNode
from tests.realcluster.test_argo_pipeline_real import grant_executor
from tests.realcluster.test_argo_real import EXECUTOR_IMAGE, _argo_bin, _can_mount, use_repository

pytestmark = pytest.mark.cluster

NS = "llmpack"  # the compiled artifacts' namespace
LLMPACK_IMAGE = "ghcr.io/llmpack/llmpack"  # every step's image: a folder whose opt/llmpack is this checkout
GPU_NODE, CPU_NODE = "proc-h100-0", "proc-cpu-0"
DELAY_MS, JITTER_MS = 3000, 2000  # each pod's provisioning delay: 3 s + uniform(0, 2 s), seeded
ARGO_STEPS = ("prepare-data", "tokenize", "finetune", "evaluate", "register", "close-record")
REPEATS = int(os.environ.get("LLMPACK_COMPARE_REAL_REPEATS", "2"))


@pytest.fixture(scope="module")
def compare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A control plane with Argo's workflow-controller and the Argo Server (skips where they are not built)."""
    if not _can_mount():
        pytest.skip("the process kubelet's container mode needs mount namespaces (unshare --mount: root)")
    _argo_bin()
    with started_cluster(tmp_path_factory.mktemp("comparecluster") / "state",
                         settings={"LLMPACK_CLUSTER_CONTROLLERS": "argo,argo-server"}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def staged(compare_cluster: RealCluster, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Namespace llmpack as docs/first-run-on-a-cluster.md sets it up (the tracking Secret, the artifacts claim
    bound, the executor Role, an artifact repository, a submitter's token), kwok's nodes cordoned and the process
    nodes up: what the CLI needs, as a dict."""
    from kubernetes import client

    api = compare_cluster.api
    core = client.CoreV1Api(api)
    for node in core.list_node().items:  # kwok's pods run nothing: none of this comparison's may land there
        core.patch_node(node.metadata.name, {"spec": {"unschedulable": True}})
    make_namespace(api, NS)
    grant_executor(api, NS)
    repo = use_repository(api, NS)
    root = Path(tempfile.mkdtemp(prefix="llmpack-compare-real-", dir="/var/tmp"))  # not /tmp: each pod's own
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    (root / "argoexec" / "bin").mkdir(parents=True)
    shutil.copy(_argo_bin() / "argoexec", root / "argoexec" / "bin" / "argoexec")
    (root / "llmpack" / "opt").mkdir(parents=True)
    (root / "llmpack" / "opt" / "llmpack").symlink_to(REPO)  # the Dockerfile's WORKDIR /opt/llmpack
    for folder in ("home", "store", "report"):
        (root / folder).mkdir()
    uri = f"sqlite:///{root / 'store' / 'mlflow.db'}"
    core.create_namespaced_secret(NS, {"metadata": {"name": "llmpack-mlflow"}, "stringData": {"tracking-uri": uri}})
    core.create_persistent_volume({"metadata": {"name": "compare-artifacts"},
                                   "spec": {"capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteOnce"],
                                            "storageClassName": "", "nfs": {"server": "127.0.0.1", "path": "/a"}}})
    core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": "llmpack-artifacts"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": "", "resources": {"requests": {"storage": "1Gi"}}}})
    # the submitter: a ServiceAccount bound to the namespace's admin (Argo's aggregate-to-admin role among it)
    core.create_namespaced_service_account(NS, {"metadata": {"name": "submitter"}})
    client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(NS, {
        "metadata": {"name": "submitter-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "submitter", "namespace": NS}]})
    token = core.create_namespaced_service_account_token("submitter", NS, {"spec": {"expirationSeconds": 7200}})
    key = root / "signing.key"  # one key for the client and every pod, as a Secret gives
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]), "LANG": "C.UTF-8",
           "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HOME": str(root / "home"),
           "LLMPACK_SIGNING_KEY_FILE": str(key)}
    gpu = ProcessNode(name=GPU_NODE, cpu="16", memory="128Gi", gpus=1,
                      labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "1",
                              "node.kubernetes.io/instance-type": "p5.48xlarge"},
                      taints=({"key": "nvidia.com/gpu", "effect": "NoSchedule"},))
    cpu = ProcessNode(name=CPU_NODE, cpu="16", memory="64Gi", labels={"node.kubernetes.io/instance-type": "m6i.4xlarge"})
    with ProcessKubelet(api, [gpu, cpu], root=root / "kubelet", containers=True, base_env=env, deadline_s=600,
                        pod_delay_ms=DELAY_MS, pod_jitter_ms=JITTER_MS, seed=51,
                        images={EXECUTOR_IMAGE: root / "argoexec", LLMPACK_IMAGE: root / "llmpack"}) as k:
        yield {"kubelet": k, "uri": uri, "root": root, "repo": repo, "token": token.status.token, "env": env,
               "argo_host": (compare_cluster.state_dir / "argo-server-url").read_text().strip()}
        assert not k.errors, k.errors


def _compare(cluster: RealCluster, staged: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], float]:
    root: Path = staged["root"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_", "ARGO_", "KUBE"))}
    env.update(staged["env"], ARGO_TOKEN=staged["token"], KUBECONFIG=str(cluster.kubeconfig), COLUMNS="100")
    argv = [sys.executable, "-m", "llmpack", "cluster", "compare", "--backends", "argo,mlflow",
            "--repeats", str(REPEATS), "--max-steps", "2", "--baseline", "argo",
            "--argo-host", staged["argo_host"], "--namespace", NS, "--kubeconfig", str(cluster.kubeconfig),
            "--tracking-uri", staged["uri"], "--poll", "1", "--timeout", "900",
            "--output-dir", str(root / "runs"), "--report", str(root / "report" / "out")]
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=root / "home", env=env, capture_output=True, text=True, timeout=1800)
    return done, time.monotonic() - t0


def _logs(kubelet: ProcessKubelet) -> str:
    logs = kubelet.root / "logs"
    return "\n".join(f"--- {p.relative_to(logs)}\n{p.read_text()[-1500:]}" for p in sorted(logs.rglob("*.log")))


@pytest.mark.slow
def test_compare_decides_argo_vs_mlflow_on_spinup_from_the_real_controllers(compare_cluster: RealCluster,
                                                                              staged: dict[str, Any]) -> None:
    """Both paths succeed every round on the real controllers; each run's spin-up and time to first step come from
    its pods as the real controllers and the process kubelet reported them (so at least the provisioning delay),
    and the verdict on spin-up names a path or says undecided, with the rounds counted."""
    from kubernetes import client

    kubelet: ProcessKubelet = staged["kubelet"]
    done, wall_s = _compare(compare_cluster, staged)
    report = staged["root"] / "report" / "out" / "report.json"
    assert done.returncode == 0 and report.is_file(), (done.stdout[-3000:], done.stderr[-5000:], _logs(kubelet))
    table = done.stdout
    print(f"\n{table}\n(compare wall time {wall_s:.0f} s)")
    if os.environ.get("LLMPACK_COMPARE_REAL_OUT"):
        Path(os.environ["LLMPACK_COMPARE_REAL_OUT"]).write_text(f"{table}\ncompare wall time {wall_s:.0f} s\n")
        shutil.copy(report, Path(os.environ["LLMPACK_COMPARE_REAL_OUT"]).with_suffix(".json"))
    result = json.loads(report.read_text())
    runs = result["runs"]
    assert sorted(r["orchestrator"] for r in runs) == sorted(["argo", "mlflow"] * REPEATS), runs
    assert not result["failed"], result["failed"]
    assert all(r["status"] == "succeeded" for r in runs), [(r["orchestrator"], r["error"]) for r in runs]

    # every pod of every run, as the pod watcher saw it: made by the real controllers, bound by the real scheduler
    # to a process node, run there after the provisioning delay it was given (timestamps in whole seconds)
    for r in runs:
        pods = r["pods"]
        assert all(p["phase"] == "Succeeded" and p["node"] in (GPU_NODE, CPU_NODE) for p in pods), pods
        assert all(p["start_s"] >= DELAY_MS / 1000 - 1 for p in pods), [(p["pod"], p["start_s"]) for p in pods]
        assert {p["pod"] for p in pods} <= set(kubelet.delays), (sorted(kubelet.delays), pods)
        if r["orchestrator"] == "argo":  # the Workflow's five steps and its exit handler, each a pod of its own
            assert sorted(p["step"] for p in pods) == sorted(ARGO_STEPS), pods
            assert {p["orchestrator_run"] for p in pods} == {r["artifacts"]["server_id"]}, (pods, r["artifacts"])
        else:  # MLflow's one Job pod on the H100, every step in it
            (pod,) = pods
            assert pod["step"] == "main" and pod["node"] == GPU_NODE and pod["gpu_product"], pod
    assert all(DELAY_MS / 1000 <= d <= (DELAY_MS + JITTER_MS) / 1000 for d in kubelet.delays.values())
    jobs = client.BatchV1Api(compare_cluster.api).list_namespaced_job(NS).items
    assert len(jobs) == REPEATS and all(j.status.succeeded == 1 for j in jobs), jobs  # the real Job controller's

    # spin-up and time to first step from the pods: never below the first pod's provisioning delay
    for r in runs:
        m = r["metrics"]
        assert m["spinup_s"] >= DELAY_MS / 1000, (r["orchestrator"], m["spinup_s"])
        assert m["time_to_first_step_s"] >= m["spinup_s"], (r["orchestrator"], m)
        assert r["tags"]["llmpack.mode"] == "cluster"
    # argo's first step to run finetune is its third pod: its spin-up waits out three provisioning delays
    for r in (r for r in runs if r["orchestrator"] == "argo"):
        assert r["metrics"]["spinup_s"] >= 3 * DELAY_MS / 1000, r["metrics"]
    summary = result["summary"]
    for path in ("argo", "mlflow"):
        assert summary[path]["spinup_s"]["n"] == REPEATS, summary[path]
    verdict = result["verdicts"]["spinup_s"]["mlflow"]
    assert verdict["verdict"] in ("faster", "slower", "equivalent", "undecided"), verdict
    assert verdict["n"] == verdict["n_baseline"] == REPEATS, verdict
    assert "spin-up" in table and "argo" in table and "mlflow" in table, table
