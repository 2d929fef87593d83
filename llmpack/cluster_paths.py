"""What differs between KFP, Argo and MLflow on a cluster, in one table keyed by backend name.

``llmpack compare --cluster`` treats every path alike except for what is written here: which
option names the compiled file it submits and where ``llmpack compile`` writes it, which options
its ``submit`` and its wait take, where its pods run, whether its pods can be watched before the
submission, and whether it runs the whole pipeline in one pod. Nothing else in
:mod:`llmpack.cluster`, :mod:`llmpack.cluster_session` or :mod:`llmpack.k8s.billing` names a
backend: this is the one place to move behind the backends' own contract later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_NAMESPACE = "llmpack"  # Argo Workflows and the MLflow Job (where Secret llmpack-mlflow lives)
DEFAULT_KFP_POD_NAMESPACE = "kubeflow"  # single-user KFP runs its pods there; multi-user: the profile
ONE_POD_STEP = "main"  # the llmpack.io/step of the pod that runs a whole pipeline (the MLflow Job's)

_TLS = ("ca_cert", "insecure_skip_tls_verify")


@dataclass(frozen=True, kw_only=True)
class ClusterPath:
    """One backend as a ``compare --cluster`` path."""

    name: str
    artifact_option: str  # the submit option that names what it submits
    artifact_path: str  # where `llmpack compile --out DIR` writes it, under DIR
    submit_options: tuple[str, ...]  # options its submit takes (passed to llmpack.submit)
    wait_options: tuple[str, ...]  # those its wait needs too
    own_options: tuple[str, ...] = ()  # options read here, not passed to its submit
    namespace_options: tuple[str, ...] = ("namespace",)  # where its pods run: the first option given...
    namespace_env: str | None = None  # ...else this environment variable...
    default_namespace: str = DEFAULT_NAMESPACE  # ...else this
    watch_before_submit: bool = True  # its pods carry llmpack.io/run-group: watchable before they exist
    one_pod: bool = False  # the whole pipeline in one pod (step ONE_POD_STEP), sized to the largest step
    lends_kubeconfig: bool = False  # its kubeconfig/context is the pod watcher's default

    def pod_namespace(self, conf: Mapping[str, Any]) -> str:
        """Where this path's pods run, given its options."""
        given = next((conf[k] for k in self.namespace_options if conf.get(k)), None)
        return given or (os.environ.get(self.namespace_env) if self.namespace_env else None) or self.default_namespace


PATHS: dict[str, ClusterPath] = {
    "kfp": ClusterPath(
        name="kfp", artifact_option="package_path", artifact_path="kfp_pipelines/finetune.yaml",
        submit_options=("host", "token", "namespace", "experiment", "package_path", "service_account", "pod_namespace",
                        *_TLS),
        wait_options=("host", "token", "namespace", *_TLS),
        own_options=("pod_namespace",),
        namespace_options=("pod_namespace", "namespace"), default_namespace=DEFAULT_KFP_POD_NAMESPACE,
        # KFP pods carry only KFP's pipeline/runid, known once the run is created: watched right after.
        watch_before_submit=False,
    ),
    "argo": ClusterPath(
        name="argo", artifact_option="workflow_path", artifact_path="argo_workflows/finetune.yaml",
        submit_options=("host", "token", "namespace", "workflow_path", "service_account", *_TLS),
        wait_options=("host", "token", "namespace", *_TLS),
        namespace_env="ARGO_NAMESPACE",
    ),
    "mlflow": ClusterPath(
        name="mlflow", artifact_option="project_dir", artifact_path="mlflow_projects/finetune-k8s",
        submit_options=("project_dir", "image", "project_dir_in_image", "namespace", "kubeconfig", "context",
                        "cluster_tracking_uri", *_TLS),
        wait_options=("kubeconfig", "context", "namespace", *_TLS),
        one_pod=True,
        lends_kubeconfig=True,
    ),
}

def runs_in_one_pod(orchestrator: str | None, step: str | None) -> bool:
    """Whether a pod row is a one-pod path's pod that runs the whole pipeline (the MLflow Job's ``main``)."""
    path = PATHS.get(orchestrator or "")
    return path is not None and path.one_pod and step == ONE_POD_STEP
