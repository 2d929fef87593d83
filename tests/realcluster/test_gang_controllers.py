"""The compiled 2-node TrainJob through the real Trainer and JobSet controllers, down to pods on two GPU nodes.

A control plane of this module's own (``up.sh`` with ``LLMPACK_CLUSTER_CONTROLLERS=jobset,trainer``):
the session's cluster swaps Trainer's CRD between v2.2 and v2.3 and deletes it for doctor's
faults, which a running Trainer controller must not see. On it, Kubeflow Trainer v2.3.0's and
JobSet v0.12.0's controller managers, built from their pinned modules, with their own RBAC and
their webhooks registered by URL (``tools/cluster/controllers.sh``).

What ``llmpack compile --nodes 2 --gpus 8 --gpu-type h100`` writes is created as a user applies it,
in a namespace enforcing Pod Security ``restricted``: Trainer's defaulting and validating webhooks
admit the TrainJob, the Trainer controller renders it with the torch-distributed
ClusterTrainingRuntime and the artifact's ``runtimePatches`` into a JobSet, the JobSet controller
makes its Job, the Job controller its two pods (admitted by ``restricted``), the scheduler binds
them to two different kwok H100 nodes (8 GPUs each: one pod per node), kwok runs them to the end,
and completion climbs back up: Job Complete, JobSet Completed, TrainJob Complete.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realcluster.apiserver import create, make_namespace, wait_until
from tests.realcluster.conftest import TOOLS, RealCluster, _go, started_cluster
from tests.realcluster.test_production_shape import compile_shape

pytestmark = pytest.mark.cluster

NS = "ml-gang"
GANG_FLAGS = ("--nodes", "2", "--gpus", "8", "--gpu-type", "h100", "--cache-pvc", "llmpack-cache",
              "--namespace", NS)


@pytest.fixture(scope="module")
def gang_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A control plane with the JobSet and Trainer controllers running (skips where they are not built)."""
    env = {**os.environ, "GO": _go() or "go"}
    mode = [] if os.environ.get("LLMPACK_CLUSTER_BUILD") == "1" else ["--cached"]
    built = subprocess.run([str(TOOLS / "build.sh"), "--controllers", *mode], capture_output=True, text=True, env=env,
                           timeout=7200)
    if built.returncode != 0:
        pytest.skip(f"JobSet/Trainer controllers not built: {built.stderr.strip().splitlines()[-1]}")
    with started_cluster(tmp_path_factory.mktemp("gangcluster") / "state",
                         settings={"LLMPACK_CLUSTER_CONTROLLERS": "jobset,trainer"}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def gang_ns(gang_cluster: RealCluster) -> str:
    """Namespace ``ml-gang`` under ``restricted``, with the shared cache PVC Bound (ReadWriteMany) by the PV
    controller."""
    from kubernetes import client

    core = client.CoreV1Api(gang_cluster.api)
    make_namespace(gang_cluster.api, NS, {"pod-security.kubernetes.io/enforce": "restricted",
                                          "pod-security.kubernetes.io/enforce-version": "latest"})
    core.create_persistent_volume({"metadata": {"name": "gang-cache"},
                                   "spec": {"capacity": {"storage": "5Ti"}, "accessModes": ["ReadWriteMany"],
                                            "storageClassName": "", "nfs": {"server": "127.0.0.1", "path": "/c"}}})
    core.create_namespaced_persistent_volume_claim(NS, {
        "metadata": {"name": "llmpack-cache"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "resources": {"requests": {"storage": "5Ti"}}}})
    wait_until(lambda: core.read_namespaced_persistent_volume_claim("llmpack-cache", NS).status.phase == "Bound",
               timeout_s=60, what="PVC llmpack-cache Bound by the PV controller")
    return NS


def _trainjob(out: Path) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((out / "trainjob" / "finetune-trainjob.yaml").read_text()) if d]
    return doc


def _custom(api: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api)


