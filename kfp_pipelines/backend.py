"""The Kubeflow Pipelines backend, declared once (:mod:`components.backend`): ``llmpack`` finds it by name ``kfp``.

Compiles to KFP v2 IR (:mod:`kfp_pipelines.compiler`), runs with kfp.local (:mod:`kfp_pipelines.local`),
submits with ``kfp.Client`` (:mod:`kfp_pipelines.submit`). Each is imported when first used.
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
    Drivers,
    LabFacts,
    PodMarks,
    ServerConnection,
    pod_annotations,
    pod_labels,
)
from components.dsl import Pipeline

ARTIFACT = Path("kfp_pipelines/finetune.yaml")
V2_LABEL = "pipelines.kubeflow.org/v2_component"  # label (or annotation) "true" on every KFP v2 pod
RUN_ID_LABEL = "pipeline/runid"  # KFP v1 and some v2 launchers
NODE_NAME = "workflows.argoproj.io/node-name"  # KFP v2 runs on Argo: Argo's workflow node name of each pod
DEFAULT_POD_NAMESPACE = "kubeflow"  # single-user KFP runs its pods there; multi-user: the profile


class KfpBackend(Coloured, LabFacts, ClusterBackend):
    name = "kfp"
    env_vars = ("KFP_HOST", "KF_PIPELINES_ENDPOINT", "KFP_TOKEN", "KF_PIPELINES_SA_TOKEN_PATH")
    colour = "#1f77b4"  # its colour in the report's charts
    artifacts = (ARTIFACT,)
    submit_help = "Create a KFP run from the compiled package (like `kfp run submit -f kfp_pipelines/finetune.yaml`)."
    local_module = "kfp_pipelines.local"
    cluster_module = "kfp_pipelines.submit"
    connection_type = ServerConnection
    cluster_path = ClusterPath(
        name="kfp", artifact_option="package_path", artifact_path=ARTIFACT.as_posix(),
        submit_options=("host", "token", "namespace", "experiment", "package_path", "service_account", "pod_namespace",
                        *TLS_OPTIONS),
        wait_options=("host", "token", "namespace", *TLS_OPTIONS),
        own_options=("pod_namespace",),
        namespace_options=("pod_namespace", "namespace"), default_namespace=DEFAULT_POD_NAMESPACE,
        # KFP pods carry only KFP's pipeline/runid, known once the run is created: watched right after.
        watch_before_submit=False,
        compare_options=(CompareOption(flag="--kfp-host", key="host", endpoint=True,
                                       help="--cluster: KFP API endpoint (default KFP_HOST; token from KFP_TOKEN)."),),
    )
    pod_marks = PodMarks(
        run_labels=(RUN_ID_LABEL,), workflow_labels=(RUN_ID_LABEL,), keep_labels=(V2_LABEL,),
        keep_annotations=(V2_LABEL,), node_annotations=(NODE_NAME,), helper_containers=("wait", "init"),
        # The templates KFP's compiler emits (pod names are <workflow>-<template>-<hash>).
        drivers=Drivers(templates=("system-dag-driver", "system-container-driver"),
                        executor_templates=("system-container-impl",), node_suffix="-driver", executor_node="executor",
                        command="driver", image="kfp-driver"),
        unlabelled_selector=f"{V2_LABEL}=true",
    )

    def compile(self, pipe: Pipeline, out_dir: Path, *, final_dir: Path | None = None) -> list[Path]:
        from kfp_pipelines.compiler import compile_pipeline

        return [compile_pipeline(pipe, out_dir / ARTIFACT)]

    def submit_options(self) -> list[ClickOption]:
        import click

        return [click.option("--host", default=None, help="KFP API endpoint (default: KFP_HOST)."),
                click.option("--experiment", default="llmpack", show_default=True, help="KFP experiment of the run."),
                click.option("--package", "package_path", default=None,
                             help="Compiled package (default: kfp_pipelines/finetune.yaml)."),
                click.option("--service-account", default=None, metavar="NAME",
                             help="Service account of every pod of the run (KFP sets one per run); default: "
                                  "llmpack-launcher for a TrainJob gang (its launcher creates the TrainJob), "
                                  "else KFP's own.")]

    def stop_hint(self, summary: Mapping[str, Any]) -> str:
        return f"kfp.Client(host=...).terminate_run({summary.get('server_id')!r}) or the KFP UI"

    def recognise_pod(self, pod: Mapping[str, Any]) -> bool:
        labels = pod_labels(pod)
        return labels.get(V2_LABEL) == "true" or pod_annotations(pod).get(V2_LABEL) == "true" or RUN_ID_LABEL in labels


BACKEND = KfpBackend()
