"""Workflows run by the REAL Argo v3.7.3 workflow-controller, and their pods by the real executor (argoexec).

A control plane of this module's own (``LLMPACK_CLUSTER_CONTROLLERS=argo``): Argo's
workflow-controller built from ``tools/cluster/argo/go.mod``'s pins, as its cluster install runs it.

- A submitted Workflow is picked up: the controller makes Argo's pod (``init`` and ``wait`` of the
  executor image ``quay.io/argoproj/argoexec:v3.7.3``, ``main`` under ``argoexec emissary``), kwok
  runs it, the Workflow goes ``Running``.
- On a process node in container mode (``containers.py``; root only) the pods run for real with
  argoexec built from the same module: ``init`` writes the template and copies argoexec into
  ``/var/run/argo``, ``main`` runs the step under emissary, ``wait`` writes the step's
  ``WorkflowTaskResult`` with the pod's token (the release's ``executor`` Role). One step reaches
  ``Succeeded``; two steps pass an output parameter, then an artifact through a loopback repository
  of Argo's ``artifactory`` type (HTTP PUT/GET). docs/internals/real-cluster.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realcluster.apiserver import make_namespace, wait_until
from tests.realcluster.conftest import TOOLS, RealCluster, _go, started_cluster
from tests.realcluster.process_kubelet import PROCESS_LABEL, ProcessKubelet, ProcessNode

pytestmark = pytest.mark.cluster

NS_KWOK = "argo-kwok"
NS_PROC = "argo-proc"
EXECUTOR_IMAGE = "quay.io/argoproj/argoexec"
STEP_IMAGE = "docker.io/library/python"  # its folder is an empty one; `python` is this interpreter
ON_PROCESS_NODE = {"tolerations": [{"key": PROCESS_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
                   "nodeSelector": {PROCESS_LABEL: "true"}}


def _argo_bin() -> Path:
    env = {**os.environ, "GO": _go() or "go"}
    mode = [] if os.environ.get("LLMPACK_CLUSTER_BUILD") == "1" else ["--cached"]
    built = subprocess.run([str(TOOLS / "build.sh"), "--argo", *mode], capture_output=True, text=True, env=env,
                           timeout=7200)
    if built.returncode != 0:
        pytest.skip(f"build.sh --argo: {built.stderr.strip().splitlines()[-1]}")
    return Path(built.stdout.strip())


@pytest.fixture(scope="module")
def argo_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A control plane with Argo's workflow-controller running (skips where it is not built)."""
    _argo_bin()
    with started_cluster(tmp_path_factory.mktemp("argocluster") / "state",
                         settings={"LLMPACK_CLUSTER_CONTROLLERS": "argo"}) as cluster:
        yield cluster


def _custom(api: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api)


def _submit(api: Any, ns: str, wf: dict[str, Any]) -> str:
    made = _custom(api).create_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflows", wf)
    return made["metadata"]["name"]


def _workflow(api: Any, ns: str, name: str) -> dict[str, Any]:
    return _custom(api).get_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflows", name)


def _phase(api: Any, ns: str, name: str) -> str:
    return (_workflow(api, ns, name).get("status") or {}).get("phase") or ""


