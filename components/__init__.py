"""llmpack components: the authoring model and the reusable fine-tuning steps.

Import-light on purpose: torch, transformers, peft, mlflow, kfp and hera are imported inside
the functions that need them.
"""

from components.dsl import (
    GPU_TOLERATION,
    Artifact,
    Dataset,
    Execution,
    Input,
    Metrics,
    Model,
    Output,
    Pipeline,
    Resources,
    Retry,
    Step,
    Task,
    Toleration,
    pipeline,
    step,
)
from components.errors import InputError, PipelineValidationError, StepFailed

__all__ = [
    "GPU_TOLERATION",
    "Artifact",
    "Dataset",
    "Execution",
    "Input",
    "InputError",
    "Metrics",
    "Model",
    "Output",
    "Pipeline",
    "PipelineValidationError",
    "Resources",
    "Retry",
    "Step",
    "StepFailed",
    "Task",
    "Toleration",
    "pipeline",
    "step",
]
