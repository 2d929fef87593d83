"""The review's cases, refused by the real components in their old shape and accepted (and scheduled) as compiled now.

Here: Trainer v2.2.0's own TrainJob CRD refuses the old TrainJob (``terminationGracePeriodSeconds``
from the checkpoint volume, as compile wrote it before ``--trainer-version``) and accepts
``--trainer-version 2.2``'s; ``--gpus 8 --model-pvc m`` as compiled now (the model beside, not over,
the GPU pod's ``/dev/shm``) is created for real under ``restricted``, its pod made by the Job
controller and bound to an H100 node by the scheduler. The other halves live in
``test_production_shape`` (the old duplicate mount refused by pod validation; compile refusing
``--checkpoint-pvc`` beside ``--trainer-version 2.2``), ``test_doctor_real`` and
``test_nodes_and_scheduling`` (a pod larger than any node) and ``test_gang_controllers`` (the v2.3
gang scheduled: two 8-GPU pods, 64 CPUs and 512Gi each). Where each half lives:
docs/internals/real-cluster.md, "Which tests use it" (``test_refused_then_accepted.py``).
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
