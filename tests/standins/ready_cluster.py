"""A cluster ready for a first run, planted into the Kubernetes stand-in, and the faults ``llmpack doctor`` finds.

:func:`plant_ready` gives a :class:`~standins.k8s_api.KubeAPIStandIn` what
``docs/first-run-on-a-cluster.md`` says to apply: the namespaces, two GPU nodes (labelled
``nvidia.com/gpu.present=true``, tainted ``nvidia.com/gpu:NoSchedule``, 8 allocatable GPUs), the
MLflow Secret in each run namespace, Argo's artifact repository ConfigMap, the MLflow Job's
``llmpack-artifacts`` PVC, the launcher's RBAC
(``launcher_rbac()``, as ``kubectl apply`` would create it), the ReadWriteMany PVC, Bound, the
``torch-distributed`` ClusterTrainingRuntime and a Kueue LocalQueue; and what the pod-spec flags
name (:data:`POD_FLAGS`: ``--model-pvc``, ``--data-pvc``, ``--hf-token-secret``,
``--image-pull-secret``): the model and data PVCs, the HF token Secret, a registry Secret. :data:`FAULTS` each break
one of them, as a platform team's first attempt might.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

from standins.k8s_api import CLUSTER_TRAINING_RUNTIMES, LOCALQUEUES, LOCALQUEUES_V1BETA2, KubeAPIStandIn, node_object
from standins.k8s_custom import TRAINJOBS, CustomResource

RUN_NAMESPACE, KFP_NAMESPACE, ARGO_NAMESPACE = "llmpack", "kubeflow", "argo"
NAMESPACES = ("default", RUN_NAMESPACE, KFP_NAMESPACE, ARGO_NAMESPACE)
QUEUE, SHARED_PVC, ARTIFACTS_PVC = "team-a", "llmpack-shared", "llmpack-artifacts"
GPU_NODES = ("gpu-node-0", "gpu-node-1")
TRACKING_URI = "http://mlflow.team-a.svc:5000"  # the Secret's value: doctor checks it, never prints it
SECRET_PASSWORD = "mlflow-pass-never-shown-9f3"  # a value doctor reads past and must never print
SIGNING_KEY = "5e" * 32  # the Secret's provenance key: checked present, never printed
WORKFLOWS = CustomResource("argoproj.io", "v1alpha1", "workflows", "Workflow")
DEPLOYMENTS = CustomResource("apps", "v1", "deployments", "Deployment")
STORAGE_CLASSES = CustomResource("storage.k8s.io", "v1", "storageclasses", "StorageClass", namespaced=False)
CLUSTER_QUEUES = CustomResource("kueue.x-k8s.io", "v1beta1", "clusterqueues", "ClusterQueue", namespaced=False)
PRIORITY_CLASSES = CustomResource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False)
# Served on a ready cluster: the kinds the compiled artifacts create (doctor checks them served) and what they name.
EXTRA_CRDS = (LOCALQUEUES, LOCALQUEUES_V1BETA2, CLUSTER_TRAINING_RUNTIMES, TRAINJOBS, WORKFLOWS, DEPLOYMENTS,
              STORAGE_CLASSES, CLUSTER_QUEUES, PRIORITY_CLASSES)
# The controllers that reconcile those kinds: (namespace, Deployment), as their install manifests name them.
CONTROLLERS = {"trainer": ("kubeflow-system", "kubeflow-trainer-controller-manager"),
               "jobset": ("kubeflow-system", "jobset-controller-manager"),
               "kueue": ("kueue-system", "kueue-controller-manager"), "argo": ("argo", "workflow-controller")}
CLUSTER_QUEUE, CLUSTER_QUEUE_GPUS = "gpus", 16  # the LocalQueues' ClusterQueue: room for a 2 x 8 gang
WFFC_CLASS = "standard"  # the default StorageClass, WaitForFirstConsumer (most clouds' default)
PRIORITY_CLASS = "llmpack-training"
MODEL_PVC, DATA_PVC, HF_SECRET, PULL_SECRET = "llmpack-models", "llmpack-data", "hf-token", "regcred"
HF_TOKEN_VALUE = "hf_never-shown-0c4d"  # the token in HF_SECRET: doctor checks the key, never prints it
CKPT_PVC = "llmpack-ckpt"  # --checkpoint-pvc: ReadWriteMany, so a gang resumes from it too
POD_FLAGS = ("--model-pvc", MODEL_PVC, "--data-pvc", DATA_PVC, "--hf-token-secret", HF_SECRET,
             "--image-pull-secret", PULL_SECRET)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def gpu_node(name: str, *, gpus: int = 8, labelled: bool = True,
             taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A GPU node as the NVIDIA GPU operator leaves it: labels, the usual taint, allocatable GPUs."""
    now = time.time() - 3600
    node = node_object(name, created=now, ready=now + 60, instance_type="p5.48xlarge" if labelled else "m5.xlarge",
                       gpu_product="NVIDIA-H100-80GB-HBM3" if labelled else None)
    node["spec"]["taints"] = taints if taints is not None else [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    node["status"]["allocatable"] = {"cpu": "190", "memory": "2000000000Ki", "nvidia.com/gpu": str(gpus)}
    return node


def secret(namespace: str, data: dict[str, str], *, name: str = "llmpack-mlflow",
           kind: str = "Opaque") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": kind,
            "metadata": {"name": name, "namespace": namespace},
            "data": {k: _b64(v) for k, v in data.items()}}


