"""``llmpack doctor`` against the loopback Kubernetes API, through the real ``kubernetes`` client.

A cluster planted ready for a first run (tests/standins/ready_cluster.py: what
docs/first-run-on-a-cluster.md says to apply) passes every check with exit 0; each planted fault
gives its own ✗ line with its fix and exit 1, and nothing else fails. No token and no Secret
value reaches the output. Bad input is one line, exit 2.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from standins.argo_server import ArgoServerStandIn
from standins.k8s_api import KubeAPIStandIn
from standins.kfp_api import KFPAPIStandIn
from standins.loopback import CLIENT_ENV, write_kubeconfig
from standins.ready_cluster import (
    CKPT_PVC,
    FAULTS,
    HF_TOKEN_VALUE,
    POD_FLAGS,
    QUEUE,
    SECRET_PASSWORD,
    SIGNING_KEY,
    TRACKING_URI,
    plant_fault,
    plant_ready,
)

from llmpack.cli import main

PAGE_PATH = Path(__file__).resolve().parents[4] / "docs" / "first-run-on-a-cluster.md"
PAGE = PAGE_PATH.read_text(encoding="utf-8")
K8S_TOKEN, KFP_TOKEN, ARGO_TOKEN = "doctor-k8s-token-7c1", "doctor-kfp-token-7c1", "doctor-argo-token-7c1"
GANG = ("--nodes", "2", "--gpus", "4", "--queue", QUEUE)
CKPT = ("--checkpoint-pvc", f"{CKPT_PVC}:/ckpt")


@dataclass
class Ready:
    kube: KubeAPIStandIn
    kfp: KFPAPIStandIn
    argo: ArgoServerStandIn
    kubeconfig: Path

    def doctor(self, *args: str, token: str = K8S_TOKEN) -> tuple[int, str]:
        """``llmpack doctor`` in this process; its exit code and everything it printed."""
        if token != K8S_TOKEN:
            write_kubeconfig(self.kubeconfig, self.kube.url, token)
        env = {"KFP_TOKEN": KFP_TOKEN, "ARGO_TOKEN": ARGO_TOKEN}
        result = CliRunner().invoke(main, ["cluster", "doctor", "--kubeconfig", str(self.kubeconfig), "--kfp-host",
                                           self.kfp.url, "--argo-host", self.argo.url, *args], env=env,
                                    prog_name="llmpack")
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        return result.exit_code, result.output


@pytest.fixture()
def ready(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Ready]:
    for name in CLIENT_ENV:  # no endpoint, token or kubeconfig of the developer's shell
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with KubeAPIStandIn(token=K8S_TOKEN, namespaces=()) as kube, KFPAPIStandIn(token=KFP_TOKEN) as kfp, \
            ArgoServerStandIn(token=ARGO_TOKEN) as argo:
        plant_ready(kube)
        yield Ready(kube, kfp, argo, write_kubeconfig(tmp_path / "kubeconfig", kube.url, K8S_TOKEN))


def failed_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("✗")]


def assert_no_secret(output: str) -> None:
    for secret in (K8S_TOKEN, KFP_TOKEN, ARGO_TOKEN, SECRET_PASSWORD, SIGNING_KEY,
                   base64.b64encode(SECRET_PASSWORD.encode()).decode(),
                   TRACKING_URI, HF_TOKEN_VALUE, base64.b64encode(HF_TOKEN_VALUE.encode()).decode()):
        assert secret not in output


def test_ready_cluster_passes_every_check(ready: Ready) -> None:
    code, out = ready.doctor()
    assert code == 0, out
    assert not failed_lines(out)
    checks = [line for line in out.splitlines() if line.startswith("✓")]
    for expected in ("Kubernetes API", "node(s) of GPU type nvidia-h100-80gb", "tolerate", "allocatable nvidia.com/gpu",
                     "namespace llmpack exists", "namespace kubeflow exists",
                     "Secret llmpack-mlflow in llmpack has tracking-uri and password, signing-key, username",
                     "RBAC (mlflow): you may create/get/delete jobs.batch, list/watch pods, "
                     "list/watch events in llmpack",
                     "RBAC (argo): you may create/get workflows.argoproj.io", "Pod Security (kfp)",
                     "Argo artifact repository", "KFP API at", "Argo Server at"):
        assert any(expected in line for line in checks), (expected, out)
    assert out.splitlines()[-1] == f"all {len(checks)} checks hold"
    assert_no_secret(out)
    # one SelfSubjectAccessReview per verb, as the real client sends it
    reviews = ready.kube.recorded("POST", "selfsubjectaccessreviews")
    attrs = {(r.body["spec"]["resourceAttributes"]["verb"], r.body["spec"]["resourceAttributes"]["resource"])
             for r in reviews}
    assert {("create", "jobs"), ("create", "workflows"), ("watch", "pods"), ("list", "nodes")} <= attrs


def test_ready_pod_references_pass(ready: Ready) -> None:
    """The submit flags' references: the model/data PVCs Bound, the HF token Secret and key, the pull Secret."""
    code, out = ready.doctor(*POD_FLAGS)
    assert code == 0, out
    for expected in ("✓ PersistentVolumeClaim llmpack-models in llmpack is Bound",
                     "✓ PersistentVolumeClaim llmpack-data in kubeflow is Bound",
                     "✓ Secret hf-token in llmpack has token (HF_TOKEN)",
                     "✓ image pull Secret regcred in kubeflow exists (kubernetes.io/dockerconfigjson)"):
        assert expected in out, (expected, out)
    assert_no_secret(out)


