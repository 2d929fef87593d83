"""The MLflow path's gang launcher creates its TrainJob as the service account ``llmpack compile --nodes``
writes RBAC for.

``compile --nodes 2 --gpus 4`` (the committed examples/multinode, kept fresh by test_golden.py) writes
``trainjob/launcher-rbac.yaml`` (ServiceAccount, Role, RoleBinding) and an MLflow Job that runs as
that ServiceAccount with its token mounted; a one-node Job mounts no token. The test then plays
the pod: the kubelet's service-account files (token, CA, namespace) in a directory, the in-cluster
variables, no kubeconfig; the Kubernetes API is the https stand-in, which accepts only that
token and answers 403 to every verb and resource the compiled Role does not grant. The finetune
entry point's command, as MLflow makes it from the compiled ``finetune-k8s`` project, runs the
launcher, which creates the TrainJob in the Job's namespace and follows it to ``Complete``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from standins.k8s_api import KubeAPIStandIn

from components.trainjob import gang
from components.trainjob import launch as trainjob_launch
from llmpack.compile.artifacts import RBAC_FILE
from tests.backends.test_tls import cert, server_tls  # noqa: F401 - the fixture: a self-signed CA for 127.0.0.1
from tests.conftest import REPO

MULTINODE = REPO / "examples" / "multinode"
SA_TOKEN = "launcher-sa-token-Qm27"
# What the stand-in serves, and every verb RBAC knows: all of it is refused unless the Role grants it.
RESOURCES = ("pods", "nodes", "events", "namespaces", "jobs", "trainjobs", "workloads")
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")


def _rbac() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((MULTINODE / RBAC_FILE).read_text()) if d]
    return {d["kind"] if d["metadata"]["name"] == trainjob_launch.LAUNCHER_SERVICE_ACCOUNT else "node " + d["kind"]: d
            for d in docs}


def _job(base: Path) -> dict[str, Any]:
    return yaml.safe_load((base / "mlflow_projects" / "finetune-k8s" / "kubernetes_job_template.yaml").read_text())


def test_the_rbac_grants_what_the_launcher_calls_to_the_account_the_job_runs_as() -> None:
    rbac = _rbac()
    assert sorted(rbac) == ["Role", "RoleBinding", "ServiceAccount", "node ServiceAccount"]
    # every object in the compiled namespace (examples/multinode: the default, llmpack), the header saying so
    assert {d["metadata"]["namespace"] for d in rbac.values()} == {"llmpack"}
    assert "kubectl apply -n llmpack -f launcher-rbac.yaml" in (MULTINODE / RBAC_FILE).read_text()
    # the node pods' account: no Role binds it, no token mounted; the TrainJob's pods run as it
    node = rbac["node ServiceAccount"]
    assert node["automountServiceAccountToken"] is False
    trainjob = yaml.safe_load((MULTINODE / "trainjob" / "finetune-trainjob.yaml").read_text())
    assert trainjob["metadata"]["namespace"] == "llmpack"  # where the launcher, and so its TrainJob, runs
    (patch,) = trainjob["spec"]["runtimePatches"]
    node_pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert node_pod["spec"]["serviceAccountName"] == node["metadata"]["name"]
    account = rbac["ServiceAccount"]["metadata"]["name"]
    assert account == trainjob_launch.LAUNCHER_SERVICE_ACCOUNT
    (rule,) = rbac["Role"]["rules"]
    assert rule == {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"],
                    "verbs": ["create", "get", "delete"]}
    binding = rbac["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": rbac["Role"]["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "llmpack"}]
    pod = _job(MULTINODE)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account and pod["automountServiceAccountToken"] is True
    # one node: no step talks to the API, no token in the pod
    single = _job(REPO)["spec"]["template"]["spec"]
    assert single["automountServiceAccountToken"] is False and "serviceAccountName" not in single
    assert not (REPO / RBAC_FILE).exists()


def _forbidden_by(role: dict[str, Any]) -> set[str]:
    granted = {(verb, res) for rule in role["rules"] for verb in rule["verbs"] for res in rule["resources"]}
    return {f"{verb} {res}" for verb in VERBS for res in RESOURCES if (verb, res) not in granted}


def _pod_files(tmp_path: Path, ca: Path, namespace: str) -> Path:
    """What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount for a pod with the token automounted."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(SA_TOKEN)
    (sa / "ca.crt").write_bytes(ca.read_bytes())
    (sa / "namespace").write_text(namespace)
    # the pod's filesystem: the launcher reads the service account where the kubelet put it
    shim = tmp_path / "pod-site"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "from components.trainjob import launch as trainjob_launch\n"
        f"trainjob_launch.load_config.__kwdefaults__['service_account_dir'] = {str(sa)!r}\n")
    return shim


