"""llmpack's compiled Argo Workflow run to ``Succeeded`` by the REAL Argo v3.7.3 workflow-controller and executor.

``llmpack compile``'s ``argo_workflows/finetune.yaml`` for the tiny model, created as compiled but
for what places it on the process node (a toleration on each template, the Workflow's
``nodeSelector``) and ``max_steps`` 2. The process node (container mode: root only) is one H100 of
a p5.48xlarge, as the GPU templates' affinity asks; each pod runs ``argoexec init``/``wait`` and
the step under ``argoexec emissary``, every step's real code (prepare-data, tokenize, finetune,
evaluate, register, then the ``onExit`` task ``close-record``). Artifacts go through an
``artifactory``-type repository on loopback (``test_argo_real._Repository``); the tracking store is
a sqlite file under ``/var/tmp`` that every pod mounts nothing over. The MLflow record is compared
in shape with a local ``llmpack run --backend argo``'s: the same timeline events per step, cost tag
keys and metric names. docs/internals/real-cluster.md, "llmpack's Workflow under the real controller".
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.realcluster.apiserver import make_namespace, wait_until
from tests.realcluster.conftest import RealCluster
from tests.realcluster.process_kubelet import PROCESS_LABEL, ProcessKubelet, ProcessNode
from tests.realcluster.test_argo_real import (
    EXECUTOR_IMAGE,
    _argo_bin,
    _argo_src,
    _can_mount,
    _submit,
    _workflow,
    argo_cluster,  # noqa: F401 (the module's own control plane)
    use_repository,
)
from tests.realcluster.test_production_shape import compile_shape

pytestmark = pytest.mark.cluster

NS = "llm-argo"
LLMPACK_IMAGE = "ghcr.io/llmpack/llmpack"  # its folder is an empty one: `python` and PYTHONPATH are this checkout's
GPU_NODE, CPU_NODE = "proc-h100-0", "proc-cpu-0"  # the GPU steps' H100 (their affinity); a CPU node for the rest
STEPS = ("prepare-data", "tokenize", "finetune", "evaluate", "register")
TOLERATE = {"key": PROCESS_LABEL, "operator": "Exists", "effect": "NoSchedule"}
# Where the native run's record differs from the local client's: the tags only an llmpack client sets
# (llmpack/run/local.py, components/servers/submission.py): llmpack.fuse (readers take "none") and llmpack.pipeline,
# the pipeline's name, which no step or close-record writes: a run started by `argo submit` lacks it (found here).
CLIENT_ONLY_TAGS = {"llmpack.fuse", "llmpack.pipeline"}


def grant_executor(api: Any, ns: str) -> None:
    """The release's emissary ``executor`` Role, bound to the namespace's ``default`` ServiceAccount, and that
    account's token Secret (both as Argo's quick start makes them): the wait container writes WorkflowTaskResults
    with it. The compiled Workflow sets ``automountServiceAccountToken: false`` and ``executor.serviceAccountName``,
    so the controller mounts the executor's token from ``<account>.service-account-token`` (else the pod fails with
    ``secret "default.service-account-token" not found``)."""
    from kubernetes import client

    quick_start = _argo_src() / "manifests/quick-start/base"
    token = yaml.safe_load((quick_start / "default.service-account-token-secret.yaml").read_text())
    core = client.CoreV1Api(api)
    core.create_namespaced_secret(ns, token)
    wait_until(lambda: (core.read_namespaced_secret(token["metadata"]["name"], ns).data or {}).get("token"),
               timeout_s=30, what="the token controller fills default.service-account-token")
    role = yaml.safe_load((quick_start / "executor/emissary/executor-role.yaml").read_text())
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(ns, role)
    rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "executor-default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}]})


def on_process_node(wf: dict[str, Any], max_steps: int) -> dict[str, Any]:
    """The compiled Workflow scaled to the process node: each template tolerates its taint (a template's own
    tolerations replace the Workflow's), the Workflow selects it, ``max_steps`` set."""
    for t in wf["spec"]["templates"]:
        if "container" in t:
            t["tolerations"] = [*(t.get("tolerations") or []), TOLERATE]
    wf["spec"]["nodeSelector"] = {PROCESS_LABEL: "true"}
    for p in wf["spec"]["arguments"]["parameters"]:
        if p["name"] == "max_steps":
            p["value"] = str(max_steps)
    return wf


@pytest.fixture(scope="module")
def llm_node(argo_cluster: RealCluster,  # noqa: F811
             request: pytest.FixtureRequest) -> Iterator[tuple[ProcessKubelet, str]]:
    """Process nodes in container mode, one H100 (the GPU templates' affinity) and a CPU node, namespace llm-argo
    with the executor Role, the tracking Secret naming a sqlite store under /var/tmp: (kubelet, tracking URI)."""
    if not _can_mount():
        pytest.skip("the process kubelet's container mode needs mount namespaces (unshare --mount: root)")
    from kubernetes import client

    api = argo_cluster.api
    make_namespace(api, NS)
    grant_executor(api, NS)
    # not under /tmp: each container's /tmp is the pod's emptyDir, which would hide folders there
    root = Path(tempfile.mkdtemp(prefix="llmpack-argo-pipeline-", dir="/var/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    (root / "argoexec" / "bin").mkdir(parents=True)
    shutil.copy(_argo_bin() / "argoexec", root / "argoexec" / "bin" / "argoexec")
    for folder in ("llmpack", "home", "store"):
        (root / folder).mkdir()
    uri = f"sqlite:///{root / 'store' / 'mlflow.db'}"
    client.CoreV1Api(api).create_namespaced_secret(NS, {"metadata": {"name": "llmpack-mlflow"},
                                                        "stringData": {"tracking-uri": uri}})
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]), "LANG": "C.UTF-8",
           "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HOME": str(root / "home"),
           "LLMPACK_SIGNING_KEY_FILE": str(root / "signing.key")}  # one key for every pod, as a Secret gives
    gpu = ProcessNode(name=GPU_NODE, cpu="16", memory="128Gi", gpus=1,
                      labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "1",
                              "node.kubernetes.io/instance-type": "p5.48xlarge"},
                      taints=({"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                              {"key": PROCESS_LABEL, "value": "true", "effect": "NoSchedule"}))
    cpu = ProcessNode(name=CPU_NODE, cpu="16", memory="64Gi",
                      labels={"node.kubernetes.io/instance-type": "m6i.4xlarge"},
                      taints=({"key": PROCESS_LABEL, "value": "true", "effect": "NoSchedule"},))
    with ProcessKubelet(api, [gpu, cpu], root=root / "kubelet", containers=True, base_env=env, deadline_s=600,
                        images={EXECUTOR_IMAGE: root / "argoexec", LLMPACK_IMAGE: root / "llmpack"}) as k:
        yield k, uri
        assert not k.errors, k.errors


def record(uri: str) -> Any:
    """The pipeline's record in the store at ``uri``."""
    from mlflow.tracking import MlflowClient

    mc = MlflowClient(uri)
    runs = mc.search_runs([e.experiment_id for e in mc.search_experiments()])
    (rec,) = [r for r in runs if r.data.tags.get("llmpack.record") == "pipeline"]
    return rec


def shape(rec: Any) -> dict[str, Any]:
    """What must be alike: the timeline events of each step, the metric names, the parameter and tag names."""
    events: dict[str, set[str]] = {}
    for name in rec.data.metrics:
        if name.startswith("event."):
            step, event = name.removeprefix("event.").rsplit(".", 1)
            events.setdefault(step, set()).add(event)
    return {"events": events, "metrics": set(rec.data.metrics), "params": set(rec.data.params),
            "tags": {t for t in rec.data.tags if t.startswith("llmpack.")}}


@pytest.fixture(scope="module")
def local_argo_record(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``llmpack run --backend argo --max-steps 2`` on this machine (Argo's local executor): its record."""
    tmp = tmp_path_factory.mktemp("local-argo")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", HOME=str(tmp),
               LLMPACK_SIGNING_KEY_FILE=str(tmp / "signing.key"))
    done = subprocess.run([sys.executable, "-m", "llmpack", "run", "--backend", "argo", "--max-steps", "2",
                           "--tracking-uri", uri, "--output-dir", str(tmp / "runs")],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return record(uri)


def _run_to_end(api: Any, kubelet: ProcessKubelet, name: str, timeout_s: float) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        assert not kubelet.errors, kubelet.errors
        got = _workflow(api, NS, name)
        return got if (got.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Error") else None

    try:
        return wait_until(ended, timeout_s=timeout_s, what=f"Workflow {name} ended")
    except AssertionError:
        logs = kubelet.root / "logs" / NS
        tails = {str(p.relative_to(logs)): p.read_text()[-1500:] for p in sorted(logs.rglob("*.log"))}
        raise AssertionError(f"{name}: {_workflow(api, NS, name).get('status')}\n{tails}") from None


@pytest.mark.slow
def test_the_compiled_workflow_runs_every_step_to_succeeded_under_the_real_controller(
        argo_cluster: RealCluster, llm_node: tuple[ProcessKubelet, str], local_argo_record: Any,  # noqa: F811
        tmp_path: Path) -> None:
    """Every DAG task and the exit handler Succeeded on the process node, each artifact PUT by its step's wait
    container and GET by the next step's init container; the record closed by ``close-record`` FINISHED, in
    shape the local run's."""
    kubelet, uri = llm_node
    api = argo_cluster.api
    repo = use_repository(api, NS)
    done = compile_shape(tmp_path, "--namespace", NS)
    assert done.returncode == 0, done.stderr
    (wf,) = [d for d in yaml.safe_load_all((tmp_path / "argo_workflows" / "finetune.yaml").read_text()) if d]
    name = _submit(api, NS, on_process_node(wf, max_steps=2))
    final = _run_to_end(api, kubelet, name, timeout_s=900)

    status = final["status"]
    # by step: finetune's pod is the first attempt of its retry node, "finetune(0)"; the exit handler is "<name>.onExit"
    nodes = {re.sub(r"\(0\)$", "", n["displayName"]).replace(f"{name}.onExit", "close-record"): n
             for n in status["nodes"].values() if n["type"] == "Pod"}
    logs = kubelet.root / "logs" / NS
    assert status["phase"] == "Succeeded", (
        status.get("message"), {k: (n["phase"], n.get("message")) for k, n in nodes.items()}, kubelet.errors,
        {str(p.relative_to(logs)): p.read_text()[-1200:] for p in sorted(logs.rglob("*.log"))})
    assert {k: n["phase"] for k, n in nodes.items()} == {s: "Succeeded" for s in (*STEPS, "close-record")}, nodes
    placed = {k: n["hostNodeName"] for k, n in nodes.items()}
    assert placed["finetune"] == GPU_NODE and set(placed.values()) <= {GPU_NODE, CPU_NODE}, placed
    # every output artifact went to the repository through argoexec, and every input came back from it
    for step in STEPS:
        for art in (nodes[step].get("outputs") or {}).get("artifacts") or []:
            if "artifactory" not in art:
                continue  # the main container's log artifact is not archived (archiveLogs off)
            key = art["artifactory"]["url"].removeprefix(repo.url.rsplit("/", 1)[0])
            assert ("PUT", key, 201) in repo.requests, (step, art["name"], repo.requests)
    gets = [p for m, p, code in repo.requests if m == "GET" and code == 200]
    assert len(gets) == 6 and len(set(gets)) == 4, repo.requests  # tokenize 1, finetune 1, evaluate 2, register 2

    rec = record(uri)
    assert rec.info.status == "FINISHED" and rec.data.tags["llmpack.status"] == "succeeded", rec.data.tags
    assert rec.data.tags["llmpack.orchestrator"] == "argo" and rec.data.tags["llmpack.mode"] == "cluster"
    assert rec.data.params["pipeline_run"] == name  # the Workflow's name: no client chose one
    mine, theirs = shape(rec), shape(local_argo_record)
    assert mine["events"] == theirs["events"] and set(mine["events"]) == set(STEPS), (mine["events"], theirs["events"])
    assert mine["metrics"] == theirs["metrics"], (sorted(mine["metrics"] ^ theirs["metrics"]))
    assert mine["params"] == theirs["params"]
    assert theirs["tags"] - mine["tags"] == CLIENT_ONLY_TAGS and mine["tags"] <= theirs["tags"], (
        sorted(mine["tags"] ^ theirs["tags"]))