@pytest.mark.slow  # a compile of its own
def test_compiled_references_are_checked_without_flags(ready: Ready, tmp_path: Path) -> None:
    """What `llmpack compile --model-pvc --hf-token-secret --image-pull-secret` wrote is read back from the
    artifacts."""
    from llmpack.compile.artifacts import compile_all
    from llmpack.compile.pod_options import PodOptions

    compile_all(tmp_path, pod=PodOptions.from_flags(model_pvc="llmpack-models", hf_token_secret="hf-token:other",
                                                     image_pull_secrets=("regcred",)))
    code, out = ready.doctor("--path", "argo,mlflow", "--compiled", str(tmp_path))
    assert code == 1, out
    assert failed_lines(out) == ["✗ Secret hf-token in llmpack has no other key (the pods read HF_TOKEN from it)"], out
    assert "✓ PersistentVolumeClaim llmpack-models in llmpack is Bound" in out and "✓ image pull Secret regcred" in out
    code, out = ready.doctor("--path", "kfp", "--compiled", str(tmp_path))  # KFP's own IR spelling, read the same
    assert ("✓ PersistentVolumeClaim llmpack-models in kubeflow" in out
            and "✗ Secret hf-token in kubeflow has no other" in out)


def test_ready_gang_passes_every_check(ready: Ready) -> None:
    code, out = ready.doctor(*GANG)
    assert code == 0, out
    for expected in ("ClusterTrainingRuntime torch-distributed exists",
                     "launcher RBAC in llmpack: llmpack-launcher may "
                     "create, get, delete trainjobs.trainer.kubeflow.org",
                     "llmpack-shared in llmpack is Bound, ReadWriteMany", "Kueue LocalQueue team-a in llmpack",
                     "2 tolerated GPU node(s) with 4 allocatable"):
        assert expected in out, (expected, out)


def test_a_gang_without_the_node_pods_account_fails_its_own_line(ready: Ready) -> None:
    """launcher-rbac.yaml's ServiceAccount llmpack-trainer (the TrainJob's node pods run as it) missing: its own ✗."""
    ready.kube.delete_custom_object("serviceaccounts", "llmpack", "llmpack-trainer")
    code, out = ready.doctor(*GANG)
    assert code == 1, out
    assert failed_lines(out) == ["✗ launcher RBAC in llmpack: ServiceAccount llmpack-trainer missing (the TrainJob's "
                                 "node pods run as it: without it none is created)"], out


def test_checkpoint_pvc_is_checked_readwritemany_only_for_a_gang(ready: Ready) -> None:
    """--checkpoint-pvc: Bound on one node; a gang's node pods all resume from it, so ReadWriteMany."""
    ready.kube.apply_custom_object({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                    "metadata": {"name": CKPT_PVC, "namespace": "llmpack"},
                                    "spec": {"accessModes": ["ReadWriteOnce"]},
                                    "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"]}})
    code, out = ready.doctor("--path", "argo", *CKPT)
    assert code == 0, out
    assert f"✓ PersistentVolumeClaim {CKPT_PVC} in llmpack is Bound" in out and "ReadWriteOnce" not in out, out
    code, out = ready.doctor("--path", "argo", *GANG, *CKPT)
    assert code == 1, out
    assert failed_lines(out) == [f"✗ PersistentVolumeClaim {CKPT_PVC} in llmpack is ReadWriteOnce, not ReadWriteMany "
                                 "(every node pod of the gang mounts it)"], out
    code, out = ready.doctor("--path", "argo", *GANG,
                             "--checkpoint-pvc", "llmpack-shared")  # the gang's own claim: once
    assert code == 0 and out.count("llmpack-shared in llmpack is Bound") == 1, out
    code, out = ready.doctor("--path", "argo", "--checkpoint-pvc", "Ckpt")
    assert code == 2 and "--checkpoint-pvc" in out and "Traceback" not in out, out


