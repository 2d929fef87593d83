"""The compiled TrainJob admitted, or kept waiting, by the REAL Kueue v0.17.0 from its LocalQueue and ClusterQueue.

A control plane of this module's own (``LLMPACK_CLUSTER_CONTROLLERS=jobset,trainer,kueue``): Kueue's
controller manager built from ``tools/cluster/kueue/go.mod``'s pins with its TrainJob integration,
CRDs, RBAC and webhooks, beside the real Trainer and JobSet controllers. What ``llmpack compile
--nodes 2 --gpus 8 --gpu-type h100 --queue Q`` writes is created as a user applies it: Kueue's
webhook suspends it and Kueue makes its Workload (2 pods of 8 GPUs: 16), and

- from a ClusterQueue of 16 GPUs (a ResourceFlavor of the H100 nodes' label) Kueue admits it: the
  Workload ``Admitted``, the TrainJob unsuspended with the flavor's node label (Kueue's runtime
  patch), Trainer's JobSet running and its 2 pods bound to H100 nodes;
- from a ClusterQueue of 8 GPUs it is never admitted: Kueue's own reason and message, and the
  TrainJob stays suspended (Trainer's JobSet of it too): no pod.
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

NS = "ml-kueue"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
FLAGS = ("--nodes", "2", "--gpus", "8", "--gpu-type", "h100", "--cache-pvc", "llmpack-cache", "--namespace", NS)


def _built(flag: str) -> None:
    env = {**os.environ, "GO": _go() or "go"}
    mode = [] if os.environ.get("LLMPACK_CLUSTER_BUILD") == "1" else ["--cached"]
    built = subprocess.run([str(TOOLS / "build.sh"), flag, *mode], capture_output=True, text=True, env=env,
                           timeout=7200)
    if built.returncode != 0:
        pytest.skip(f"build.sh {flag}: {built.stderr.strip().splitlines()[-1]}")


@pytest.fixture(scope="module")
def kueue_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A control plane with JobSet, Trainer and Kueue running (skips where they are not built)."""
    _built("--controllers")
    _built("--kueue")
    with started_cluster(tmp_path_factory.mktemp("kueuecluster") / "state",
                         settings={"LLMPACK_CLUSTER_CONTROLLERS": "jobset,trainer,kueue"}) as cluster:
        yield cluster


def _custom(api: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api)


def _made(answer: Any) -> None:
    assert answer.status == 201, answer


@pytest.fixture(scope="module")
def queues(kueue_cluster: RealCluster) -> str:
    """Namespace ``ml-kueue`` (its cache claim Bound), a ResourceFlavor of the H100 nodes, ClusterQueues of 16 and
    of 8 GPUs, and a LocalQueue on each (``team-a``, ``team-small``)."""
    from kubernetes import client

    api = kueue_cluster.api
    core = client.CoreV1Api(api)
    make_namespace(api, NS, {"pod-security.kubernetes.io/enforce": "restricted",
                             "pod-security.kubernetes.io/enforce-version": "latest"})
    core.create_persistent_volume({"metadata": {"name": "kueue-cache"},
                                   "spec": {"capacity": {"storage": "5Ti"}, "accessModes": ["ReadWriteMany"],
                                            "storageClassName": "", "nfs": {"server": "127.0.0.1", "path": "/c"}}})
    core.create_namespaced_persistent_volume_claim(NS, {
        "metadata": {"name": "llmpack-cache"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "resources": {"requests": {"storage": "5Ti"}}}})
    wait_until(lambda: core.read_namespaced_persistent_volume_claim("llmpack-cache", NS).status.phase == "Bound",
               timeout_s=60, what="PVC llmpack-cache Bound")
    # Kueue's webhooks judge these (the ResourceFlavor's and ClusterQueue's defaulting and validation)
    _made(create(api, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                       "metadata": {"name": "h100"},
                       "spec": {"nodeLabels": {"nvidia.com/gpu.product": GPU_PRODUCT}}}, dry_run=False))
    for name, gpus in (("gpu-h100", 16), ("gpu-small", 8)):
        _made(create(api, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
                           "spec": {"namespaceSelector": {},
                                    "resourceGroups": [{
                                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                        "flavors": [{"name": "h100", "resources": [
                                            {"name": "cpu", "nominalQuota": "384"},
                                            {"name": "memory", "nominalQuota": "4Ti"},
                                            {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]}]}]}},
                     dry_run=False))
    for local, cluster_queue in (("team-a", "gpu-h100"), ("team-small", "gpu-small")):
        _made(create(api, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": local},
                           "spec": {"clusterQueue": cluster_queue}}, namespace=NS, dry_run=False))

    def active(name: str) -> bool:
        cq = _custom(api).get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", name)
        return any(c["type"] == "Active" and c["status"] == "True"
                   for c in (cq.get("status") or {}).get("conditions") or [])

    for name in ("gpu-h100", "gpu-small"):
        wait_until(lambda name=name: active(name), timeout_s=60, what=f"ClusterQueue {name} Active")
    return NS


