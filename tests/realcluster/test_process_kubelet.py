"""Pods that run code: the process kubelet (``process_kubelet.py``) under the real control plane.

A node of its own, shaped as one H100 of a p5.48xlarge and tainted ``llmpack.io/process-node`` so
that only pods tolerating that land on it. The real scheduler binds pods to it, the process kubelet
runs their commands here and reports their status; the real Job controller acts on that status.

The MLflow path end to end: ``mlflow run finetune-k8s --backend kubernetes`` by MLflow's own code
(its docker build and push stubbed), the Job and its pod made for real, ``python main.py`` run in the
project's folder into a sqlite store. Its record is compared with a local ``llmpack run --backend
mlflow``'s; what MLflow's launcher and the absent llmpack client make differ
(``MLFLOW_BACKEND_PARAMS``, ``MLFLOW_BACKEND_TAGS``, ``CLIENT_ONLY_TAGS``) is asserted as it is, so
that a change flips it. In full: docs/internals/real-cluster.md, "Which tests use it" and "Pods that run code".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, SESSION_SIGNING_KEY_FILE
from tests.realcluster.apiserver import make_namespace, wait_until
from tests.realcluster.conftest import RealCluster
from tests.realcluster.process_kubelet import PROCESS_LABEL, ProcessKubelet, ProcessNode
from tests.realcluster.test_production_shape import compile_shape

pytestmark = pytest.mark.cluster

NS = "llmpack-proc"
NODE = "proc-h100-0"
TOOL_IMAGE = "registry.example.com/llmpack/tools"  # a plain image: its folder is an empty one
ON_PROCESS_NODE = {"tolerations": [{"key": PROCESS_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
                   "nodeSelector": {PROCESS_LABEL: "true"}}
RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
              "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}


# Where the record of `mlflow run --backend kubernetes` differs from a local `llmpack run --backend mlflow`'s:
# MLflow's launcher made this record (the run in the llmpack experiment), so it logged every parameter of
# the entry point (artifacts_dir too, which the llmpack client passes but leaves off its record) and its
# own system tags; the llmpack client's tag llmpack.fuse is absent (no client ran: readers take "none").
MLFLOW_BACKEND_PARAMS = {"artifacts_dir"}
MLFLOW_BACKEND_TAGS = {"mlflow.docker.image.id", "mlflow.docker.image.uri", "mlflow.project.entryPoint",
                       "mlflow.project.env", "mlflow.project.backend", "mlflow.source.name", "mlflow.source.type",
                       "mlflow.source.git.commit", "mlflow.source.git.repoURL", "mlflow.gitRepoURL", "mlflow.user"}
CLIENT_ONLY_TAGS = {"llmpack.fuse"}


def base_env() -> dict[str, str]:
    """What the image would have installed: this interpreter, this checkout, no network for the hub."""
    return {"LLMPACK_SIGNING_KEY_FILE": str(SESSION_SIGNING_KEY_FILE),  # one key for every pod, as a Secret gives
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]), "PYTHONPATH": str(REPO),
            "HF_HUB_OFFLINE": "1", "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def kubelet(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessKubelet]:
    """The process node, registered Ready, in namespace llmpack-proc (Pod Security ``restricted``)."""
    root = tmp_path_factory.mktemp("process-kubelet")
    (root / "tools").mkdir()
    node = ProcessNode(name=NODE, cpu="16", memory="128Gi", gpus=1,
                       labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "1",
                               "node.kubernetes.io/instance-type": "p5.48xlarge"},
                       taints=({"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                               {"key": PROCESS_LABEL, "value": "true", "effect": "NoSchedule"}))
    make_namespace(real_cluster.api, NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    with ProcessKubelet(real_cluster.api, [node], root=root / "kubelet", images={TOOL_IMAGE: root / "tools"},
                        base_env=base_env(), deadline_s=600) as k:
        yield k
        assert not k.errors, k.errors


def _pod(name: str, code: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": f"{TOOL_IMAGE}:1", "command": ["python", "-c", code],
                 "securityContext": RESTRICTED, **spec.pop("container", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [container], **ON_PROCESS_NODE, **spec,
                     "tolerations": [*ON_PROCESS_NODE["tolerations"], {"key": "nvidia.com/gpu", "operator": "Exists"}]}}


def _finished(real_cluster: RealCluster, kubelet: ProcessKubelet, name: str) -> Any:
    from kubernetes import client

    core = client.CoreV1Api(real_cluster.api)

    def done() -> Any:
        pod = core.read_namespaced_pod(name, NS)
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    try:
        return wait_until(done, timeout_s=90, what=f"pod {name} finished")
    except AssertionError as err:
        raise AssertionError(f"{err}: {core.read_namespaced_pod(name, NS).status}; kubelet: {kubelet.errors}") from None


def test_the_node_is_ready_and_a_pod_runs_with_its_env_and_volumes(real_cluster: RealCluster,
                                                                   kubelet: ProcessKubelet) -> None:
    """Secret and fieldRef env, an emptyDir and a claim mapped to folders, its paths rewritten; Succeeded, exit 0."""
    from kubernetes import client

    core = client.CoreV1Api(real_cluster.api)
    ready = [c for c in core.read_node(NODE).status.conditions if c.type == "Ready"]
    assert ready and ready[0].status == "True"
    core.create_namespaced_secret(NS, {"metadata": {"name": "greeting"}, "stringData": {"word": "hello"}})
    code = ("import os, pathlib; pathlib.Path(os.environ['OUT'], 'said').write_text("
            "os.environ['WORD'] + ' ' + os.environ['POD'] + ' ' + os.environ['NODE'])")
    env = [{"name": "WORD", "valueFrom": {"secretKeyRef": {"name": "greeting", "key": "word"}}},
           {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           {"name": "OUT", "value": "/data"}]
    core.create_namespaced_pod(NS, _pod("says-hello", code, container={
        "env": env, "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        volumes=[{"name": "data", "emptyDir": {}}]))
    pod = _finished(real_cluster, kubelet, "says-hello")
    assert pod.spec.node_name == NODE and pod.status.phase == "Succeeded", pod.status
    (state,) = pod.status.container_statuses
    assert state.state.terminated.exit_code == 0 and state.state.terminated.reason == "Completed"
    assert state.state.terminated.finished_at >= state.state.terminated.started_at
    said = kubelet.root / "pods" / pod.metadata.uid / "data" / "said"
    assert said.read_text() == f"hello says-hello {NODE}"


def test_an_exit_code_and_a_pod_it_cannot_run_are_reported_failed(real_cluster: RealCluster,
                                                                  kubelet: ProcessKubelet) -> None:
    from kubernetes import client

    core = client.CoreV1Api(real_cluster.api)
    core.create_namespaced_pod(NS, _pod("exits-3", "raise SystemExit(3)"))
    core.create_namespaced_pod(NS, _pod("no-image", "pass", container={"image": "example.com/unknown:1"}))
    pod = _finished(real_cluster, kubelet, "exits-3")
    assert pod.status.phase == "Failed" and pod.status.container_statuses[0].state.terminated.exit_code == 3
    pod = _finished(real_cluster, kubelet, "no-image")
    assert pod.status.phase == "Failed" and pod.status.reason == "ErrImagePull", pod.status
    assert "example.com/unknown" in pod.status.message


def test_a_deleted_pod_has_its_process_ended_and_is_removed(real_cluster: RealCluster, kubelet: ProcessKubelet) -> None:
    """Deleting a Running pod: SIGTERM to its process group (as the grace period allows), then the pod is gone."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(real_cluster.api)
    core.create_namespaced_pod(NS, _pod("sleeps", "import time; time.sleep(300)", termination_grace_period_seconds=5))

    def running() -> Any:
        pod = core.read_namespaced_pod("sleeps", NS)
        return pod if pod.status.phase == "Running" else None

    pod = wait_until(running, timeout_s=90, what="pod sleeps Running")
    (state,) = pod.status.container_statuses
    assert state.state.running.started_at and state.ready
    pid = int(state.container_id.removeprefix("process://"))
    os.kill(pid, 0)  # alive: the process the status names
    core.delete_namespaced_pod("sleeps", NS)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("sleeps", NS)
        except ApiException as err:
            return err.status == 404
        return False

    wait_until(gone, timeout_s=60, what="pod sleeps deleted")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# --------------------------------------------------------------------------- the MLflow path