# fault: (extra flags, what its ✗ line says, what its fix says)
CASES = {
    "no-namespace": ((), "namespace llmpack does not exist", "kubectl create namespace llmpack"),
    "rbac-denied": ((), "RBAC (mlflow): you may not create jobs.batch in llmpack",
                    "--verb=create --resource=jobs.batch"),
    "no-gpu-nodes": ((), "no node is a nvidia-h100-80gb node by its labels",
                     "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"),
    "taint-not-tolerated": ((), "dedicated=training:NoSchedule", "kubectl taint node gpu-node-0 dedicated:NoSchedule-"),
    "no-gpus-allocatable": ((), "0 tolerated GPU node(s) with 1 allocatable nvidia.com/gpu, need 1", "device plugin"),
    "no-runtime": (GANG, "ClusterTrainingRuntime torch-distributed missing", "manifests/overlays/runtimes"),
    "no-launcher-rbac": (GANG, "RoleBinding llmpack-launcher missing", "launcher-rbac.yaml"),
    "pvc-rwo": (GANG, "llmpack-shared in llmpack is ReadWriteOnce, not ReadWriteMany", "delete pvc llmpack-shared"),
    "pvc-pending": (GANG, "llmpack-shared in llmpack is Pending, not Bound", '"kind":"PersistentVolume"'),
    "no-artifacts-pvc": ((), "PersistentVolumeClaim llmpack-artifacts missing in llmpack",
                         '"accessModes":["ReadWriteOnce"]'),
    "no-queue": (GANG, "LocalQueue team-a missing in llmpack", '"kind":"LocalQueue"'),
    "no-secret": ((), "Secret llmpack-mlflow missing in llmpack", "create secret generic llmpack-mlflow "
                  "--from-literal=tracking-uri=http://mlflow.mlflow.svc.cluster.local:5000 "
                  '--from-literal=signing-key="$(openssl rand -hex 32)"'),
    "secret-without-uri": ((), "Secret llmpack-mlflow in llmpack has no tracking-uri key",
                           "patch secret llmpack-mlflow"),
    "secret-without-signing-key": ((), "Secret llmpack-mlflow in llmpack has no signing-key key",
                                   '"{\\"stringData\\":{\\"signing-key\\":\\"$(openssl rand -hex 32)\\"}}"'),
    "no-argo-repository": ((), "Argo has no artifact repository for llmpack", "artifact-repositories.yaml"),
    "psa-restricted": ((), "Pod Security (kfp): kubeflow enforces restricted; kfp exec-", "enforce=baseline"),
    "ckpt-pvc-rwo": ((*GANG, *CKPT), "llmpack-ckpt in llmpack is ReadWriteOnce, not ReadWriteMany",
                     "delete pvc llmpack-ckpt"),
    "no-model-pvc": (POD_FLAGS, "PersistentVolumeClaim llmpack-models missing in llmpack", '"name":"llmpack-models"'),
    "data-pvc-pending": (POD_FLAGS, "llmpack-data in llmpack is Pending, not Bound", '"kind":"PersistentVolume"'),
    "no-hf-secret": (POD_FLAGS, "Secret hf-token missing in llmpack (the pods read HF_TOKEN from its key token",
                     "create secret generic hf-token --from-literal=token="),
    "hf-secret-without-key": (POD_FLAGS, "Secret hf-token in llmpack has no token key", "patch secret hf-token"),
    "no-pull-secret": (POD_FLAGS, "image pull Secret regcred missing in llmpack",
                       "create secret docker-registry regcred"),
}


def test_every_fault_has_a_case() -> None:
    assert set(CASES) == set(FAULTS) and len(CASES) >= 10


# Six faults, one of each kind, in the quick suite; every fault in the full run (CI runs both).
QUICK_FAULTS = {"no-namespace", "rbac-denied", "no-gpu-nodes", "no-secret", "no-model-pvc", "psa-restricted"}