def test_the_controller_picks_up_a_workflow_and_makes_its_pod(argo_cluster: RealCluster) -> None:
    """A one-step Workflow: the real controller makes the pod Argo makes (init, wait, main under emissary) and the
    Workflow goes Running while kwok runs the pod."""
    from kubernetes import client

    api = argo_cluster.api
    make_namespace(api, NS_KWOK)
    name = _submit(api, NS_KWOK, {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"generateName": "hello-"},
        "spec": {"entrypoint": "main", "templates": [
            {"name": "main", "container": {"image": f"{STEP_IMAGE}:3.12", "command": ["python", "-c", "print(1)"]}}]}})
    core = client.CoreV1Api(api)
    pods = wait_until(lambda: core.list_namespaced_pod(
                          NS_KWOK, label_selector=f"workflows.argoproj.io/workflow={name}").items,
                      timeout_s=60, what=f"the controller's pod of Workflow {name}")
    (pod,) = pods
    assert pod.metadata.owner_references[0].kind == "Workflow", pod.metadata.owner_references
    assert [c.name for c in pod.spec.init_containers] == ["init"], pod.spec.init_containers
    assert [c.name for c in pod.spec.containers] == ["wait", "main"], pod.spec.containers
    assert pod.spec.init_containers[0].image == f"{EXECUTOR_IMAGE}:v3.7.3"
    assert pod.spec.init_containers[0].command[:2] == ["argoexec", "init"]
    assert pod.spec.containers[0].command[:2] == ["argoexec", "wait"]
    main = pod.spec.containers[1].command
    assert main[:2] == ["/var/run/argo/argoexec", "emissary"] and main[-4:] == ["--", "python", "-c", "print(1)"], main
    wait_until(lambda: _phase(api, NS_KWOK, name) == "Running", timeout_s=60, what=f"Workflow {name} Running")
    node = core.read_node(wait_until(lambda: core.read_namespaced_pod(pod.metadata.name, NS_KWOK).spec.node_name,
                                     timeout_s=60, what="the pod bound"))
    assert node.metadata.annotations.get("kwok.x-k8s.io/node") == "fake", node.metadata.annotations


def test_the_compiled_workflow_passes_the_controller_and_its_first_step_is_made(argo_cluster: RealCluster,
                                                                                 tmp_path: Path) -> None:
    """``llmpack compile``'s Argo Workflow, created as compiled: the real controller accepts it (Running) and makes
    the first DAG task's pod, the step's command under emissary, the executor's own token volume (the Workflow
    sets ``automountServiceAccountToken: false`` and ``executor.serviceAccountName``). Under kwok its pods stay
    Running (kwok completes only a Job's pods): running the steps is the process node's (below)."""
    from kubernetes import client

    from tests.realcluster.test_production_shape import compile_shape

    api = argo_cluster.api
    if NS_KWOK not in {n.metadata.name for n in client.CoreV1Api(api).list_namespace().items}:
        make_namespace(api, NS_KWOK)
    done = compile_shape(tmp_path, "--namespace", NS_KWOK)
    assert done.returncode == 0, done.stderr
    (wf,) = [d for d in yaml.safe_load_all((tmp_path / "argo_workflows" / "finetune.yaml").read_text()) if d]
    assert wf["spec"]["automountServiceAccountToken"] is False, wf["spec"]
    name = _submit(api, NS_KWOK, wf)
    wait_until(lambda: _phase(api, NS_KWOK, name) == "Running", timeout_s=60, what=f"compiled Workflow {name} Running")
    core = client.CoreV1Api(api)
    (pod,) = wait_until(lambda: core.list_namespaced_pod(
                            NS_KWOK, label_selector=f"workflows.argoproj.io/workflow={name}").items,
                        timeout_s=60, what="the first step's pod")
    assert pod.metadata.annotations["workflows.argoproj.io/node-name"] == f"{name}.prepare-data", pod.metadata
    main = next(c for c in pod.spec.containers if c.name == "main")
    assert main.command[:2] == ["/var/run/argo/argoexec", "emissary"], main.command
    assert main.image == wf["spec"]["templates"][1]["container"]["image"], main.image
    assert pod.spec.automount_service_account_token is False
    assert "exec-sa-token" in {v.name for v in pod.spec.volumes}, [v.name for v in pod.spec.volumes]


# --------------------------------------------------------------------------- pods run by the real executor


def _can_mount() -> bool:
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    return done.returncode == 0