def _finetune_command(tmp_path: Path, shared: Path) -> tuple[str, str]:
    """The finetune entry point's command as MLflow builds it from the compiled project (compiled defaults,
    run paths), and the gang spec's digest as the Job's pod pins it (``LLMPACK_GANG_SPECS``: the spec with this
    test's mount, as a compile for that mount would write)."""
    from mlflow.projects.utils import get_entry_point_command, load_project

    project = load_project(str(MULTINODE / "mlflow_projects" / "finetune-k8s"))
    spec = yaml.safe_load((MULTINODE / "mlflow_projects" / "finetune-k8s" / "MLproject").read_text())
    default = spec["entry_points"]["finetune"]["parameters"][gang.TRAINJOB_PARAM]["default"]
    trainjob = replace(gang.GangSpec.from_json(default, "MLproject"), mount=str(shared)).to_json()  # the PVC's mount
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    (tokens / "tokens.bin").write_bytes(b"\0" * 16)
    params = {"in_tokens": str(tokens), "out_model": str(tmp_path / "model"), gang.TRAINJOB_PARAM: trainjob,
              "pipeline_run": "mlflow-rbac-1", "run_group": "rg-rbac"}
    return " ".join(get_entry_point_command(project, "finetune", params, None)), gang.spec_digest(
        gang.GangSpec.from_json(trainjob, "MLproject"))


def test_the_mlflow_jobs_launcher_creates_its_trainjob_with_the_service_account_token(
        tmp_path: Path, cert: tuple[Path, Path]) -> None:  # noqa: F811 - the imported fixture
    rbac, job = _rbac(), _job(MULTINODE)
    namespace = job["metadata"]["namespace"]
    shared = tmp_path / "pvc"
    shared.mkdir()
    shim = _pod_files(tmp_path, cert[0], namespace)
    command, pinned = _finetune_command(tmp_path, shared)
    assert command.startswith("python -m components.run components.steps.finetune:finetune ")
    assert f"--param={gang.NNODES_PARAM}=2" in command

    api = KubeAPIStandIn(token=SA_TOKEN, namespaces=(namespace,), forbidden=_forbidden_by(rbac["Role"]))
    api.tls = server_tls(cert)
    with api:
        created: list[dict[str, Any]] = []

        def complete(obj: dict[str, Any]) -> None:  # the Trainer controller: the gang ran
            created.append(obj)
            api.set_trainjob_condition(obj["metadata"]["namespace"], obj["metadata"]["name"], "Complete", "True",
                                       reason="AllJobsCompleted")

        api.on_custom_object_created = complete
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "LLMPACK_", "MLFLOW_"))}
        env.update({"HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                    "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)]), "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                    "KUBERNETES_SERVICE_PORT": str(api.port), "LLMPACK_MLFLOW_LOGGING": "0",
                    "LLMPACK_GANG_SPECS": pinned})
        proc = subprocess.run(["bash", "-c", command], cwd=MULTINODE / "mlflow_projects" / "finetune-k8s", env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        requests = api.recorded()
    assert len(created) == 1 and created[0]["metadata"]["namespace"] == namespace
    assert created[0]["spec"]["trainer"]["numNodes"] == 2
    assert f"TrainJob {namespace}/{created[0]['metadata']['name']} Complete" in proc.stdout
    assert requests and all(r.authorized for r in requests)  # every call with the service account's token
    assert {r.method for r in requests} <= {"POST", "GET"} and all("/trainjobs" in r.path for r in requests)


def test_without_the_role_the_launcher_says_which_rule_is_missing(tmp_path: Path, cert: tuple[Path, Path]) -> None:  # noqa: F811
    """The same pod with the Role not applied: one line naming the verb, the resource and the rule to grant."""
    namespace = _job(MULTINODE)["metadata"]["namespace"]
    shared = tmp_path / "pvc"
    shared.mkdir()
    shim = _pod_files(tmp_path, cert[0], namespace)
    api = KubeAPIStandIn(token=SA_TOKEN, namespaces=(namespace,), forbidden={"trainjobs"})
    api.tls = server_tls(cert)
    command, pinned = _finetune_command(tmp_path, shared)
    with api:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "LLMPACK_", "MLFLOW_"))}
        env.update({"HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                    "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)]), "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                    "KUBERNETES_SERVICE_PORT": str(api.port), "LLMPACK_MLFLOW_LOGGING": "0",
                    "LLMPACK_GANG_SPECS": pinned})
        proc = subprocess.run(["bash", "-c", command],
                              cwd=MULTINODE / "mlflow_projects" / "finetune-k8s", env=env, capture_output=True,
                              text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if "llmpack: error:" in line]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "403 Forbidden" in errors[0] and 'resources ["trainjobs"]' in errors[0] and SA_TOKEN not in proc.stderr


@pytest.mark.parametrize("nodes", [None, 2])
def test_compile_writes_the_rbac_beside_the_artifacts_only_for_a_gang(nodes: int | None, tmp_path: Path) -> None:
    from llmpack.compile.artifacts import TRAINJOB_FILE, compile_all

    written = {p.relative_to(tmp_path) for p in compile_all(tmp_path, nodes=nodes, gpus=4 if nodes else None,
                                                              cache_pvc="shared" if nodes else None)}
    assert (RBAC_FILE in written) == bool(nodes) == (TRAINJOB_FILE in written)