def _condition(obj: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def test_controllers_serve_their_webhooks(gang_cluster: RealCluster) -> None:
    """Trainer's and JobSet's webhooks are registered by URL on loopback, and the runtime llmpack names is served."""
    hooks = gang_cluster.kubectl("get", "validatingwebhookconfigurations,mutatingwebhookconfigurations",
                                 "-o", "jsonpath={range .items[*]}{.metadata.name}{' '}"
                                 "{.webhooks[0].clientConfig.url}{'\\n'}{end}")
    names = dict(line.split(" ", 1) for line in hooks.stdout.splitlines() if line)
    assert {"llmpack-jobset-validating-webhook-configuration", "llmpack-jobset-mutating-webhook-configuration",
            "llmpack-trainer-validating-webhook-configuration",
            "llmpack-trainer-mutating-webhook-configuration"} <= set(names), names
    assert all(url.startswith("https://127.0.0.1:") for url in names.values()), names
    runtime = _custom(gang_cluster.api).get_cluster_custom_object("trainer.kubeflow.org", "v1alpha1",
                                                                  "clustertrainingruntimes", "torch-distributed")
    assert runtime["spec"]["mlPolicy"]["torch"] == {}, runtime["spec"]


def test_trainers_webhook_refuses_what_its_crd_admits(gang_cluster: RealCluster, gang_ns: str, tmp_path: Path) -> None:
    """The real validating webhook judges TrainJobs: one naming a runtime that does not exist passes the CRD's
    schema (a dry run without the webhook cannot tell) and is refused by Trainer's webhook."""
    done = compile_shape(tmp_path, *GANG_FLAGS)
    assert done.returncode == 0, done.stderr
    job = _trainjob(tmp_path)
    job["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    answer = create(gang_cluster.api, job, namespace=gang_ns)
    assert answer.status in (400, 403, 422), answer
    assert ('admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request'
            in answer.message), answer.message
    assert "no-such-runtime" in answer.message, answer.message


def test_compiled_trainjob_runs_as_a_gang_through_the_real_controllers(gang_cluster: RealCluster, gang_ns: str,
                                                                       tmp_path: Path) -> None:
    """TrainJob -> JobSet (Trainer) -> Job (JobSet) -> 2 pods (Job controller) on 2 H100 nodes (scheduler) ->
    Complete."""
    from kubernetes import client

    done = compile_shape(tmp_path, *GANG_FLAGS)
    assert done.returncode == 0, done.stderr
    job = _trainjob(tmp_path)
    name = job["metadata"]["name"]
    # As a user applies it first: the launcher's Role and the accounts (the node pods run as llmpack-trainer)
    for doc in yaml.safe_load_all((tmp_path / "trainjob" / "launcher-rbac.yaml").read_text()):
        if doc:
            made_rbac = create(gang_cluster.api, doc, namespace=gang_ns, dry_run=False)
            assert made_rbac.status in (201, 409), made_rbac  # 409: the module's other test made it
    answer = create(gang_cluster.api, job, namespace=gang_ns, dry_run=False)
    assert answer.status == 201, answer
    custom, core, batch = (_custom(gang_cluster.api), client.CoreV1Api(gang_cluster.api),
                           client.BatchV1Api(gang_cluster.api))

    def jobset() -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", gang_ns, "jobsets", name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    made = wait_until(jobset, timeout_s=60, what=f"the Trainer controller's JobSet {name}")
    owners = made["metadata"].get("ownerReferences") or []
    assert [(o["kind"], o["name"], o.get("controller")) for o in owners] == [("TrainJob", name, True)], owners
    (replicated,) = made["spec"]["replicatedJobs"]
    template = replicated["template"]["spec"]
    assert (replicated["name"], template["parallelism"], template["completions"]) == ("node", 2, 2), replicated
    pod_spec = template["template"]["spec"]
    (container,) = [c for c in pod_spec["containers"] if c["name"] == "node"]
    assert container["image"] == job["spec"]["trainer"]["image"], container["image"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8", container["resources"]
    # the artifact's runtimePatches reached the pods: the shared claim, the toleration, the restricted context
    assert {"name": "llmpack-shared", "persistentVolumeClaim": {"claimName": "llmpack-cache"}} in pod_spec["volumes"]
    assert pod_spec["securityContext"]["runAsNonRoot"] is True, pod_spec["securityContext"]

    jobs = wait_until(lambda: batch.list_namespaced_job(
                          gang_ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items,
                      timeout_s=60, what="the JobSet controller's Job")
    assert len(jobs) == 1 and jobs[0].metadata.owner_references[0].kind == "JobSet", jobs

    def bound() -> list[Any]:
        pods = core.list_namespaced_pod(gang_ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items
        return pods if len(pods) == 2 and all(p.spec.node_name for p in pods) else []

    pods = wait_until(bound, timeout_s=90, what="the Job controller's 2 pods bound by the scheduler")
    nodes = {p.spec.node_name for p in pods}
    assert len(nodes) == 2, f"one 8-GPU pod per H100 node, got {nodes}"
    for node_name in nodes:
        node = core.read_node(node_name)
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3", node.metadata.labels
        assert node.metadata.annotations.get("kwok.x-k8s.io/node") == "fake", node.metadata.annotations
    assert all(p.metadata.owner_references[0].kind == "Job" for p in pods)
    # torchrun's rendezvous env from Trainer's torch plugin, per pod
    env = {e.name: e.value for e in pods[0].spec.containers[0].env or []}
    assert env.get("PET_NNODES") == "2" and env.get("PET_NPROC_PER_NODE") == "8", env

    def complete() -> dict[str, Any] | None:
        trainjob = custom.get_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", gang_ns, "trainjobs", name)
        return trainjob if _condition(trainjob, "Complete") else None

    final = wait_until(complete, timeout_s=120, what=f"TrainJob {name} Complete (kwok completes the pods)")
    assert _condition(jobset() or {}, "Completed"), (jobset() or {}).get("status")
    assert batch.read_namespaced_job(jobs[0].metadata.name, gang_ns).status.succeeded == 2
    assert not _condition(final, "Failed"), final["status"]