def _trainjob(tmp_path: Path, name: str, queue: str, api: Any) -> dict[str, Any]:
    """The compiled TrainJob renamed ``name`` in LocalQueue ``queue``, its launcher RBAC applied as a user does."""
    done = compile_shape(tmp_path, *FLAGS, "--queue", queue)
    assert done.returncode == 0, done.stderr
    for doc in yaml.safe_load_all((tmp_path / "trainjob" / "launcher-rbac.yaml").read_text()):
        if doc:
            made = create(api, doc, namespace=NS, dry_run=False)
            assert made.status in (201, 409), made
    (job,) = [d for d in yaml.safe_load_all((tmp_path / "trainjob" / "finetune-trainjob.yaml").read_text()) if d]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == queue, job["metadata"]["labels"]
    job["metadata"]["name"] = name
    return job


def _workload(api: Any, trainjob: str) -> dict[str, Any] | None:
    """Kueue's Workload of TrainJob ``trainjob`` (owned by it), or None yet."""
    items = _custom(api).list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", NS, "workloads")["items"]
    mine = [w for w in items if any(o["kind"] == "TrainJob" and o["name"] == trainjob
                                    for o in w["metadata"].get("ownerReferences") or [])]
    return mine[0] if mine else None


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def _get_trainjob(api: Any, name: str) -> dict[str, Any]:
    return _custom(api).get_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", name)