def _argo_src() -> Path:
    """argo-workflows' module source (its manifests), as tools/cluster/argo/go.mod pins it."""
    go = _go() or "go"
    done = subprocess.run([go, "list", "-m", "-f", "{{.Dir}}", "github.com/argoproj/argo-workflows/v3"],
                          cwd=TOOLS / "argo", capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GOFLAGS": "-mod=readonly", "GOPROXY": "off"})
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


@pytest.fixture(scope="module")
def executor_kubelet(argo_cluster: RealCluster, request: pytest.FixtureRequest) -> Iterator[ProcessKubelet]:
    """A process node in container mode, namespace argo-proc whose default ServiceAccount has the release's
    emissary ``executor`` Role (what Argo's quick start binds), and the executor image's folder holding argoexec."""
    if not _can_mount():
        pytest.skip("the process kubelet's container mode needs mount namespaces (unshare --mount: root)")
    from kubernetes import client

    api = argo_cluster.api
    make_namespace(api, NS_PROC)
    role = yaml.safe_load((_argo_src() / "manifests/quick-start/base/executor/emissary/executor-role.yaml").read_text())
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(NS_PROC, role)
    rbac.create_namespaced_role_binding(NS_PROC, {
        "metadata": {"name": "executor-default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": NS_PROC}]})
    # not under /tmp: each container gets a /tmp of its own, which would hide the image folders there
    root = Path(tempfile.mkdtemp(prefix="llmpack-argo-kubelet-", dir="/var/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    (root / "argoexec" / "bin").mkdir(parents=True)
    shutil.copy(_argo_bin() / "argoexec", root / "argoexec" / "bin" / "argoexec")
    (root / "python").mkdir()
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]), "LANG": "C.UTF-8"}
    node = ProcessNode(name="proc-argo-0", cpu="8", memory="32Gi",
                       taints=({"key": PROCESS_LABEL, "value": "true", "effect": "NoSchedule"},))
    with ProcessKubelet(api, [node], root=root / "kubelet", containers=True, base_env=env, deadline_s=120,
                        images={EXECUTOR_IMAGE: root / "argoexec", STEP_IMAGE: root / "python"}) as k:
        yield k
        assert not k.errors, k.errors