def pvc(namespace: str = RUN_NAMESPACE, *, modes: tuple[str, ...] = ("ReadWriteMany",), phase: str = "Bound",
        name: str = SHARED_PVC) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"accessModes": list(modes), "resources": {"requests": {"storage": "50Gi"}},
                     "storageClassName": "nfs"},
            "status": {"phase": phase, "accessModes": list(modes) if phase == "Bound" else []}}


def deployment(namespace: str, name: str, *, ready: int = 1) -> dict[str, Any]:
    """A controller's Deployment as the deployment controller leaves it (``ready`` replicas ready)."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1}, "status": {"replicas": 1, "readyReplicas": ready, "availableReplicas": ready}}


def cluster_queue(gpus: int = CLUSTER_QUEUE_GPUS) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [{"name": "default", "resources": [
                    {"name": "cpu", "nominalQuota": "512"}, {"name": "memory", "nominalQuota": "4Ti"},
                    {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]}]}]}}


def gpu_pod(node: str, gpus: int = 8, *, name: str = "other-team-train") -> dict[str, Any]:
    """Another team's running pod bound to ``node``, holding ``gpus`` GPUs."""
    res = {"nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "other",
                                                       "resources": {"requests": res, "limits": res}}]},
            "status": {"phase": "Running"}}


