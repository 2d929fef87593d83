"""The whole-pipeline check run before anything is compiled or submitted: every error names the field.

Names are DNS-1123 labels, no task takes the summarizing task's name or a telemetry parameter's,
resources are sane, every input is another task's output of the wanted type, every parameter
argument fits its type (docs/internals/architecture.md, "The pipeline and its steps").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components.errors import PipelineValidationError
from components.params import CLOSE_TASK, TELEMETRY_PARAMS, Param
from components.wiring import OutputRef, PipelineParamRef, Task

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def is_dns1123_label(name: str) -> bool:
    return len(name) <= 63 and bool(DNS1123_LABEL.fullmatch(name))


def validate_pipeline(name: str, params: Mapping[str, Param], tasks: Mapping[str, Task],
                      all_params: Mapping[str, Param]) -> None:
    """Check a pipeline's name, its parameters and each task (the graph's cycles: ``Pipeline.task_order``).

    ``all_params``: the user's parameters and the telemetry ones, which a task's argument may name.
    """
    where = f"pipeline {name!r}"
    if not is_dns1123_label(name):
        raise PipelineValidationError(f"{where}: name is not a valid DNS-1123 label")
    for p in params.values():
        if p.name in TELEMETRY_PARAMS:
            raise PipelineValidationError(f"{where}: parameter {p.name!r} is reserved for telemetry")
    for task in tasks.values():
        if name in {task.name, task.step.name.replace("_", "-")}:  # KFP's compiled spec takes one for the other
            raise PipelineValidationError(f"{where}: a step of it has the same name (task {task.name!r}); KFP "
                                          "would run the step as the pipeline: rename the pipeline or the step")
        _validate_task(tasks, all_params, task)


def _type_name(t: type) -> str:
    return t.__name__


def _validate_task(tasks: Mapping[str, Task], all_params: Mapping[str, Param], task: Task) -> None:
    step_ = task.step
    where = f"task {task.name!r}"
    if not is_dns1123_label(task.name):
        raise PipelineValidationError(f"{where}: name is not a valid DNS-1123 label")
    if task.name == CLOSE_TASK:
        raise PipelineValidationError(f"{where}: name is reserved for the run's summarizing task; rename the task")
    res = step_.execution.resources
    if res.gpus < 0:
        raise PipelineValidationError(f"{where}: resources.gpus is {res.gpus}; must be >= 0")
    if res.nodes < 1:
        raise PipelineValidationError(f"{where}: resources.nodes is {res.nodes}; must be >= 1")
    if res.gpu_type and res.gpus == 0:
        raise PipelineValidationError(
            f"{where}: resources.gpu_type is {res.gpu_type!r} but resources.gpus is 0"
        )
    if res.gpus > 0 and not res.gpu_type:
        raise PipelineValidationError(f"{where}: resources.gpus is {res.gpus} but resources.gpu_type is empty")
    if res.cpu <= 0:
        raise PipelineValidationError(f"{where}: resources.cpu must be > 0")
    if step_.execution.retry.limit < 0:
        raise PipelineValidationError(f"{where}: retry.limit must be >= 0")
    for key, value in task.arguments.items():
        if key in step_.outputs:
            raise PipelineValidationError(f"{where}: argument {key!r} is an output; outputs are not passed in")
        if key in step_.inputs:
            if not isinstance(value, OutputRef):
                raise PipelineValidationError(
                    f"{where}: input {key!r} must be another task's output, got {value!r}"
                )
            src = tasks.get(value.task)
            if src is None:
                raise PipelineValidationError(f"{where}: input {key!r} comes from unknown task {value.task!r}")
            produced = src.step.outputs.get(value.output)
            if produced is None:
                raise PipelineValidationError(
                    f"{where}: input {key!r} names missing output {value.task}.{value.output}"
                )
            wanted = step_.inputs[key]
            if not issubclass(produced, wanted):
                raise PipelineValidationError(
                    f"{where}: input {key!r} wants {wanted.__name__}, "
                    f"but {value.task}.{value.output} is {produced.__name__}"
                )
            continue
        param = step_.params.get(key)
        if param is None:
            raise PipelineValidationError(f"{where}: step {step_.name!r} has no parameter {key!r}")
        if isinstance(value, PipelineParamRef):
            pp = all_params.get(value.name)
            if pp is None:
                raise PipelineValidationError(
                    f"{where}: parameter {key!r} names unknown pipeline parameter {value.name!r}")
            if pp.type is not param.type:
                raise PipelineValidationError(
                    f"{where}: parameter {key!r} is {_type_name(param.type)}, "
                    f"but pipeline parameter {value.name!r} is {_type_name(pp.type)}"
                )
        elif isinstance(value, OutputRef):
            raise PipelineValidationError(f"{where}: parameter {key!r} cannot take an artifact")
        elif not _value_fits(value, param.type):
            raise PipelineValidationError(
                f"{where}: parameter {key!r} is {_type_name(param.type)}, got {type(value).__name__} {value!r}"
            )
    for key in step_.inputs:
        if key not in task.arguments:
            raise PipelineValidationError(f"{where}: input {key!r} is not connected")
    for key, param in step_.params.items():
        if param.required and key not in task.arguments:
            raise PipelineValidationError(f"{where}: required parameter {key!r} is missing")


def _value_fits(value: Any, wanted: type) -> bool:
    if wanted is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if wanted is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, wanted)
