"""The review's cases, refused by the real components in their old shape and accepted (and scheduled) as compiled now.

Where each half lives:

- Trainer v2.2 and ``terminationGracePeriodSeconds``: here, both halves against Trainer v2.2.0's
  own TrainJob CRD. The old shape is what compile wrote for every cluster before
  ``--trainer-version`` (the production shape, checkpoint volume and its grace period
  included); now ``--trainer-version 2.2`` leaves the grace period out (and refuses
  ``--checkpoint-pvc`` beside it: ``test_production_shape``). The v2.3 TrainJob running as a
  gang through the real Trainer and JobSet controllers: ``test_gang_controllers``.
- A duplicate mount path: the old shape (``--gpus 8 --model-pvc m:/dev/shm``, the model over the
  GPU pod's ``/dev/shm``) refused by pod validation in ``test_production_shape``
  (``test_the_server_refuses_what_compile_now_refuses``); here the half after: ``--gpus 8
  --model-pvc m`` as compiled now, its Job created for real under ``restricted``, its pod made by
  the Job controller and bound to an H100 node by the scheduler.
- A pod larger than any node: ``test_doctor_real`` (the scheduler's ``Insufficient cpu`` and
  ``Insufficient memory`` for a pod of the compiled size on too-small nodes, beside doctor's ✗
  line that used to be ✓) and ``test_nodes_and_scheduling``; the compiled pods scheduled on
  nodes that hold them: ``test_gang_controllers`` (two 8-GPU pods, 64 CPUs and 512Gi each) and
  the mount case here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realcluster import crds
from tests.realcluster.apiserver import create, make_namespace, wait_until
from tests.realcluster.conftest import RealCluster
from tests.realcluster.test_production_shape import PRODUCTION_FLAGS, TRAINER_22_FLAGS, compile_shape, mlflow_job

pytestmark = pytest.mark.cluster

NS = "ml-before-after"
GRACE_FIELD = ("spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template"
               ".spec.terminationGracePeriodSeconds")


@pytest.fixture(scope="module")
def namespace(real_cluster: RealCluster) -> str:
    """A namespace enforcing Pod Security ``restricted``."""
    return make_namespace(real_cluster.api, NS, {"pod-security.kubernetes.io/enforce": "restricted",
                                                 "pod-security.kubernetes.io/enforce-version": "latest"})


def _trainjob(out: Path) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((out / "trainjob" / "finetune-trainjob.yaml").read_text()) if d]
    doc["metadata"]["namespace"] = NS
    return doc


def _flags(flags: tuple[str, ...]) -> tuple[str, ...]:
    """The production flags with this module's namespace."""
    out = list(flags)
    out[out.index("--namespace") + 1] = NS
    return tuple(out)


def test_trainer_22_refuses_the_old_trainjob_and_accepts_the_one_compiled_for_it(real_cluster: RealCluster,
                                                                                 namespace: str,
                                                                                 tmp_path: Path) -> None:
    """Trainer v2.2.0's CRD, strict: the old shape's grace period is an unknown field; ``--trainer-version 2.2``'s
    TrainJob of the same production shape (no checkpoint volume) is accepted."""
    old, new = tmp_path / "old", tmp_path / "new"
    assert compile_shape(old, *_flags(PRODUCTION_FLAGS)).returncode == 0
    assert compile_shape(new, *_flags(TRAINER_22_FLAGS)).returncode == 0
    before, after = _trainjob(old), _trainjob(new)
    assert "terminationGracePeriodSeconds" in yaml.safe_dump(before) and "terminationGracePeriodSeconds" not in (
        yaml.safe_dump(after))
    crds.install(real_cluster.api, "trainer-v2.2")
    refused = create(real_cluster.api, before, namespace=namespace)
    assert refused.status == 400, refused
    assert f'unknown field "{GRACE_FIELD}"' in refused.message, refused.message
    accepted = create(real_cluster.api, after, namespace=namespace)
    assert accepted.status == 201, accepted
    # and v2.3.0's CRD, the default target, takes the old shape as it is
    crds.install(real_cluster.api, "trainer-v2.3")
    assert create(real_cluster.api, before, namespace=namespace).status == 201


def test_the_model_claim_compiled_now_is_scheduled_on_a_gpu_node(real_cluster: RealCluster, namespace: str,
                                                                 tmp_path: Path) -> None:
    """``--gpus 8 --model-pvc llmpack-models`` as compiled now: the Job created for real, its pod made by the Job
    controller with the model at its own path beside ``/dev/shm``, bound to an H100 node by the scheduler."""
    from kubernetes import client

    done = compile_shape(tmp_path, "--gpus", "8", "--gpu-type", "h100", "--model-pvc", "llmpack-models",
                         "--namespace", NS)
    assert done.returncode == 0, done.stderr
    core, batch = client.CoreV1Api(real_cluster.api), client.BatchV1Api(real_cluster.api)
    for claim, mode, size in (("llmpack-models", "ReadOnlyMany", "1Ti"),
                              ("llmpack-artifacts", "ReadWriteOnce", "50Gi")):
        core.create_persistent_volume({"metadata": {"name": f"before-after-{claim}"},
                                       "spec": {"capacity": {"storage": size}, "accessModes": [mode],
                                                "storageClassName": "",
                                                "nfs": {"server": "127.0.0.1", "path": f"/{claim}"}}})
        core.create_namespaced_persistent_volume_claim(NS, {
            "metadata": {"name": claim},
            "spec": {"accessModes": [mode], "storageClassName": "", "volumeName": f"before-after-{claim}",
                     "resources": {"requests": {"storage": size}}}})
        wait_until(lambda c=claim: core.read_namespaced_persistent_volume_claim(c, NS).status.phase == "Bound",
                   timeout_s=60, what=f"PVC {claim} Bound by the PV controller")
    job = mlflow_job(tmp_path)
    mounts = job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    paths = [m["mountPath"] for m in mounts]
    assert len(paths) == len(set(paths)) and "/dev/shm" in paths, paths
    answer = create(real_cluster.api, job, namespace=namespace, dry_run=False)
    assert answer.status == 201, answer
    name = answer.body["metadata"]["name"]

    def bound() -> Any:
        pods = core.list_namespaced_pod(NS, label_selector=f"job-name={name}").items
        return pods[0] if pods and pods[0].spec.node_name else None

    try:
        pod = wait_until(bound, timeout_s=90, what=f"the pod of Job {name} bound by the scheduler")
    except AssertionError as err:
        pods = core.list_namespaced_pod(NS, label_selector=f"job-name={name}").items
        raise AssertionError(f"{err}: {[(p.metadata.name, p.status.conditions) for p in pods]}") from None
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3", node.metadata.labels
    claims = sorted(v.persistent_volume_claim.claim_name for v in pod.spec.volumes if v.persistent_volume_claim)
    assert claims == ["llmpack-artifacts", "llmpack-models"], claims
    batch.delete_namespaced_job(name, NS, propagation_policy="Background")
