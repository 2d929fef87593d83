"""The MLflow path's compiled Job under the real Job controller, its pods played by kwok.

The Job is the one ``llmpack compile`` writes, filled by MLflow's own backend code, created for
real in a namespace enforcing Pod Security ``restricted``, with its artifacts PVC bound by the
real PV controller. The real scheduler binds its pod to a simulated H100 node; kwok moves it to
Running and then to Succeeded, or, for a pod labelled for kwok's chaos stage, to Failed with
the exit code the test chooses. The real Job controller then applies the compiled
``podFailurePolicy`` and ``backoffLimit``. Only labels and annotations kwok reads are added to
the pod template; the rest is the artifact.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.realcluster.apiserver import make_namespace, wait_until
from tests.realcluster.conftest import RealCluster
from tests.realcluster.test_production_shape import compile_shape, mlflow_job

pytestmark = pytest.mark.cluster

NS = "llmpack-jobs"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"


@pytest.fixture(scope="module")
def compiled_job(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The default compile's MLflow Job for namespace llmpack-jobs, and that namespace made ready for it."""
    from kubernetes import client

    out = tmp_path_factory.mktemp("jobs")
    done = compile_shape(out, "--namespace", NS)
    assert done.returncode == 0, done.stderr
    make_namespace(real_cluster.api, NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    core = client.CoreV1Api(real_cluster.api)
    core.create_namespaced_secret(NS, {"metadata": {"name": "llmpack-mlflow"}, "stringData": {"tracking-uri": "http://m:5000"}})
    core.create_persistent_volume({"metadata": {"name": "jobs-artifacts"},
                                   "spec": {"capacity": {"storage": "50Gi"},
                                            "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                                            "storageClassName": "", "nfs": {"server": "127.0.0.1", "path": "/j"}}})
    job = mlflow_job(out)
    for volume in job["spec"]["template"]["spec"].get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            core.create_namespaced_persistent_volume_claim(NS, {
                "metadata": {"name": claim},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                         "resources": {"requests": {"storage": "1Gi"}}}})
    return job


def _run(real_cluster: RealCluster, job: dict[str, Any], name: str, *, labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None) -> Any:
    """Create a copy of ``job`` named ``name``, its pods carrying kwok's ``labels``/``annotations``; the BatchV1Api."""
    from kubernetes import client

    job = copy.deepcopy(job)
    job["metadata"]["name"] = name
    meta = job["spec"]["template"].setdefault("metadata", {})
    meta.setdefault("labels", {}).update(labels or {})
    meta.setdefault("annotations", {}).update(annotations or {})
    batch = client.BatchV1Api(real_cluster.api)
    batch.create_namespaced_job(NS, job)
    return batch


def _condition(batch: Any, name: str, kind: str) -> Any:
    conditions = batch.read_namespaced_job_status(name, NS).status.conditions or []
    return next((c for c in conditions if c.type == kind and c.status == "True"), None)


def _pods(real_cluster: RealCluster, name: str) -> list[Any]:
    from kubernetes import client

    return client.CoreV1Api(real_cluster.api).list_namespaced_pod(NS, label_selector=f"job-name={name}").items


def test_the_compiled_job_runs_on_an_h100_node_and_completes(real_cluster: RealCluster,
                                                             compiled_job: dict[str, Any]) -> None:
    """Admitted under ``restricted``, scheduled onto a simulated H100 node, Complete by the real Job controller."""
    batch = _run(real_cluster, compiled_job, "llm-finetune-ok")
    complete = wait_until(lambda: _condition(batch, "llm-finetune-ok", "Complete"), timeout_s=90, what="Job Complete")
    assert complete.status == "True"
    (pod,) = _pods(real_cluster, "llm-finetune-ok")
    assert pod.spec.node_name.startswith("h100-") and pod.status.phase == "Succeeded"
    assert batch.read_namespaced_job_status("llm-finetune-ok", NS).status.succeeded == 1


def test_exit_code_1_fails_the_job_at_once_by_its_pod_failure_policy(real_cluster: RealCluster,
                                                                     compiled_job: dict[str, Any]) -> None:
    """A step's bad-input exit (1): the compiled ``FailJob`` rule ends the Job on the first pod, no retry."""
    batch = _run(real_cluster, compiled_job, "llm-finetune-bad", labels={FAIL_LABEL: "true"},
                 annotations={f"{FAIL_LABEL}/exit-code": "1"})
    failed = wait_until(lambda: _condition(batch, "llm-finetune-bad", "Failed"), timeout_s=90, what="Job Failed")
    assert failed.reason == "PodFailurePolicy", (failed.reason, failed.message)
    assert "exit code 1" in failed.message, failed.message
    assert len(_pods(real_cluster, "llm-finetune-bad")) == 1


def test_another_exit_code_is_retried_within_the_backoff_limit(real_cluster: RealCluster,
                                                               compiled_job: dict[str, Any]) -> None:
    """Exit 137 (an OOM kill) matches no rule: the Job controller counts it and starts a new pod (backoffLimit 2)."""
    assert compiled_job["spec"]["backoffLimit"] == 2
    batch = _run(real_cluster, compiled_job, "llm-finetune-oom", labels={FAIL_LABEL: "true"},
                 annotations={f"{FAIL_LABEL}/exit-code": "137"})
    wait_until(lambda: len(_pods(real_cluster, "llm-finetune-oom")) >= 2, timeout_s=90,
               what="a second pod after exit 137")
    status = batch.read_namespaced_job_status("llm-finetune-oom", NS).status
    assert status.failed >= 1 and not _condition(batch, "llm-finetune-oom", "Failed")
