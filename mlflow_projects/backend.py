"""The MLflow Projects backend, declared once (:mod:`components.backend`): ``llmpack`` finds it by name ``mlflow``.

Compiles to MLproject directories (:mod:`mlflow_projects.compiler`), runs them with ``mlflow run``
(:mod:`mlflow_projects.local`), submits the Kubernetes Job MLflow's Kubernetes backend would create
(:mod:`mlflow_projects.submit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.backend import (
    TLS_OPTIONS,
    ClickOption,
    ClusterBackend,
    ClusterPath,
    Coloured,
    CompareOption,
    Connection,
    LabFacts,
    PodMarks,
    pod_labels,
)
from components.dsl import Pipeline
from mlflow_projects.settings import IMAGE, SOURCE

ARTIFACT_DIR = Path("mlflow_projects")
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
RUN_ID_ENV = "MLFLOW_RUN_ID"  # the prefix of the Job's container variable that names MLflow's run


@dataclass(frozen=True, kw_only=True)
class MlflowConnection(Connection):
    """A Kubernetes cluster by kubeconfig (``--kubeconfig``, else ``KUBECONFIG``, else in-cluster) and context."""

    kubeconfig: str | None = None
    context: str | None = None


class MlflowBackend(Coloured, LabFacts, ClusterBackend):
    name = "mlflow"
    settings = (IMAGE, SOURCE)
    env_vars = ("MLFLOW_TRACKING_URI", "KUBECONFIG", "KUBE_MLFLOW_TRACKING_URI")
    colour = "#2ca02c"  # its colour in the report's charts
    artifacts = (ARTIFACT_DIR / "finetune", ARTIFACT_DIR / "finetune-k8s")
    submit_help = "Create the MLflow run and its Kubernetes Job from the compiled finetune-k8s project."
    local_module = "mlflow_projects.local"
    cluster_module = "mlflow_projects.submit"
    connection_type = MlflowConnection
    cluster_path = ClusterPath(
        name="mlflow", artifact_option="project_dir", artifact_path=(ARTIFACT_DIR / "finetune-k8s").as_posix(),
        submit_options=("project_dir", "image", "project_dir_in_image", "namespace", "kubeconfig", "context",
                        "cluster_tracking_uri", *TLS_OPTIONS),
        wait_options=("kubeconfig", "context", "namespace", *TLS_OPTIONS),
        one_pod=True,
        lends_kubeconfig=True,
        compare_options=(
            CompareOption(flag="--cluster-tracking-uri", key="cluster_tracking_uri",
                          help="--cluster: MLflow tracking URI as seen from inside the cluster."),
        ),
        shared_options=("namespace", "kubeconfig", "context"),
    )
    pod_marks = PodMarks(run_labels=JOB_NAME_LABELS, keep_env=(RUN_ID_ENV,))
    compile_options = ("namespace", "repository_uri")  # the Job's namespace, the config's repository

    def compile(self, pipe: Pipeline, out_dir: Path, *, final_dir: Path | None = None, **k8s: str) -> list[Path]:
        """``k8s``: the Job's ``namespace`` and the config's ``repository_uri`` (``llmpack compile --namespace
        --mlflow-repository-uri``), when given."""
        import os

        from mlflow_projects.compiler import write_project

        final = (final_dir or out_dir) / ARTIFACT_DIR
        # As seen from where `llmpack compile` runs (and `mlflow run` is typed): relative, so the config names
        # no directory of the compiling machine even for an absolute --out.
        typed = Path(os.path.relpath(final, Path.cwd())).as_posix() if final.is_absolute() else final.as_posix()
        dirs = write_project(pipe, out_dir / ARTIFACT_DIR, typed_dir=typed, **k8s)
        return sorted(p for d in dirs.values() for p in d.rglob("*") if p.is_file())

    def submit_options(self) -> list[ClickOption]:
        import click

        return [click.option("--project", "project_dir", default=None,
                             help="Compiled MLflow project (default: mlflow_projects/finetune-k8s; yours: `llmpack "
                                  "compile --pipeline ... --out DIR`, then DIR/mlflow_projects/finetune-k8s)."),
                click.option("--project-dir-in-image", default=None,
                             help="Where the step image holds that project: the Job's workingDir (default: "
                                  "/opt/llmpack/mlflow_projects/finetune-k8s, the shipped one's)."),
                click.option("--kubeconfig", default=None, help="kubeconfig for the Job (default: KUBECONFIG, else the "
                             "in-cluster service account, else ~/.kube/config)."),
                click.option("--context", default=None, help="kubeconfig context (default: its current one)."),
                click.option("--cluster-tracking-uri", default=None,
                             help="Tracking URI as seen from inside the cluster.")]

    def stop_hint(self, summary: Mapping[str, Any]) -> str:
        return f"kubectl delete job {summary.get('server_id')} -n {summary.get('namespace') or 'default'}"

    def recognise_pod(self, pod: Mapping[str, Any]) -> bool:
        """A Job's pod whose container has MLflow's run id in its environment (the MLflow Kubernetes backend's Job)."""
        if not any(k in pod_labels(pod) for k in JOB_NAME_LABELS):
            return False
        spec = pod.get("spec") if isinstance(pod, Mapping) else None
        for container in (spec.get("containers") if isinstance(spec, Mapping) else None) or ():
            for env in container.get("env") or ():
                if isinstance(env, Mapping) and str(env.get("name", "")).startswith(RUN_ID_ENV):
                    return True
        return False


BACKEND = MlflowBackend()