def test_kueue_admits_the_compiled_trainjob_from_its_queue(kueue_cluster: RealCluster, queues: str,
                                                           tmp_path: Path) -> None:
    """16 GPUs asked of a ClusterQueue of 16: Workload Admitted, TrainJob unsuspended, JobSet made by Trainer."""
    api = kueue_cluster.api
    job = _trainjob(tmp_path, "kueue-fits", "team-a", api)
    answer = create(api, job, namespace=queues, dry_run=False)
    assert answer.status == 201, answer
    # Kueue's mutating webhook suspended it at creation (the compiled object does not ask for it)
    assert answer.body["spec"].get("suspend") is True, answer.body["spec"]

    def admitted() -> dict[str, Any] | None:
        wl = _workload(api, "kueue-fits")
        return wl if wl and _condition(wl, "Admitted").get("status") == "True" else None

    wl = wait_until(admitted, timeout_s=90, what="Kueue's Workload of kueue-fits Admitted")
    assert wl["spec"]["queueName"] == "team-a", wl["spec"]
    (pod_set,) = wl["spec"]["podSets"]
    assert pod_set["count"] == 2, pod_set
    admission = wl["status"]["admission"]
    assert admission["clusterQueue"] == "gpu-h100", admission
    (assignment,) = admission["podSetAssignments"]
    assert assignment["flavors"]["nvidia.com/gpu"] == "h100", assignment
    assert assignment["resourceUsage"]["nvidia.com/gpu"] == "16", assignment

    trainjob = wait_until(lambda: (tj := _get_trainjob(api, "kueue-fits"))["spec"].get("suspend") is False and tj,
                          timeout_s=60, what="TrainJob kueue-fits unsuspended by Kueue")
    # Kueue's runtime patch: the flavor's node label for the node pods
    kueue_patches = [p for p in trainjob["spec"].get("runtimePatches") or []
                     if p["manager"] == "kueue.x-k8s.io/manager"]
    assert GPU_PRODUCT in yaml.safe_dump(kueue_patches), trainjob["spec"].get("runtimePatches")
    jobset = wait_until(lambda: (js := _jobset(api, "kueue-fits")) and js["spec"].get("suspend") is not True and js,
                        timeout_s=60, what="Trainer's JobSet of kueue-fits, running")
    assert jobset["metadata"]["ownerReferences"][0]["kind"] == "TrainJob", jobset["metadata"]
    from kubernetes import client

    core = client.CoreV1Api(api)

    def bound() -> list[Any]:
        pods = core.list_namespaced_pod(NS, label_selector="jobset.sigs.k8s.io/jobset-name=kueue-fits").items
        return pods if len(pods) == 2 and all(p.spec.node_name for p in pods) else []

    pods = wait_until(bound, timeout_s=90, what="kueue-fits' 2 pods bound by the scheduler")
    for pod in pods:  # on the flavor's nodes, as Kueue's patch asks
        assert pod.spec.node_selector.get("nvidia.com/gpu.product") == GPU_PRODUCT, pod.spec.node_selector
        assert core.read_node(pod.spec.node_name).metadata.labels["nvidia.com/gpu.product"] == GPU_PRODUCT


def _jobset(api: Any, name: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return _custom(api).get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NS, "jobsets", name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def test_a_clusterqueue_too_small_keeps_the_trainjob_pending(kueue_cluster: RealCluster, queues: str,
                                                            tmp_path: Path) -> None:
    """16 GPUs asked of a ClusterQueue of 8: the Workload gets no quota (Kueue's reason and message), the TrainJob
    stays suspended (its JobSet too), no pod is made."""
    import time

    api = kueue_cluster.api
    job = _trainjob(tmp_path, "kueue-too-big", "team-small", api)
    answer = create(api, job, namespace=queues, dry_run=False)
    assert answer.status == 201, answer

    def judged() -> dict[str, Any] | None:
        wl = _workload(api, "kueue-too-big")
        return wl if wl and _condition(wl, "QuotaReserved").get("message") else None

    wl = wait_until(judged, timeout_s=90, what="Kueue's verdict on kueue-too-big's Workload")
    reserved = _condition(wl, "QuotaReserved")
    assert (reserved["status"], reserved["reason"]) == ("False", "Pending"), reserved
    assert reserved["message"] == (  # Kueue v0.17.0's words
        "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu in flavor h100, previously "
        "considered podsets requests (0) + current podset request (16) > maximum capacity (8)"), reserved["message"]
    time.sleep(5)  # and it stays so: no admission, no JobSet, still suspended
    wl = _workload(api, "kueue-too-big") or {}
    assert _condition(wl, "Admitted").get("status") != "True", wl.get("status")
    assert _get_trainjob(api, "kueue-too-big")["spec"].get("suspend") is True
    # Trainer renders a suspended TrainJob into a suspended JobSet: nothing runs
    assert (_jobset(api, "kueue-too-big") or {}).get("spec", {}).get("suspend") is True
    from kubernetes import client

    pods = client.CoreV1Api(api).list_namespaced_pod(NS, label_selector="jobset.sigs.k8s.io/jobset-name=kueue-too-big")
    assert pods.items == [], [p.metadata.name for p in pods.items]
    cq = _custom(api).get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", "gpu-small")
    assert cq["status"].get("pendingWorkloads") == 1, cq["status"]