@pytest.mark.parametrize("fault",
                         [f if f in QUICK_FAULTS else pytest.param(f, marks=pytest.mark.slow) for f in sorted(CASES)])
@pytest.mark.slow  # a doctor per fault, the matrix in the slow tier (CI runs it whole); the ready cluster stays quick
def test_each_fault_gives_its_own_line_and_fix(ready: Ready, fault: str) -> None:
    flags, line, fix = CASES[fault]
    code, before = ready.doctor(*flags)
    assert code == 0, before  # the fault's checks pass before it is planted
    plant_fault(ready.kube, fault)
    code, out = ready.doctor(*flags)
    assert code == 1, out
    (failed,) = failed_lines(out)  # its own line, and nothing else fails
    assert line in failed, out
    lines = out.splitlines()
    assert lines[lines.index(failed) + 1].startswith("    fix: ") and fix in lines[lines.index(failed) + 1], out
    assert out.splitlines()[-1].startswith("1 of ")
    assert_no_secret(out)
    # docs/first-run-on-a-cluster.md shows this very line and fix
    assert failed in PAGE and lines[lines.index(failed) + 1].strip() in PAGE, (failed, "not in", PAGE_PATH)


@pytest.mark.parametrize("fault", ["pvc-pending", "data-pvc-pending"])
def test_a_pending_pvcs_fix_creates_the_volume_it_waits_for(ready: Ready, fault: str) -> None:
    """Issue 52 (newcomer6, item 10): a Pending claim's fix was ``kubectl describe pvc``, which fixes nothing: now a
    PersistentVolume that binds it (its class, size and access modes; the NFS export the user's), or a
    StorageClass that provisions one, as this page says; the page shows this very line."""
    flags, line, _ = CASES[fault]
    plant_fault(ready.kube, fault)
    code, out = ready.doctor(*flags)
    (failed,) = failed_lines(out)
    fix = out.splitlines()[out.splitlines().index(failed) + 1].strip()
    assert code == 1 and line in failed and fix.startswith("fix: kubectl apply -f - <<< '")
    pv = json.loads(fix.split("'")[1])
    assert pv["kind"] == "PersistentVolume" and pv["spec"]["storageClassName"] == "nfs"
    assert pv["spec"]["accessModes"] and "StorageClass" in fix and "describe" not in fix
    assert fix in PAGE, fix


def test_path_selects_the_checks(ready: Ready) -> None:
    plant_fault(ready.kube, "no-argo-repository")
    code, out = ready.doctor("--path", "kfp,mlflow")
    assert code == 0 and "argo" not in out.split("\n", 1)[1].lower(), out
    code, out = ready.doctor("--path", "argo")
    assert code == 1 and "namespace kubeflow" not in out and "RBAC (mlflow)" not in out


def test_json_output(ready: Ready) -> None:
    plant_fault(ready.kube, "no-secret")
    code, out = ready.doctor("--json")
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False and report["paths"] == ["kfp", "argo", "mlflow"]
    (failed,) = [c for c in report["checks"] if not c["ok"]]
    assert "llmpack-mlflow missing" in failed["what"] and "create secret" in failed["fix"]


def test_unauthorized_and_unreachable_are_one_failed_line_without_the_token(ready: Ready, tmp_path: Path) -> None:
    code, out = ready.doctor(token="a-wrong-token-for-doctor")
    assert code == 1 and len(failed_lines(out)) == 1 and "HTTP 401" in out, out
    assert "a-wrong-token-for-doctor" not in out and "Traceback" not in out
    ready.kube.close()
    code, out = ready.doctor()
    assert code == 1 and failed_lines(out)[0].startswith("✗ Kubernetes API:") and "Traceback" not in out, out


@pytest.mark.parametrize("args, message", [
    (("--path", "airflow"), "--path 'airflow': choose from kfp, argo, mlflow"),
    (("--queue", "team-a"), "--queue: only with --nodes 2 or more"),
    (("--nodes", "0"), "--nodes 0: must be 1 or more"),
    (("--namespace", "Not_A_Name"), "--namespace 'Not_A_Name': not a valid Kubernetes name"),
    (("--compiled", "no/such/dir"), "--compiled no/such/dir: no such directory"),
    (("--model-pvc", "Models"), "--model-pvc 'Models': not a PersistentVolumeClaim name"),
    (("--image-pull-secret", "a_b"), "--image-pull-secret 'a_b': not a Secret name"),
])
def test_bad_input_is_one_line_exit_2(ready: Ready, args: tuple[str, ...], message: str) -> None:
    code, out = ready.doctor(*args)
    assert (code == 2 and out.strip().startswith(f"llmpack: error: {message}")
            and len(out.strip().splitlines()) == 1), out
    assert not ready.kube.recorded("POST", "selfsubjectaccessreviews")  # nothing sent