def plant_platform(api: KubeAPIStandIn) -> None:
    """What a platform team runs beside the CRDs: the controllers (ready), the StorageClasses, the ClusterQueue."""
    for namespace, name in CONTROLLERS.values():
        api.apply_custom_object(deployment(namespace, name))
    api.apply_custom_object({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                             "metadata": {"name": "nfs"}, "provisioner": "nfs.csi.k8s.io",
                             "volumeBindingMode": "Immediate"})
    api.apply_custom_object({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                             "metadata": {"name": WFFC_CLASS,
                                          "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
                             "provisioner": "ebs.csi.aws.com", "volumeBindingMode": "WaitForFirstConsumer"})
    api.apply_custom_object(cluster_queue())
    api.apply_custom_object({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                             "metadata": {"name": PRIORITY_CLASS}, "value": 1000})


def plant_ready(api: KubeAPIStandIn) -> KubeAPIStandIn:
    """Everything a first run (any path, a 2-node gang with queue ``team-a``) needs, in ``api``."""
    from components.trainjob.launch import launcher_rbac

    api.install(*EXTRA_CRDS)
    for name in NAMESPACES:
        api.add_namespace(name)
    plant_platform(api)
    for name in GPU_NODES:
        api.add_node(gpu_node(name))
    for namespace in (RUN_NAMESPACE, KFP_NAMESPACE):
        api.apply_custom_object(secret(namespace, {"tracking-uri": TRACKING_URI, "username": "runner",
                                                   "password": SECRET_PASSWORD, "signing-key": SIGNING_KEY}))
    api.apply_custom_object({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "artifact-repositories", "namespace": RUN_NAMESPACE,
                     "annotations": {"workflows.argoproj.io/default-artifact-repository": "default"}},
        "data": {"default": "s3: {bucket: llmpack-artifacts, endpoint: s3.amazonaws.com}\n"}})
    for namespace in (RUN_NAMESPACE, KFP_NAMESPACE):  # a gang's launcher works in its pod's namespace: both
        for obj in launcher_rbac():
            obj["metadata"]["namespace"] = namespace
            api.apply_custom_object(obj)
        api.apply_custom_object(pvc(namespace))
        api.apply_custom_object({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                                 "metadata": {"name": QUEUE, "namespace": namespace},
                                 "spec": {"clusterQueue": CLUSTER_QUEUE}})
    api.apply_custom_object(pvc(modes=("ReadWriteOnce",), name=ARTIFACTS_PVC))  # the MLflow Job's artifacts
    for namespace in (RUN_NAMESPACE, KFP_NAMESPACE):  # POD_FLAGS: model and data volumes, HF token, registry login
        api.apply_custom_object(pvc(namespace, modes=("ReadOnlyMany",), name=MODEL_PVC))
        api.apply_custom_object(pvc(namespace, modes=("ReadOnlyMany",), name=DATA_PVC))
        api.apply_custom_object(pvc(namespace, name=CKPT_PVC))
        api.apply_custom_object(secret(namespace, {"token": HF_TOKEN_VALUE}, name=HF_SECRET))
        api.apply_custom_object(secret(namespace, {".dockerconfigjson": '{"auths": {}}'}, name=PULL_SECRET,
                                       kind="kubernetes.io/dockerconfigjson"))
    api.apply_custom_object({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
                             "metadata": {"name": "torch-distributed"},
                             "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}}})
    return api


def _delete(resource: str, namespace: str, name: str) -> Callable[[KubeAPIStandIn], None]:
    return lambda api: api.delete_custom_object(resource, namespace, name)


def _nodes(**node: Any) -> Callable[[KubeAPIStandIn], None]:
    return lambda api: [api.add_node(gpu_node(name, **node)) for name in GPU_NODES]  # replaces them


# name: (what it breaks, how)
FAULTS: dict[str, tuple[str, Callable[[KubeAPIStandIn], Any]]] = {
    "no-namespace": ("the run namespace is missing", lambda api: api.remove_namespace(RUN_NAMESPACE)),
    "rbac-denied": ("you may not create Jobs (the MLflow path)", lambda api: api.forbidden.add("create jobs")),
    "no-gpu-nodes": ("no node is labelled as the compiled GPU type (H100 80GB)", _nodes(labelled=False)),
    "taint-not-tolerated": ("the GPU nodes carry a taint the pods do not tolerate",
                            _nodes(taints=[{"key": "dedicated", "value": "training", "effect": "NoSchedule"}])),
    "no-gpus-allocatable": ("the GPU nodes have no allocatable nvidia.com/gpu (no device plugin)", _nodes(gpus=0)),
    "no-runtime": ("the torch-distributed ClusterTrainingRuntime is missing",
                   _delete("clustertrainingruntimes", "", "torch-distributed")),
    "no-launcher-rbac": ("the launcher's RoleBinding is missing",
                         _delete("rolebindings", RUN_NAMESPACE, "llmpack-launcher")),
    "pvc-rwo": ("the shared PVC is ReadWriteOnce", lambda api: api.apply_custom_object(pvc(modes=("ReadWriteOnce",)))),
    "pvc-pending": ("the shared PVC is Pending", lambda api: api.apply_custom_object(pvc(phase="Pending"))),
    "no-artifacts-pvc": ("the MLflow Job's PVC llmpack-artifacts is missing",
                         _delete("persistentvolumeclaims", RUN_NAMESPACE, ARTIFACTS_PVC)),
    "no-queue": ("the Kueue LocalQueue is missing", _delete("localqueues", RUN_NAMESPACE, QUEUE)),
    "no-secret": ("the MLflow Secret is missing", _delete("secrets", RUN_NAMESPACE, "llmpack-mlflow")),
    "secret-without-uri": ("the MLflow Secret has no tracking-uri",
                           lambda api: api.apply_custom_object(secret(RUN_NAMESPACE, {"username": "runner",
                                                                                      "password": SECRET_PASSWORD}))),
    "secret-without-signing-key": ("the MLflow Secret has no signing-key",
                                   lambda api: api.apply_custom_object(secret(RUN_NAMESPACE, {
                                       "tracking-uri": TRACKING_URI, "username": "runner",
                                       "password": SECRET_PASSWORD}))),
    "no-argo-repository": ("Argo has no artifact repository",
                           _delete("configmaps", RUN_NAMESPACE, "artifact-repositories")),
    "ckpt-pvc-rwo": ("the checkpoint PVC (--checkpoint-pvc) is ReadWriteOnce",
                     lambda api: api.apply_custom_object(pvc(modes=("ReadWriteOnce",), name=CKPT_PVC))),
    "no-model-pvc": ("the model's PVC (--model-pvc) is missing",
                     _delete("persistentvolumeclaims", RUN_NAMESPACE, MODEL_PVC)),
    "data-pvc-pending": ("the data's PVC (--data-pvc) is Pending",
                         lambda api: api.apply_custom_object(pvc(modes=("ReadOnlyMany",), name=DATA_PVC,
                                                                 phase="Pending"))),
    "no-hf-secret": ("the HF token Secret (--hf-token-secret) is missing",
                     _delete("secrets", RUN_NAMESPACE, HF_SECRET)),
    "hf-secret-without-key": ("the HF token Secret has no token key",
                              lambda api: api.apply_custom_object(secret(RUN_NAMESPACE, {"hf": HF_TOKEN_VALUE},
                                                                         name=HF_SECRET))),
    "no-pull-secret": ("the image pull Secret (--image-pull-secret) is missing",
                       _delete("secrets", RUN_NAMESPACE, PULL_SECRET)),
    "psa-restricted": ("the KFP namespace enforces Pod Security restricted",
                       lambda api: api.add_namespace(KFP_NAMESPACE,
                                                     {"pod-security.kubernetes.io/enforce": "restricted"})),
}


def plant_fault(api: KubeAPIStandIn, name: str) -> None:
    """Break what fault ``name`` of :data:`FAULTS` breaks."""
    FAULTS[name][1](api)
