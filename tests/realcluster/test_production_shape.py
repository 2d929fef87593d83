"""Every compiled artifact of the production shape, created on the real API server with strict field validation.

``llmpack compile --nodes 2 --gpus 8 --gpu-type h100`` with everything a platform engineer sets;
each object POSTed with ``fieldValidation=Strict`` and ``dryRun=All`` (admission and validation run
in full, nothing is stored) into a namespace enforcing Pod Security ``restricted``: the MLflow Job
as MLflow's own backend fills it and the Pod its controller would make (Pod Security enforces on
pods, and only warns on workloads), the prepull DaemonSet and its pod, the launcher's RBAC, the
TrainJob against Trainer's own CRDs and its node pod (``trainjob_pod``), the Argo Workflow against
Argo's full CRD and each template as a pod (``argo_pods``), each KFP executor as the pod the KFP
backend makes of it (``kfp_executor_pods``). The list: docs/internals/real-cluster.md, "Which tests use it".

What the real server refuses today is written down in :data:`REFUSED`, with the server's exact
words, and asserted refused with them: a fix that makes the server accept one fails its case
until the entry is removed, so these tests record reality and flip with the fix.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.backends.test_pod_security import argo_pods, hardening_gaps, kfp_pods, trainjob_pod
from tests.conftest import REPO
from tests.realcluster import crds
from tests.realcluster.apiserver import Answer, create, make_namespace
from tests.realcluster.conftest import RealCluster

pytestmark = pytest.mark.cluster

NAMESPACE = "ml-train"
DIGEST = "sha256:" + "ab" * 32
PRODUCTION_FLAGS = ("--nodes", "2", "--gpus", "8", "--gpu-type", "h100", "--image", f"ghcr.io/acme/llmpack@{DIGEST}",
                    "--image-pull-secret", "regcred", "--model-pvc", "llmpack-models", "--data-pvc", "llmpack-data",
                    "--checkpoint-pvc", "llmpack-checkpoints", "--cache-pvc", "llmpack-cache",
                    "--hf-token-secret", "hf-token", "--namespace", NAMESPACE, "--label", "team=ml-platform",
                    "--queue", "team-a", "--prepull")

# The production shape for Trainer 2.2: --trainer-version 2.2 and no checkpoint volume (whose grace
# period v2.2's TrainJob cannot carry; compile refuses the two together).
TRAINER_22_FLAGS = (*[f for i, f in enumerate(PRODUCTION_FLAGS)
                      if "--checkpoint-pvc" not in PRODUCTION_FLAGS[max(i - 1, 0):i + 1]], "--trainer-version", "2.2")

# case -> the server's words when it refuses it today (asserted, so a fix shows up as a failing case).
REFUSED: dict[str, str] = {}


def compile_shape(out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``llmpack compile`` in a process of its own, as a user types it, into ``out``."""
    return subprocess.run([sys.executable, "-m", "llmpack", "compile", "--out", str(out), *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def mlflow_job(out: Path) -> dict[str, Any]:
    """The Job MLflow's Kubernetes backend makes from the compiled template, by MLflow's own code."""
    from mlflow.projects.kubernetes import _get_kubernetes_job_definition

    template = yaml.safe_load((out / "mlflow_projects" / "finetune-k8s" / "kubernetes_job_template.yaml").read_text())
    return _get_kubernetes_job_definition(
        project_name="llm-finetune", image_tag="ghcr.io/acme/llmpack-mlflow-project", image_digest=DIGEST,
        command=["python", "main.py"], env_vars={"MLFLOW_RUN_ID": "r1", "MLFLOW_EXPERIMENT_ID": "1",
                                                 "MLFLOW_TRACKING_URI": "http://mlflow.mlflow:5000"},
        job_template=template)


def pod_of(template: dict[str, Any], name: str) -> dict[str, Any]:
    """The Pod a workload controller makes from pod template ``template`` (its metadata and spec)."""
    metadata = {"name": name, "labels": dict((template.get("metadata") or {}).get("labels") or {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": copy.deepcopy(template["spec"])}


def template_pods(out: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each Argo container template as a pod (Argo names the container ``main`` and adds its executor)."""
    wf = yaml.safe_load((out / "argo_workflows" / "finetune.yaml").read_text())
    for where, spec in argo_pods(out / "argo_workflows" / "finetune.yaml"):
        spec = {k: v for k, v in spec.items() if v or v is False}  # automountServiceAccountToken: false kept
        spec["containers"] = [{"name": "main", **c} if "name" not in c else c for c in spec["containers"]]
        spec["imagePullSecrets"] = wf["spec"].get("imagePullSecrets") or []
        spec["restartPolicy"] = "Never"
        yield f"argo {where} pod", {"apiVersion": "v1", "kind": "Pod",
                                    "metadata": {"name": where.split()[-1].lower()}, "spec": spec}


def kfp_executor_pods(out: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each KFP executor as the pod the KFP backend makes of it: the IR's image, resources and identity, the
    platform spec's volumes, and the context the backend adds itself (tests/backends/test_pod_security.py)."""
    for where, spec in kfp_pods(out / "kfp_pipelines" / "finetune.yaml"):
        pod = copy.deepcopy(spec)
        for container in pod["containers"]:  # the IR's proto JSON writes int64 fields as strings; the pod has ints
            sc = container["securityContext"]
            sc.update({k: int(v) for k, v in sc.items() if k in ("runAsUser", "runAsGroup")})
        pod["restartPolicy"] = "Never"
        pod["securityContext"] = {"runAsNonRoot": True}  # the backend's pod level: the rest is on the container
        yield f"kfp {where} pod", {"apiVersion": "v1", "kind": "Pod",
                                   "metadata": {"name": where.split()[-1].lower().replace("_", "-")}, "spec": pod}


@pytest.fixture(scope="module")
def shape(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The production shape's objects as they reach the API server, by case name."""
    out = tmp_path_factory.mktemp("production-shape")
    done = compile_shape(out, *PRODUCTION_FLAGS)
    assert done.returncode == 0, done.stderr
    objects: dict[str, dict[str, Any]] = {}
    for doc in _docs(out / "trainjob" / "launcher-rbac.yaml"):
        node = doc["metadata"]["name"] == "llmpack-trainer"
        objects[f"launcher {'node ' if node else ''}{doc['kind']}"] = doc
    job = mlflow_job(out)
    objects["mlflow Job"] = job
    objects["mlflow Job pod"] = pod_of(job["spec"]["template"], "llm-finetune-job-pod")
    (daemonset,) = _docs(out / "prepull" / "llmpack-prepull-daemonset.yaml")
    objects["prepull DaemonSet"] = daemonset
    objects["prepull DaemonSet pod"] = pod_of(daemonset["spec"]["template"], "llmpack-prepull-pod")
    (trainjob,) = _docs(out / "trainjob" / "finetune-trainjob.yaml")
    objects["TrainJob"] = trainjob
    objects["TrainJob node pod"] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainjob-node-0"},
                                    "spec": trainjob_pod(trainjob)}
    objects["argo Workflow"] = yaml.safe_load((out / "argo_workflows" / "finetune.yaml").read_text())
    objects.update(template_pods(out))
    objects.update(kfp_executor_pods(out))
    v22 = tmp_path_factory.mktemp("production-shape-trainer-2.2")
    done = compile_shape(v22, *TRAINER_22_FLAGS)
    assert done.returncode == 0, done.stderr
    (objects["TrainJob for trainer 2.2"],) = _docs(v22 / "trainjob" / "finetune-trainjob.yaml")
    return objects


@pytest.fixture(scope="module")
def restricted(real_cluster: RealCluster) -> str:
    """Namespace ``ml-train``, enforcing (and warning on) Pod Security ``restricted`` at the server's version."""
    labels = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest",
              "pod-security.kubernetes.io/warn": "restricted"}
    return make_namespace(real_cluster.api, NAMESPACE, labels)


def _strict(real_cluster: RealCluster, obj: dict[str, Any], namespace: str) -> Answer:
    return create(real_cluster.api, obj, namespace=namespace)


def expect(case: str, answer: Answer) -> None:
    """Refused with :data:`REFUSED`'s words where it lists ``case``, accepted otherwise."""
    if case in REFUSED:
        assert answer.status in (400, 422) and REFUSED[case] in answer.message, (
            f"{case}: REFUSED says the server refuses it with {REFUSED[case]!r}; it answered {answer.status} "
            f"{answer.message!r} (fixed? then remove the entry)")
    else:
        assert answer.status in (200, 201), f"{case}: {answer.status} {answer.message}"


def _case(name: str) -> Any:
    return pytest.param(name, id=name.replace(" ", "-"))


LAUNCHER = ("launcher ServiceAccount", "launcher Role", "launcher RoleBinding", "launcher node ServiceAccount")
CORE_CASES = ["mlflow Job", "mlflow Job pod", "prepull DaemonSet", "prepull DaemonSet pod", "TrainJob node pod"]


@pytest.fixture(scope="module")
def launcher(real_cluster: RealCluster, restricted: str, shape: dict[str, dict[str, Any]]) -> dict[str, Answer]:
    """launcher-rbac.yaml created for real (strict), as its header says to apply it first: pods name its
    ServiceAccount."""
    return {case: create(real_cluster.api, shape[case], namespace=restricted, dry_run=False) for case in LAUNCHER}


def test_launcher_rbac_created_strictly(launcher: dict[str, Answer]) -> None:
    """The launcher's ServiceAccount, Role and RoleBinding: created with strict field validation, no warnings."""
    for case, answer in launcher.items():
        expect(case, answer)
        assert answer.warnings == (), (case, answer.warnings)


@pytest.mark.parametrize("case", [_case(c) for c in CORE_CASES])
def test_core_objects_strictly_valid_under_restricted(real_cluster: RealCluster, restricted: str,
                                                     launcher: dict[str, Answer],
                                                     shape: dict[str, dict[str, Any]], case: str) -> None:
    """Accepted by the real API server: schema, strict fields, pod validation, Pod Security ``restricted``, quota
    and limits."""
    answer = _strict(real_cluster, shape[case], restricted)
    expect(case, answer)
    assert not [w for w in answer.warnings if "restricted" in w], answer.warnings


def test_every_argo_template_pod_strictly_valid_under_restricted(real_cluster: RealCluster, restricted: str,
                                                                 launcher: dict[str, Answer],
                                                                 shape: dict[str, dict[str, Any]]) -> None:
    """Each Argo container template, as a pod: accepted under ``restricted`` (the executor's containers aside)."""
    cases = sorted(k for k in shape if k.startswith("argo template"))
    assert len(cases) >= 5, cases
    refused = {}
    for case in cases:
        answer = _strict(real_cluster, shape[case], restricted)
        if answer.status not in (200, 201):
            refused[case] = answer.message
    assert refused == {k: v for k, v in REFUSED.items() if k.startswith("argo template")}


def _pod_cases(shape: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(k for k, obj in shape.items() if obj.get("kind") == "Pod")


def test_every_pod_of_every_path_strictly_valid_under_restricted(real_cluster: RealCluster, restricted: str,
                                                                launcher: dict[str, Answer],
                                                                shape: dict[str, dict[str, Any]]) -> None:
    """All the production shape's pods, KFP's executors too: accepted under ``restricted`` with no warning,
    and each hardened alike (limits, read-only root but KFP's, bounded /dev/shm, no token but the launcher's)."""
    cases = _pod_cases(shape)
    paths = {c.split()[0] for c in cases}
    assert {"kfp", "argo", "mlflow", "prepull", "TrainJob"} <= paths, paths
    assert sum(c.startswith("kfp ") for c in cases) >= 5 and sum(c.startswith("argo ") for c in cases) >= 5, cases
    refused, gaps = {}, {}
    for case in cases:
        answer = _strict(real_cluster, shape[case], restricted)
        if answer.status not in (200, 201) or [w for w in answer.warnings if "restricted" in w]:
            refused[case] = (answer.status, answer.message, answer.warnings)
        if found := hardening_gaps(case, shape[case]["spec"]):
            gaps[case] = found
    assert refused == {} and gaps == {}


def test_only_the_launcher_account_may_create_and_delete_trainjobs(real_cluster: RealCluster, restricted: str,
                                                                    launcher: dict[str, Answer],
                                                                    shape: dict[str, dict[str, Any]]) -> None:
    """The real API server's RBAC authorizer, asked by SubjectAccessReview: the compiled launcher account may
    create, get and delete TrainJobs in the compiled namespace; the namespace's ``default`` account (which every
    pod ran as before), the node pods' account and the launcher in another namespace may not."""
    from kubernetes import client

    assert shape["launcher RoleBinding"]["metadata"]["namespace"] == NAMESPACE

    def allowed(account: str, verb: str, namespace: str = NAMESPACE) -> bool:
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
            "user": f"system:serviceaccount:{NAMESPACE}:{account}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
            "resourceAttributes": {"group": "trainer.kubeflow.org", "resource": "trainjobs", "verb": verb,
                                   "namespace": namespace}}}
        return bool(client.AuthorizationV1Api(real_cluster.api).create_subject_access_review(review).status.allowed)

    for verb in ("create", "get", "delete"):
        assert allowed("llmpack-launcher", verb), verb
        assert not allowed("default", verb), verb
        assert not allowed("llmpack-trainer", verb), verb
        assert not allowed("llmpack-launcher", verb, namespace="default"), verb
    assert not allowed("llmpack-launcher", "list") and not allowed("llmpack-launcher", "update")
    # who runs as which account, in the objects as applied
    assert shape["mlflow Job pod"]["spec"]["serviceAccountName"] == "llmpack-launcher"
    argo_launchers = [c for c in _pod_cases(shape) if c.startswith("argo ")
                      and shape[c]["spec"].get("serviceAccountName") == "llmpack-launcher"]
    assert argo_launchers == ["argo template finetune pod"], argo_launchers
    assert shape["argo Workflow"]["spec"]["automountServiceAccountToken"] is False
    assert shape["TrainJob node pod"]["spec"]["serviceAccountName"] == "llmpack-trainer"
    assert shape["launcher node ServiceAccount"]["automountServiceAccountToken"] is False


def test_argo_v36_full_crd_is_refused_by_the_api_server(real_cluster: RealCluster) -> None:
    """Argo v3.6.2's full (schema-carrying) Workflow CRD is not structural: the real server refuses it (v3.7.3's
    installs).

    So a cluster on Argo 3.6 validates Workflows against the minimal CRD only (any field passes);
    the strict check below uses v3.7.3's.
    """
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as refused:
        crds.install(real_cluster.api, "argo-v3.6")
    assert refused.value.status == 422
    assert ("spec.validation.openAPIV3Schema.properties[spec].properties[templateDefaults].properties[dag]"
            ".properties[tasks].items.properties[inline].type: Required value: must not be empty for specified "
            "object fields") in refused.value.body.decode()


@pytest.mark.parametrize("case", [_case("argo Workflow")])
def test_argo_workflow_strictly_valid_against_argos_own_crd(real_cluster: RealCluster, restricted: str,
                                                            shape: dict[str, dict[str, Any]], case: str) -> None:
    """The Workflow against Argo v3.7.3's full Workflow CRD (its OpenAPI schema, strict), as ``argo submit -n``
    creates it."""
    crds.install(real_cluster.api, "argo-v3.7")
    expect(case, _strict(real_cluster, shape[case], restricted))


@pytest.mark.parametrize("case", [_case("TrainJob @ trainer-v2.2"), _case("TrainJob @ trainer-v2.3")])
def test_trainjob_strictly_valid_against_trainers_own_crd(real_cluster: RealCluster, restricted: str,
                                                          shape: dict[str, dict[str, Any]], case: str) -> None:
    """Each supported Trainer release's TrainJob CRD against the TrainJob compiled for it: v2.3.0 and the default
    (the production shape, checkpoint volume included); v2.2.0 and ``--trainer-version 2.2`` (no checkpoint volume)."""
    version = case.split(" @ ")[1]
    crds.install(real_cluster.api, version)
    expect(case, _strict(real_cluster, shape["TrainJob for trainer 2.2" if version == "trainer-v2.2" else "TrainJob"],
                         restricted))


def test_trainer_22_with_a_checkpoint_volume_is_refused_at_compile(tmp_path: Path) -> None:
    """``--trainer-version 2.2 --checkpoint-pvc``: one line at compile, exit 2, nothing written (v2.2's CRD would
    refuse the node pods' ``terminationGracePeriodSeconds``)."""
    done = compile_shape(tmp_path / "out", *PRODUCTION_FLAGS, "--trainer-version", "2.2")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "--trainer-version 2.2" in done.stderr
    assert "terminationGracePeriodSeconds" in done.stderr and "--checkpoint-pvc" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flags", "named"), [
    pytest.param(("--gpus", "8", "--model-pvc", "m:/dev/shm"), ("--model-pvc", "--gpus"), id="dev-shm"),
    pytest.param(("--model-pvc", "m:/var/cache/llmpack/huggingface", "--cache-pvc", "shared"),
                 ("--model-pvc", "--cache-pvc"), id="hf-cache"),
    pytest.param(("--model-pvc", "m:/tmp"), ("--model-pvc", "/tmp"), id="tmp"),
])
def test_mount_collisions_are_refused_at_compile(tmp_path: Path, flags: tuple[str, ...],
                                                 named: tuple[str, ...]) -> None:
    """A claim at one of the pack's own mount paths: refused by compile in one line naming both, exit 2.

    Compiled, each gave a pod with two volumes at one path; the real API server refused the MLflow
    Job of ``--gpus 8 --model-pvc m:/dev/shm`` with ``volumeMounts[3].mountPath: Invalid value:
    "/dev/shm": must be unique``.
    """
    done = compile_shape(tmp_path / "out", *flags, "--namespace", NAMESPACE)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert all(word in done.stderr for word in named), done.stderr
    assert not (tmp_path / "out").exists()


def test_the_server_refuses_what_compile_now_refuses(real_cluster: RealCluster, restricted: str,
                                                     tmp_path: Path) -> None:
    """Why compile refuses ``--model-pvc m:/dev/shm``: the MLflow Job with the model at the GPU pod's ``/dev/shm``,
    made by hand from a good compile, is refused by the real API server (two mounts at one path)."""
    done = compile_shape(tmp_path, "--gpus", "8", "--model-pvc", "m", "--namespace", NAMESPACE)
    assert done.returncode == 0, done.stderr
    job = mlflow_job(tmp_path)
    for mount in job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]:
        if mount["name"] == "llmpack-model":
            mount["mountPath"] = "/dev/shm"
    answer = _strict(real_cluster, job, restricted)
    assert answer.status == 422 and '"/dev/shm": must be unique' in answer.message, answer.message


def test_jobset_and_kueue_crds_install_and_the_queue_doctor_proposes_is_valid(real_cluster: RealCluster,
                                                                              restricted: str) -> None:
    """JobSet's and Kueue's own CRDs are served; the LocalQueue ``llmpack doctor``'s fix line creates, pasted as
    printed (its placeholder ClusterQueue included), passes strictly; a misspelt field does not."""
    from llmpack.cluster.doctor.checks import CLUSTER_QUEUE_PLACEHOLDER

    assert crds.install(real_cluster.api, "jobset") == ["jobsets.jobset.x-k8s.io"]
    assert "localqueues.kueue.x-k8s.io" in crds.install(real_cluster.api, "kueue")
    queue = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue", "metadata": {"name": "team-a"},
             "spec": {"clusterQueue": CLUSTER_QUEUE_PLACEHOLDER}}
    expect("kueue LocalQueue, doctor's placeholder", create(real_cluster.api, queue, namespace=restricted))
    named = {**queue, "metadata": {"name": "team-b"}, "spec": {"clusterQueue": "gpu-h100"}}
    expect("kueue LocalQueue", create(real_cluster.api, named, namespace=restricted))
    typo = {**queue, "spec": {"clusterQueue": "q", "clusterQueu": "q"}}
    answer = create(real_cluster.api, typo, namespace=restricted)
    assert answer.status == 400 and 'unknown field "spec.clusterQueu"' in answer.message, answer.message