def _run(api: Any, wf: dict[str, Any], kubelet: ProcessKubelet) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Submit ``wf`` to argo-proc on the process node and wait for it to end: the final Workflow, and the last
    version of each WorkflowTaskResult seen while it ran (the controller deletes them once it is done)."""
    wf = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", **wf}
    wf["spec"] = {**ON_PROCESS_NODE, **wf["spec"]}
    name = _submit(api, NS_PROC, wf)
    results: dict[str, dict[str, Any]] = {}

    def ended() -> dict[str, Any] | None:
        assert not kubelet.errors, kubelet.errors
        for r in _custom(api).list_namespaced_custom_object(
                "argoproj.io", "v1alpha1", NS_PROC, "workflowtaskresults",
                label_selector=f"workflows.argoproj.io/workflow={name}")["items"]:
            results[r["metadata"]["name"]] = r
        got = _workflow(api, NS_PROC, name)
        return got if (got.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Error") else None

    try:
        return wait_until(ended, timeout_s=150, what=f"Workflow {name} ended"), results
    except AssertionError:
        logs = kubelet.root / "logs" / NS_PROC
        tails = {str(p.relative_to(logs)): p.read_text()[-1500:] for p in sorted(logs.rglob("*.log"))}
        raise AssertionError(f"{name}: {_workflow(api, NS_PROC, name).get('status')}\n{tails}") from None


def test_a_one_step_workflow_succeeds_under_the_real_executor(argo_cluster: RealCluster,
                                                              executor_kubelet: ProcessKubelet) -> None:
    """init, wait and main (emissary) run as processes; the wait container's WorkflowTaskResult says the step
    ended; the controller marks the Workflow Succeeded."""
    api = argo_cluster.api
    final = _run(api, {"metadata": {"generateName": "echo-"}, "spec": {"entrypoint": "main", "templates": [
        {"name": "main", "container": {"image": f"{STEP_IMAGE}:3.12",
                                       "command": ["python", "-c", "print('hello from a real step')"]}}]}},
                 executor_kubelet)
    final, results = final
    name = final["metadata"]["name"]
    assert final["status"]["phase"] == "Succeeded", final["status"]
    (node,) = final["status"]["nodes"].values()
    assert (node["type"], node["phase"]) == ("Pod", "Succeeded"), node
    # the wait container's WorkflowTaskResult, named after the node, its outputs reported complete, synced by the
    # controller (which deletes the results once the Workflow is done)
    (result,) = results.values()
    assert result["metadata"]["name"] == node["id"], result["metadata"]
    assert result["metadata"]["labels"]["workflows.argoproj.io/report-outputs-completed"] == "true", result
    assert node["taskResultSynced"] is True and node["outputs"] == {"exitCode": "0"}, node
    assert "hello from a real step" in (executor_kubelet.root / "logs" / NS_PROC / name / "main.log").read_text()


def test_two_steps_pass_an_output_parameter(argo_cluster: RealCluster, executor_kubelet: ProcessKubelet) -> None:
    """Step ``make`` writes /tmp/greeting (its own /tmp) as output parameter ``greeting``; emissary saves it, the
    wait container reports it in the step's WorkflowTaskResult, the controller passes it to step ``use`` as an
    input parameter, which prints it."""
    api = argo_cluster.api
    code = "open('/tmp/greeting', 'w').write('made by step one')"
    final = _run(api, {"metadata": {"generateName": "pass-"}, "spec": {"entrypoint": "main", "templates": [
        {"name": "main", "steps": [
            [{"name": "make", "template": "make"}],
            [{"name": "use", "template": "use", "arguments": {"parameters": [
                {"name": "greeting", "value": "{{steps.make.outputs.parameters.greeting}}"}]}}]]},
        {"name": "make", "container": {"image": f"{STEP_IMAGE}:3.12", "command": ["python", "-c", code]},
         "outputs": {"parameters": [{"name": "greeting", "valueFrom": {"path": "/tmp/greeting"}}]}},
        {"name": "use", "inputs": {"parameters": [{"name": "greeting"}]},
         "container": {"image": f"{STEP_IMAGE}:3.12",
                       "command": ["python", "-c", "import sys; print('got:', sys.argv[1])",
                                   "{{inputs.parameters.greeting}}"]}}]}}, executor_kubelet)
    final, results = final
    name = final["metadata"]["name"]
    assert final["status"]["phase"] == "Succeeded", final["status"]
    nodes = {n["displayName"]: n for n in final["status"]["nodes"].values()}
    assert nodes["make"]["outputs"]["parameters"] == [
        {"name": "greeting", "value": "made by step one", "valueFrom": {"path": "/tmp/greeting"}}], nodes["make"]
    assert nodes["use"]["inputs"]["parameters"] == [{"name": "greeting", "value": "made by step one"}], nodes["use"]
    assert results[nodes["make"]["id"]]["outputs"]["parameters"] == [
        {"name": "greeting", "value": "made by step one", "valueFrom": {"path": "/tmp/greeting"}}], results
    use_pod = next(p for p in (executor_kubelet.root / "logs" / NS_PROC).iterdir()
                   if p.name.startswith(name) and "use" in p.name)
    assert "got: made by step one" in (use_pod / "main.log").read_text()


class _Repository:
    """An artifact repository of Argo's ``artifactory`` type on 127.0.0.1: HTTP PUT stores, GET returns, under basic
    auth (the simplest repository Argo's executor writes to; S3 would need a MinIO)."""

    def __init__(self, user: str, password: str) -> None:
        import base64
        import http.server
        import threading

        self.stored: dict[str, bytes] = {}
        self.requests: list[tuple[str, str, int]] = []
        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        repo = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, code: int, body: bytes = b"") -> None:
                repo.requests.append((self.command, self.path, code))
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:  # noqa: N802
                if self.headers.get("Authorization") != expected:
                    return self._answer(401)
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    data = self.rfile.read(length)
                else:  # chunked
                    data = b""
                    while (size := int(self.rfile.readline().strip() or b"0", 16)) > 0:
                        data += self.rfile.read(size)
                        self.rfile.readline()
                    self.rfile.readline()
                repo.stored[self.path] = data
                return self._answer(201)

            def do_GET(self) -> None:  # noqa: N802
                if self.headers.get("Authorization") != expected:
                    return self._answer(401)
                if self.path not in repo.stored:
                    return self._answer(404)
                return self._answer(200, repo.stored[self.path])

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/artifacts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def use_repository(api: Any, ns: str) -> _Repository:
    """A loopback ``artifactory`` repository as the namespace's default artifact repository (its credentials from a
    Secret)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    repo = _Repository("argo", "s3cr3t-for-the-test")
    core.create_namespaced_secret(ns, {"metadata": {"name": "artifact-cred"},
                                       "stringData": {"user": "argo", "password": "s3cr3t-for-the-test"}})
    core.create_namespaced_config_map(ns, {
        "metadata": {"name": "artifact-repositories",
                     "annotations": {"workflows.argoproj.io/default-artifact-repository": "default"}},
        "data": {"default": yaml.safe_dump({"artifactory": {
            "repoURL": repo.url, "usernameSecret": {"name": "artifact-cred", "key": "user"},
            "passwordSecret": {"name": "artifact-cred", "key": "password"}}})}})
    return repo


def test_two_steps_pass_an_artifact_through_the_repository(argo_cluster: RealCluster,
                                                           executor_kubelet: ProcessKubelet) -> None:
    """Step ``make`` writes /tmp/out/greeting.txt as output artifact ``greeting``: emissary archives it, the wait
    container PUTs it to the namespace's artifact repository (``artifactory`` type, its credentials from a Secret);
    step ``use``'s init container GETs it into the input-artifacts volume, mounted at /tmp/in/greeting.txt in main."""

    api = argo_cluster.api
    repo = use_repository(api, NS_PROC)
    code = "import os; os.makedirs('/tmp/out'); open('/tmp/out/greeting.txt', 'w').write('an artifact from step one')"
    final, _ = _run(api, {"metadata": {"generateName": "art-"}, "spec": {"entrypoint": "main", "templates": [
        {"name": "main", "steps": [
            [{"name": "make", "template": "make"}],
            [{"name": "use", "template": "use", "arguments": {"artifacts": [
                {"name": "greeting", "from": "{{steps.make.outputs.artifacts.greeting}}"}]}}]]},
        {"name": "make", "container": {"image": f"{STEP_IMAGE}:3.12", "command": ["python", "-c", code]},
         "outputs": {"artifacts": [{"name": "greeting", "path": "/tmp/out/greeting.txt"}]}},
        {"name": "use", "inputs": {"artifacts": [{"name": "greeting", "path": "/tmp/in/greeting.txt"}]},
         "container": {"image": f"{STEP_IMAGE}:3.12",
                       "command": ["python", "-c", "print('got:', open('/tmp/in/greeting.txt').read())"]}}]}},
                     executor_kubelet)
    name = final["metadata"]["name"]
    assert final["status"]["phase"] == "Succeeded", (final["status"], repo.requests)
    nodes = {n["displayName"]: n for n in final["status"]["nodes"].values()}
    (saved,) = [a for a in nodes["make"]["outputs"]["artifacts"] if a["name"] == "greeting"]
    key = saved["artifactory"]["url"].removeprefix(repo.url.rsplit("/", 1)[0])
    assert [(m, p) for m, p, code in repo.requests if code in (200, 201) and p == key] == [("PUT", key), ("GET", key)]
    use_pod = next(p for p in (executor_kubelet.root / "logs" / NS_PROC).iterdir()
                   if p.name.startswith(name) and "use" in p.name)
    assert "got: an artifact from step one" in (use_pod / "main.log").read_text()
