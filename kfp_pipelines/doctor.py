"""What ``llmpack cluster doctor`` knows of the KFP backend (its :data:`DOCTOR`, loaded by the lab only): its
server's version call, and its compiled pipeline's executors' security contexts.

The pods are in the platform spec (kfp-kubernetes' ``deploymentSpec.executors``); KFP's own driver
and launcher containers are not in the artifact and are not judged.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from components.compiled_pods import PodSpec
from components.doctor_facts import DoctorFacts, VersionProbe
from kfp_pipelines.backend import ARTIFACT, DEFAULT_POD_NAMESPACE


def compiled_pods(docs: list[Any]) -> Iterator[PodSpec]:
    """Each executor of the platform spec, its container's ``securityContext`` (KFP sets no pod-level one)."""
    platform = next((d for d in docs if isinstance(d, dict) and "platforms" in d), {})
    kubernetes = (platform.get("platforms") or {}).get("kubernetes") or {}
    executors = (kubernetes.get("deploymentSpec") or {}).get("executors") or {}
    for name, executor in sorted(executors.items()):
        context = dict(executor.get("securityContext") or {})  # kfp-kubernetes: the executor container's
        yield PodSpec(f"kfp {name}", {}, (("main", context),))


DOCTOR = DoctorFacts(  # KFP submits through its API server: no verbs of its own in the run's namespace
    probe=VersionProbe(what="KFP API", path="/apis/v2beta1/healthz", field="tag_name", token_env="KFP_TOKEN",
                       host_env="KFP_HOST", scheme="http", service_namespace=DEFAULT_POD_NAMESPACE),
    pod_artifact=ARTIFACT.as_posix(), compiled_pods=compiled_pods)
