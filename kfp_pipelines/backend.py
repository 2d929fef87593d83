"""The Kubeflow Pipelines backend, declared once (:mod:`components.backend`): ``llmpack`` finds it by name ``kfp``.

Compiles to KFP v2 IR (:mod:`kfp_pipelines.compiler`), runs with kfp.local (:mod:`kfp_pipelines.local`),
submits with ``kfp.Client`` (:mod:`kfp_pipelines.submit`). Each is imported when first used.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.backend import Backend, ClickOption, ServerConnection, pod_annotations, pod_labels
from components.dsl import Pipeline

ARTIFACT = Path("kfp_pipelines/finetune.yaml")
V2_LABEL = "pipelines.kubeflow.org/v2_component"  # label (or annotation) "true" on every KFP v2 pod
RUN_ID_LABEL = "pipeline/runid"  # KFP v1 and some v2 launchers


class KfpBackend(Backend):
    name = "kfp"
    env_vars = ("KFP_HOST", "KF_PIPELINES_ENDPOINT", "KFP_TOKEN", "KF_PIPELINES_SA_TOKEN_PATH")
    artifacts = (ARTIFACT,)
    submit_help = "Create a KFP run from the compiled package (like `kfp run submit -f kfp_pipelines/finetune.yaml`)."
    local_module = "kfp_pipelines.local"
    cluster_module = "kfp_pipelines.submit"
    connection_type = ServerConnection

    def compile(self, pipe: Pipeline, out_dir: Path, *, final_dir: Path | None = None) -> list[Path]:
        from kfp_pipelines.compiler import compile_pipeline

        return [compile_pipeline(pipe, out_dir / ARTIFACT)]

    def submit_options(self) -> list[ClickOption]:
        import click

        return [click.option("--host", default=None, help="KFP API endpoint (default: KFP_HOST)."),
                click.option("--experiment", default="llmpack", show_default=True),
                click.option("--package", "package_path", default=None,
                             help="Compiled package (default: kfp_pipelines/finetune.yaml).")]

    def stop_hint(self, summary: Mapping[str, Any]) -> str:
        return f"kfp.Client(host=...).terminate_run({summary.get('server_id')!r}) or the KFP UI"

    def recognise_pod(self, pod: Mapping[str, Any]) -> bool:
        labels = pod_labels(pod)
        return labels.get(V2_LABEL) == "true" or pod_annotations(pod).get(V2_LABEL) == "true" or RUN_ID_LABEL in labels


BACKEND = KfpBackend()
