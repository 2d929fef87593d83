"""What ``llmpack cluster doctor`` checks of the Argo backend beyond what every path needs (its :data:`DOCTOR`,
loaded by the lab only): the RBAC its submission needs, its server's version call, and:

* Its compiled Workflow's pods (:func:`compiled_pods`): the pod-level ``securityContext`` and each
  template's container; Argo's own ``init``/``wait`` containers are not in the artifact.
* Its artifact repository (:func:`checks`): the steps pass outputs as artifacts, so a Workflow
  needs a default repository, the namespace's ``artifact-repositories`` ConfigMap (with Argo's
  default annotation) or the controller's ``artifactRepository``, whose namespace is
  ``--argo-controller-namespace`` (docs/first-run-on-a-cluster.md, step 4).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping
from typing import Any

from argo_workflows.backend import ARTIFACT
from components.compiled_pods import PodSpec
from components.doctor_facts import ControllerFact, DoctorCheck, DoctorFacts, DoctorFlag, DoctorReader, VersionProbe

REPOSITORIES = "artifact-repositories"  # Argo's per-namespace default artifact repository ConfigMap
DEFAULT_ANNOTATION = "workflows.argoproj.io/default-artifact-repository"
CONTROLLER_CONFIG = "workflow-controller-configmap"
CONTROLLER_NAMESPACE = DoctorFlag(flag="--argo-controller-namespace", default="argo",
                                  help="Namespace of Argo's workflow-controller-configmap.")
DOCS = "docs/first-run-on-a-cluster.md"


def compiled_pods(docs: list[Any]) -> Iterator[PodSpec]:
    """Each template with a container: the Workflow's pod context under the template's, and its container's."""
    spec = (docs[0] if docs else {}).get("spec") or {}
    pod = dict(spec.get("securityContext") or {})
    host_path = any("hostPath" in (v or {}) for v in spec.get("volumes") or [])
    for template in spec.get("templates") or []:
        container = template.get("container") or template.get("script")
        if container is not None:
            yield PodSpec(f"argo template {template.get('name')}", {**pod, **(template.get("securityContext") or {})},
                          (("main", dict(container.get("securityContext") or {})),), host_path)


def checks(cluster: DoctorReader, namespace: str, flags: Mapping[str, str]) -> list[DoctorCheck]:
    """The artifact repository a Workflow in ``namespace`` uses."""
    controller_namespace = flags.get(CONTROLLER_NAMESPACE.dest) or CONTROLLER_NAMESPACE.default
    return [artifact_repository(cluster, namespace, controller_namespace)]


def artifact_repository(cluster: DoctorReader, namespace: str, controller_namespace: str) -> DoctorCheck:
    """A default artifact repository for the Workflow's artifacts: the namespace's ``artifact-repositories``
    ConfigMap (with its default annotation), else the controller's ``artifactRepository``."""
    fix = f"kubectl -n {shlex.quote(namespace)} apply -f artifact-repositories.yaml  # the ConfigMap of {DOCS}, step 4"
    try:
        repos = cluster.config_map(namespace, REPOSITORIES)
    except cluster.Unanswered as exc:
        return cluster.unread(exc, f"ConfigMap {REPOSITORIES} in {namespace}", namespace)
    if repos is not None:
        key = ((repos.get("metadata") or {}).get("annotations") or {}).get(DEFAULT_ANNOTATION)
        if key and key in (repos.get("data") or {}):
            return DoctorCheck(True, f"Argo artifact repository: {REPOSITORIES} in {namespace} (key {key})")
        return DoctorCheck(False, f"Argo: ConfigMap {REPOSITORIES} in {namespace} names no default repository "
                           f"(annotation {DEFAULT_ANNOTATION} and that data key)", fix)
    try:
        controller = cluster.config_map(controller_namespace, CONTROLLER_CONFIG)
    except cluster.Unanswered:  # the namespace's own ConfigMap was read: its absence is the finding
        controller = None
    if controller is not None and (controller.get("data") or {}).get("artifactRepository"):
        return DoctorCheck(True, f"Argo artifact repository: {CONTROLLER_CONFIG} in {controller_namespace}")
    return DoctorCheck(False, f"Argo has no artifact repository for {namespace} (no ConfigMap {REPOSITORIES} there, "
                       f"no artifactRepository in {controller_namespace}/{CONTROLLER_CONFIG}); the steps pass outputs "
                       "as artifacts", fix)


ARGO_RELEASE = "v3.7.3"  # the Argo release the Workflow is validated against (tools/cluster/crds.json)
ARGO_INSTALL = ("kubectl create namespace argo --dry-run=client -o yaml | kubectl apply -f - && kubectl apply "
                "--server-side -n argo -f https://github.com/argoproj/argo-workflows/releases/download/"
                f"{ARGO_RELEASE}/install.yaml  # Argo Workflows {ARGO_RELEASE}: its CRDs and workflow-controller")

DOCTOR = DoctorFacts(
    controller=ControllerFact("Argo", "workflow-controller", "the Workflow stays Pending, no pod is made", ARGO_INSTALL,
                              "argoproj.io"),
    verbs=(("create", "workflows", "argoproj.io"), ("get", "workflows", "argoproj.io")),
    probe=VersionProbe(what="Argo Server", path="/api/v1/version", field="version", token_env="ARGO_TOKEN",
                       host_env="ARGO_SERVER", service_namespace="argo"),
    pod_artifact=ARTIFACT.as_posix(),
    flags=(CONTROLLER_NAMESPACE,), checks=checks, compiled_pods=compiled_pods)
