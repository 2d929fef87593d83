"""What ``llmpack cluster doctor`` knows of the MLflow backend (its :data:`DOCTOR`, loaded by the lab only): the RBAC
its Job's submission needs, and its compiled Kubernetes Job's pod template."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from components.compiled_pods import PodSpec, pod_specs_in
from components.doctor_facts import DoctorFacts
from mlflow_projects.backend import ARTIFACT_DIR


def compiled_pods(docs: list[Any]) -> Iterator[PodSpec]:
    """The Job template's pod spec (and any inside it), named as the MLflow Job's."""
    spec = ((((docs[0] if docs else {}).get("spec") or {}).get("template") or {}).get("spec")) or {}
    for found in pod_specs_in(spec):
        yield PodSpec(f"mlflow Job {found.where}", found.pod, found.containers, found.host_path)


DOCTOR = DoctorFacts(verbs=(("create", "jobs", "batch"), ("get", "jobs", "batch"), ("delete", "jobs", "batch")),
                     pod_artifact=(ARTIFACT_DIR / "finetune-k8s" / "kubernetes_job_template.yaml").as_posix(),
                     compiled_pods=compiled_pods)
