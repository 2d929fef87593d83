"""The MLflow backend's own LLMPACK_* settings, declared in the one registry (:mod:`components.settings`).

Read by :mod:`mlflow_projects.compiler` (the compile-time image) and the generated python_env.yaml;
listed by :mod:`mlflow_projects.backend`. A module of their own so neither imports the other.
"""

from __future__ import annotations

from components import settings

IMAGE = settings.declare(settings.Setting(
    name="LLMPACK_IMAGE", type=str, default=None,
    doc="The docker_env image of the compiled finetune-k8s MLflow project when the pipeline's steps name several."))
SOURCE = settings.declare(settings.Setting(
    name="LLMPACK_SOURCE", type=str, default=None,
    doc="The llmpack checkout `mlflow run --env-manager virtualenv` installs (python_env.yaml: file://${LLMPACK_SOURCE})."))
