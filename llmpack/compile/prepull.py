"""``llmpack compile --prepull``: a DaemonSet that pulls the step image onto every GPU node ahead of a run.

A multi-GB CUDA image pulled when a GPU pod lands on a fresh node is minutes of spin-up, paid on
every new node (the watcher's ``image_pull_s``). The DaemonSet puts one small pod on every node
the GPU steps may land on (their node selector and tolerations); its init container is the step
image running only ``true``, then the pod idles on the ``pause`` image, so a run's GPU pod finds
the image "already present on machine". No GPU requested, non-root, nothing privileged. Its pods
carry the recommended ``app.kubernetes.io/*`` labels and the user's ``--label``s; its selector
stays the two labels it always had (a selector cannot change).
Why, and the decisions: docs/spinup.md, 'Image pre-pull (`--prepull`)'.

    llmpack compile --prepull --image ghcr.io/your-org/llmpack:0.1.0
    kubectl apply -f build/llmpack/prepull/llmpack-prepull-daemonset.yaml
"""

from __future__ import annotations

import copy
from typing import Any

from components.dsl import Pipeline
from components.gpu_nodes import placement
from components.podspec import PodExtras, pod_labels_of, pull_fields, recommended_labels

PREPULL_FILE = "prepull/llmpack-prepull-daemonset.yaml"
NAME = "llmpack-prepull"
NAMESPACE = "llmpack"
# The idle container, pinned by digest: registry.k8s.io/pause:3.10's multi-arch image index, as the
# registry serves it (`crane digest registry.k8s.io/pause:3.10`; the same digest kubeadm's and
# containerd's configs pin). A tag can be moved; a digest cannot.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a"
RUN_AS_USER = 1000

_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": RUN_AS_USER,
    "capabilities": {"drop": ["ALL"]},
}


def daemonset(pipe: Pipeline, *, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The prepull DaemonSet for the GPU steps of ``pipe`` (every step's image when none uses a GPU)."""
    tasks = pipe.task_order()
    gpu = [t for t in tasks if t.step.execution.resources.gpus > 0] or tasks
    images = list(dict.fromkeys(t.step.execution.image for t in gpu))
    extras = PodExtras()
    for task in gpu:  # --image-pull-policy / --image-pull-secret, as on the step pods (components.podspec)
        extras = extras.merged(task.step.execution.pod)
    pull_pod, _ = pull_fields(extras)
    selector: dict[str, str] = {}
    affinity: dict[str, Any] | None = None
    tolerations: list[dict[str, Any]] = []
    for task in gpu:  # the nodes the GPU steps select (components.gpu_nodes: their GPU type's)
        task_selector, task_affinity = placement(task.step.execution)
        selector.update(task_selector)
        affinity = affinity or task_affinity
        for tol in task.step.execution.tolerations:
            entry = {"key": tol.key, "operator": tol.operator, "effect": tol.effect,
                     **({"value": tol.value} if tol.value is not None else {})}
            if entry not in tolerations:
                tolerations.append(entry)
    # the selector: immutable, never more
    match = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "llmpack"}
    # Every label a step pod has but the run's (the DaemonSet outlives runs: its instance is itself), and the user's.
    labels = pod_labels_of(recommended_labels(name=NAME, component="prepull", managed_by="llmpack", instance=NAME),
                           {}, extras)
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [
            {"name": "pull-step-image" if len(images) == 1 else f"pull-step-image-{n}", "image": image,
             "imagePullPolicy": extras.pull_policy or "IfNotPresent", "command": ["true"],
             "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
             "securityContext": copy.deepcopy(_CONTAINER_SECURITY)}
            for n, image in enumerate(images)
        ],
        "containers": [
            {"name": "idle", "image": PAUSE_IMAGE, "imagePullPolicy": "IfNotPresent",
             "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"cpu": "10m", "memory": "16Mi"}},
             "securityContext": copy.deepcopy(_CONTAINER_SECURITY)}
        ],
        "terminationGracePeriodSeconds": 1,
        **pull_pod,
    }
    if selector:
        pod_spec["nodeSelector"] = selector
    if affinity:
        pod_spec["affinity"] = {"nodeAffinity": affinity}
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": NAME, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "selector": {"matchLabels": dict(match)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


def daemonset_yaml(pipe: Pipeline, *, namespace: str = NAMESPACE) -> str:
    import yaml

    header = ("# Generated by llmpack compile --prepull: pulls the step image onto every GPU node, then idles.\n"
              f"#   kubectl apply -f prepull/llmpack-prepull-daemonset.yaml   (namespace {namespace} must exist)\n")
    return header + yaml.safe_dump(daemonset(pipe, namespace=namespace), sort_keys=False)