def _record(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    mc = MlflowClient(uri)
    runs = mc.search_runs([e.experiment_id for e in mc.search_experiments()])
    (rec,) = [r for r in runs if r.data.tags.get("llmpack.record") == "pipeline"]
    steps = sorted(r.data.tags.get("llmpack.step", "") for r in runs
                   if r.data.tags.get("mlflow.parentRunId") == rec.info.run_id)
    return rec, steps


def _shape(rec: Any) -> dict[str, set[str]]:
    return {"params": set(rec.data.params), "metrics": set(rec.data.metrics), "tags": set(rec.data.tags)}


@pytest.fixture(scope="module")
def local_record(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[str]]:
    """``llmpack run --backend mlflow --max-steps 2`` on this machine: its record and its child runs' steps."""
    tmp = tmp_path_factory.mktemp("local-mlflow")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    env.update(base_env(), HOME=str(tmp))
    done = subprocess.run([sys.executable, "-m", "llmpack", "run", "--backend", "mlflow", "--max-steps", "2",
                           "--tracking-uri", uri, "--output-dir", str(tmp / "runs")],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return _record(uri)


@pytest.fixture(scope="module")
def mlflow_project(real_cluster: RealCluster, kubelet: ProcessKubelet,
                   tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The compile for namespace llmpack-proc (its Job template placed on the process node), the tracking
    Secret, the artifacts claim bound: (compile folder, finetune-k8s project, tracking URI)."""
    from kubernetes import client

    tmp = tmp_path_factory.mktemp("mlflow-k8s")
    out = tmp / "compiled"
    done = compile_shape(out, "--namespace", NS)
    assert done.returncode == 0, done.stderr
    project = out / "mlflow_projects" / "finetune-k8s"
    template_file = project / "kubernetes_job_template.yaml"
    template = yaml.safe_load(template_file.read_text())
    pod_spec = template["spec"]["template"]["spec"]
    pod_spec["tolerations"] += ON_PROCESS_NODE["tolerations"]
    pod_spec["nodeSelector"] = ON_PROCESS_NODE["nodeSelector"]
    template_file.write_text(yaml.safe_dump(template))
    config = json.loads((project / "kubernetes_config.json").read_text())
    kubelet.images[config["repository-uri"]] = project  # the image MLflow builds: the project in its working dir
    core = client.CoreV1Api(real_cluster.api)
    store = tmp / "store"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    core.create_namespaced_secret(NS, {"metadata": {"name": "llmpack-mlflow"}, "stringData": {"tracking-uri": uri}})
    core.create_persistent_volume({"metadata": {"name": "proc-artifacts"},
                                   "spec": {"capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteOnce"],
                                            "storageClassName": "", "nfs": {"server": "127.0.0.1", "path": "/a"}}})
    core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": "llmpack-artifacts"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": "", "resources": {"requests": {"storage": "1Gi"}}}})
    return out, project, uri


@pytest.mark.slow
def test_the_mlflow_job_runs_its_steps_in_a_pod_of_the_real_job_controller(
        real_cluster: RealCluster, kubelet: ProcessKubelet, mlflow_project: tuple[Path, Path, str],
        monkeypatch: pytest.MonkeyPatch, local_record: tuple[Any, list[str]]) -> None:
    import kubernetes.client
    import kubernetes.config.kube_config
    import mlflow
    import mlflow.projects.docker as mlflow_docker
    import mlflow.projects.kubernetes as mlflow_k8s
    from kubernetes import client

    out, project, uri = mlflow_project
    core = client.CoreV1Api(real_cluster.api)

    class Image:
        tags: list[str] = []

    def build(**kwargs: Any) -> Image:
        Image.tags = [f"{kwargs['repository_uri']}:5f1e2d3"]
        return Image()

    monkeypatch.setattr(mlflow_docker, "validate_docker_installation", lambda: None)
    monkeypatch.setattr(mlflow_docker, "build_docker_image", build)
    monkeypatch.setattr(mlflow_k8s, "push_image_to_registry", lambda tag: "sha256:" + "a" * 64)
    monkeypatch.setattr(mlflow_k8s.KubernetesSubmittedRun, "POLL_STATUS_INTERVAL", 1)
    monkeypatch.setattr(kubernetes.client.Configuration, "_default", kubernetes.client.Configuration._default)
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(real_cluster.kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(real_cluster.kubeconfig))
    monkeypatch.setenv("KUBE_MLFLOW_TRACKING_URI", uri)
    # As a user types it where `llmpack compile` ran (the repository): the config's template path is relative to there
    monkeypatch.chdir(REPO)
    mlflow.set_tracking_uri(uri)
    try:
        submitted = mlflow.projects.run(str(project), entry_point="main", backend="kubernetes",
                                        backend_config=str(project / "kubernetes_config.json"),
                                        parameters={"max_steps": "2"}, experiment_name="llmpack", synchronous=False)
        finished = submitted.wait()
    finally:
        mlflow.set_tracking_uri(None)

    batch = client.BatchV1Api(real_cluster.api)
    (job,) = [j for j in batch.list_namespaced_job(NS).items if j.metadata.name.startswith("llm-finetune-")]
    (pod,) = core.list_namespaced_pod(NS, label_selector=f"job-name={job.metadata.name}").items
    logs = "\n".join(p.read_text()[-3000:] for p in (kubelet.root / "logs" / NS / pod.metadata.name).glob("*.log"))
    assert finished, logs
    assert [c.type for c in job.status.conditions if c.status == "True"][-1] == "Complete"
    assert pod.spec.node_name == NODE and pod.status.phase == "Succeeded"
    assert pod.metadata.owner_references[0].kind == "Job"  # made by the real Job controller
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"

    rec, steps = _record(uri)
    local, local_steps = local_record
    assert rec.info.run_id == submitted.run_id and rec.info.status == "FINISHED"
    assert rec.data.tags["llmpack.mode"] == "cluster" and rec.data.tags["mlflow.project.backend"] == "kubernetes"
    assert steps == local_steps and "finetune" in steps
    mine, theirs = _shape(rec), _shape(local)
    assert mine["metrics"] == theirs["metrics"]
    assert mine["params"] - theirs["params"] == MLFLOW_BACKEND_PARAMS and theirs["params"] <= mine["params"]
    differ = {k for k in mine["tags"] ^ theirs["tags"] if k.startswith("llmpack.")}
    assert differ == CLIENT_ONLY_TAGS, (sorted(mine["tags"] - theirs["tags"]), sorted(theirs["tags"] - mine["tags"]))
    assert CLIENT_ONLY_TAGS <= theirs["tags"]  # the local record has it; the Job's, closed by main alone, not
    assert mine["tags"] - theirs["tags"] <= MLFLOW_BACKEND_TAGS


def test_the_real_main_exiting_2_on_bad_input_fails_the_job_by_its_pod_failure_policy(
        real_cluster: RealCluster, kubelet: ProcessKubelet, mlflow_project: tuple[Path, Path, str]) -> None:
    """``main.py`` refuses ``max_steps=two`` with exit code 2 in the pod; the compiled ``FailJob`` rule ends the Job
    at once."""
    from kubernetes import client
    from mlflow.projects.kubernetes import _get_kubernetes_job_definition

    _out, project, uri = mlflow_project
    config = json.loads((project / "kubernetes_config.json").read_text())
    template = yaml.safe_load((project / "kubernetes_job_template.yaml").read_text())
    job = _get_kubernetes_job_definition(
        project_name="llm-finetune", image_tag=f"{config['repository-uri']}:5f1e2d3", image_digest="sha256:" + "b" * 64,
        command=["python", "main.py", "--artifacts-dir=/mnt/llmpack/artifacts", "--param=max_steps=two"],
        env_vars={"MLFLOW_TRACKING_URI": uri}, job_template=template)
    job["metadata"]["name"] = "main-bad-input"
    batch = client.BatchV1Api(real_cluster.api)
    batch.create_namespaced_job(NS, job)

    def failed() -> Any:
        conditions = batch.read_namespaced_job_status("main-bad-input", NS).status.conditions or []
        return next((c for c in conditions if c.type == "Failed" and c.status == "True"), None)

    condition = wait_until(failed, timeout_s=120, what="Job main-bad-input Failed")
    assert condition.reason == "PodFailurePolicy" and "exit code 2" in condition.message, condition
    (pod,) = client.CoreV1Api(real_cluster.api).list_namespaced_pod(NS, label_selector="job-name=main-bad-input").items
    assert pod.spec.node_name == NODE and pod.status.container_statuses[0].state.terminated.exit_code == 2
    (log,) = (kubelet.root / "logs" / NS / pod.metadata.name).glob("*.log")
    assert "llmpack: error:" in log.read_text() and "max_steps" in log.read_text()
