"""The Argo Workflows backend, declared once (:mod:`components.backend`): ``llmpack`` finds it by name ``argo``.

Compiles with Hera (:mod:`argo_workflows.workflow`), runs the compiled YAML's DAG here
(:mod:`argo_workflows.local`), submits to an Argo Server (:mod:`argo_workflows.submit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.backend import (
    TLS_OPTIONS,
    ClickOption,
    ClusterBackend,
    ClusterPath,
    Coloured,
    CompareOption,
    LabFacts,
    OwnAccount,
    PodMarks,
    ServerConnection,
    pod_labels,
)
from components.dsl import Pipeline

ARTIFACT = Path("argo_workflows/finetune.yaml")
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"  # on every pod of a Workflow
NODE_NAME = "workflows.argoproj.io/node-name"  # annotation: the pod's node in the Workflow, <wf>.<dag>.<task>


class ArgoBackend(Coloured, LabFacts, OwnAccount, ClusterBackend):
    name = "argo"
    env_vars = ("ARGO_SERVER", "ARGO_TOKEN", "ARGO_NAMESPACE", "ARGO_SECURE", "ARGO_INSECURE_SKIP_VERIFY",
                "ARGO_BASE_HREF")
    colour = "#ff7f0e"  # its colour in the report's charts
    artifacts = (ARTIFACT,)
    submit_help = "Create an Argo Workflow from the compiled YAML (what `argo submit` does; Hera has no submit)."
    local_module = "argo_workflows.local"
    cluster_module = "argo_workflows.submit"
    connection_type = ServerConnection
    # Declared like kfp's (same fields, its own values): declarations, not logic to share.
    cluster_path = ClusterPath(
        name="argo", artifact_option="workflow_path", artifact_path=ARTIFACT.as_posix(),
        submit_options=("host", "token", "namespace", "workflow_path", "service_account", *TLS_OPTIONS),
        wait_options=("host", "token", "namespace", *TLS_OPTIONS),
        namespace_env="ARGO_NAMESPACE",
        compare_options=(CompareOption(flag="--argo-host", key="host", endpoint=True,
                                       help="--cluster: Argo Server host:port "
                                            "(default ARGO_SERVER; token from ARGO_TOKEN)."),),
        shared_options=("namespace",),
    )
    pod_marks = PodMarks(run_labels=(WORKFLOW_LABEL,), workflow_labels=(WORKFLOW_LABEL,), node_annotations=(NODE_NAME,),
                         helper_containers=("wait", "init"))  # Argo's executor sidecar and init container

    def compile(self, pipe: Pipeline, out_dir: Path, *, final_dir: Path | None = None) -> list[Path]:
        from argo_workflows.workflow import build_workflow

        path = out_dir / ARTIFACT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(build_workflow(pipe).to_yaml())
        return [path]

    def submit_options(self) -> list[ClickOption]:
        import click

        return [click.option("--host", default=None, help="Argo Server host:port (default: ARGO_SERVER)."),
                click.option("--workflow", "workflow_path", default=None,
                             help="Compiled Workflow (default: argo_workflows/finetune.yaml).")]

    def stop_hint(self, summary: Mapping[str, Any]) -> str:
        return f"argo stop {summary.get('server_id')} -n {summary.get('namespace') or 'default'}"

    def remove_hint(self, summary: Mapping[str, Any]) -> str:
        return f"kubectl delete workflow {summary.get('server_id')} -n {summary.get('namespace') or 'default'}"

    def own_metrics(self, result: Mapping[str, Any]) -> dict[str, float]:
        return argo_metrics(result.get("resources_duration"))

    def explain_own_metrics(self, metrics: Mapping[str, Any]) -> list[str]:
        own_h, container_h = metrics.get("argo_gpu_hours"), metrics.get("gpu_hours")
        if own_h is not None and metrics.get("gang_ready_s") is not None:
            return [f"Argo {own_h:.3f} GPU-h counts only the Workflow's own pods: the TrainJob's node pods, "
                    "made by the launcher, hold the training GPUs and are not Argo's"]
        if own_h is not None and container_h is not None:
            return [f"Argo {own_h:.3f} GPU-h counts the pods' GPU requests x container run time (whole seconds); "
                    f"our container account {container_h:.3f} GPU-h also bills a new node's provisioning "
                    f"({container_h - own_h:+.3f} GPU-h)"]
        return []

    def recognise_pod(self, pod: Mapping[str, Any]) -> bool:
        return WORKFLOW_LABEL in pod_labels(pod)


def argo_metrics(resources_duration: Mapping[str, Any] | None) -> dict[str, float]:
    """``argo_gpu_hours`` (and ``argo_cpu_hours``) from Argo's resourcesDuration sums; none when Argo recorded none.

    What :func:`argo_workflows.submit.pod_resources_duration` read at the end of the wait: each pod's
    request times its containers' run time, in whole seconds (docs/telemetry-and-cost.md).
    """
    if not resources_duration:
        return {}
    return {"argo_gpu_hours": float(resources_duration.get("nvidia.com/gpu", 0)) / 3600.0,
            "argo_cpu_hours": float(resources_duration.get("cpu", 0)) / 3600.0}


BACKEND = ArgoBackend()