def test_gang_pod_security_reads_the_compiled_trainjob(ready: Ready, tmp_path: Path) -> None:
    """Under restricted, the verdict follows what the compiled artifacts say, TrainJob included."""
    import shutil

    from llmpack.cluster.doctor.pods import committed_root, pod_specs, violations

    compiled = tmp_path / "compiled"
    shutil.copytree(committed_root() / "examples" / "multinode", compiled)
    compliant = not any(violations(s, "restricted") for s in pod_specs(compiled, "argo", gang=True))
    ready.kube.add_namespace("llmpack", {"pod-security.kubernetes.io/enforce": "restricted"})
    code, out = ready.doctor("--nodes", "2", "--gpus", "4", "--path", "argo", "--compiled", str(compiled))
    assert ("✗ Pod Security (argo): llmpack enforces restricted" in out) is not compliant, out
    trainjob = compiled / "trainjob" / "finetune-trainjob.yaml"
    trainjob.write_text("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\n"  # no pod spec at all
                        "spec: {trainer: {numNodes: 2, resourcesPerNode: {limits: {nvidia.com/gpu: 4}}}}\n")
    specs = pod_specs(compiled, "argo", gang=True)
    assert specs[-1].where == "TrainJob node pods" and violations(specs[-1], "restricted")
    code, out = ready.doctor("--nodes", "2", "--gpus", "4", "--path", "argo", "--compiled", str(compiled))
    assert code == 1 and "✗ Pod Security (argo): llmpack enforces restricted;" in out, out
    assert violations(specs[-1], "baseline") == []  # baseline admits pods that say nothing


def test_the_tracking_secrets_are_the_compiled_ones_and_the_flag_s() -> None:
    from llmpack.cluster.doctor.command import tracking_secrets

    compiled = [({("team-mlflow", "tracking-uri", "MLFLOW_TRACKING_URI"), ("hf", "token", "HF_TOKEN")}, set())]
    assert tracking_secrets(None, compiled) == ["team-mlflow"]
    assert tracking_secrets("llmpack-mlflow", compiled) == ["llmpack-mlflow", "team-mlflow"]
    assert tracking_secrets(None, [(set(), set())]) == ["llmpack-mlflow"]  # nothing compiled says: the default
    assert tracking_secrets("mine", [(set(), set())]) == ["mine"]


@pytest.mark.slow  # a compile of its own
def test_artifacts_compiled_with_another_tracking_secret_are_checked_by_its_name(ready: Ready, tmp_path: Path) -> None:
    """`llmpack compile --tracking-secret team-mlflow`, then doctor without the flag: it checks the Secret the
    pods read (missing here: one line), not the default one the cluster happens to have."""
    from llmpack.compile.artifacts import compile_all
    from llmpack.compile.pod_options import PodOptions

    compile_all(tmp_path, pod=PodOptions.from_flags(tracking_secret="team-mlflow"))
    code, out = ready.doctor("--path", "argo", "--compiled", str(tmp_path))
    assert code == 1, out
    assert [line for line in failed_lines(out) if "team-mlflow" in line] == [
        "✗ Secret team-mlflow missing in llmpack (every pod reads tracking-uri from it)"], out  # once, not twice
    assert "Secret llmpack-mlflow" not in out, out


@pytest.mark.slow  # a compile of its own
def test_a_pipeline_without_a_gpu_step_needs_no_gpu_node(ready: Ready, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 52 (the fourth trial): ``doctor --compiled`` of one's own pipeline without a GPU step checked GPU
    nodes, taints and fit the pipeline never asks for."""
    import sys

    from llmpack.compile.artifacts import compile_all

    (tmp_path / "nogpu_52.py").write_text(
        "import json\nfrom pathlib import Path\n"
        "from components import Dataset, Input, Metrics, Output, pipeline, step\n"
        "from components.steps.prepare_data import prepare_data\n\n\n"
        "@step()\ndef count_rows(dataset: Input[Dataset], counts: Output[Metrics]) -> None:\n"
        "    rows = (Path(dataset.path) / 'train.jsonl').read_text().splitlines()\n"
        "    (Path(counts.path) / 'counts.json').write_text(json.dumps({'train': len(rows)}))\n\n\n"
        "@pipeline(name='no-gpu')\ndef no_gpu(seed: int = 0) -> None:\n"
        "    count_rows(dataset=prepare_data(seed=seed).outputs['dataset'])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nogpu_52", raising=False)
    from nogpu_52 import no_gpu  # type: ignore[import-not-found]

    compile_all(tmp_path / "out", no_gpu())
    code, out = ready.doctor("--path", "argo,mlflow", "--compiled", str(tmp_path / "out"))
    assert "✓ GPU nodes: not needed (no pod of the artifacts in" in out, out
    assert "nvidia.com/gpu" not in out and "GPU node" not in out.replace("GPU nodes: not needed", ""), out


class _Classes:
    """A cluster reader that has one Pending claim and the StorageClasses given."""

    def __init__(self, claim_class: str | None, classes: list[dict]) -> None:
        spec = {"accessModes": ["ReadWriteOnce"]} | ({} if claim_class is None else {"storageClassName": claim_class})
        self.claim = {"metadata": {"name": "data"}, "spec": spec, "status": {"phase": "Pending"}}
        self.classes = classes

    def pvc(self, namespace: str, name: str) -> dict:
        return self.claim

    def cluster_object(self, group: str, version: str, plural: str, name: str) -> dict | None:
        return next((c for c in self.classes if c["metadata"]["name"] == name), None)

    def everywhere(self, group: str, version: str, plural: str, field_selector: str = "") -> list[dict]:
        return self.classes


@pytest.mark.parametrize(("claim_class", "classes", "why"), [
    (None, [], "(no volume yet: the cluster has no StorageClass to provision one, and no PersistentVolume matches it)"),
    ("fast", [], "(no volume yet: the cluster has no StorageClass to provision one"),
    ("fast", [{"metadata": {"name": "nfs"}}], "(no volume yet: there is no StorageClass fast, and no PersistentVolume"),
    (None, [{"metadata": {"name": "nfs"}}], "the claim names no StorageClass and none is the cluster's default"),
    ("nfs", [{"metadata": {"name": "nfs"}, "volumeBindingMode": "Immediate"}],
     "(no volume yet, and its StorageClass nfs binds at once (Immediate): it provisioned none and no Persistent"),
])
def test_a_pending_claim_says_which_storage_class_it_lacks(claim_class: str | None, classes: list[dict],
                                                           why: str) -> None:
    """newcomer5: with no StorageClass at all doctor said "its StorageClass binds at once (Immediate): none matches
    it"; now it says there is none (or none by that name, or no default), and that no PersistentVolume matches."""
    from llmpack.cluster.doctor.gang import shared_pvc

    check = shared_pvc(_Classes(claim_class, classes), "llmpack", "data", shared=False)  # type: ignore[arg-type]
    assert not check.ok and why in check.what, check.what
    if not classes:
        assert "binds at once" not in check.what


def test_a_pending_claim_with_an_available_volume_that_matches_it_says_so() -> None:
    """Trial 8: after doctor's own PersistentVolume fix, doctor still said "no PersistentVolume matches it" (it read
    only the StorageClasses) while the binder took 15-30 s to bind the claim."""
    from llmpack.cluster.doctor.gang import pending_why

    claim = {"metadata": {"name": "llmpack-artifacts"}, "spec": {"storageClassName": "", "accessModes":
                                                                 ["ReadWriteMany"]}}
    pv = {"metadata": {"name": "nfs-artifacts"}, "status": {"phase": "Available"},
          "spec": {"storageClassName": "", "accessModes": ["ReadWriteMany"]}}

    class Reader:
        def __init__(self, volumes: list) -> None:
            self.volumes = volumes

        def everywhere(self, group: str, version: str, plural: str, field_selector: str = "") -> list:
            return self.volumes if plural == "persistentvolumes" else []

    said = pending_why(Reader([pv]), claim)  # type: ignore[arg-type]
    assert said.startswith("no volume yet, though PersistentVolume nfs-artifacts (Available) matches it"), said
    for other in ({**pv, "spec": {**pv["spec"], "accessModes": ["ReadWriteOnce"]}},
                  {**pv, "status": {"phase": "Bound"}}, {**pv, "spec": {**pv["spec"], "storageClassName": "fast"}}):
        assert "no PersistentVolume" in pending_why(Reader([other]), claim)  # type: ignore[arg-type]
