"""What a pipeline is made of: steps (:class:`Step`), their uses (:class:`Task`) and what those refer to.

Calling a step inside a ``@pipeline`` function (:mod:`components.dsl`) makes a :class:`Task` in
the :class:`TaskBuilder` of the function being run; its arguments are plain values,
:class:`PipelineParamRef` (a pipeline parameter) or :class:`OutputRef` (another task's output
artifact), as ``kfp.dsl``'s pipeline channels are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from components.artifacts import Artifact
from components.errors import PipelineValidationError
from components.execution import Execution
from components.params import TELEMETRY_PARAMS, Param


@dataclass(frozen=True, kw_only=True)
class Step:
    """A reusable step: a typed function plus its execution needs."""

    name: str  # DNS-1123 label, e.g. "prepare-data"
    func: Callable[..., Any]
    params: dict[str, Param]
    inputs: dict[str, type[Artifact]]
    outputs: dict[str, type[Artifact]]
    execution: Execution
    description: str = ""
    # Start-up a fused pod may run ahead in a parked process (components.process.warm_ahead): imports and
    # client set-up only, never the step's work.
    warm_up: Callable[[], None] | None = None

    @property
    def ref(self) -> str:
        """Import reference ``module:function`` used to run the step in any process."""
        return f"{self.func.__module__}:{self.func.__name__}"

    def __call__(self, **kwargs: Any) -> Task:
        builder = TaskBuilder.current()
        if builder is None:
            raise PipelineValidationError(
                f"step {self.name!r}: call it inside a @pipeline function, or use step.func to run it"
            )
        return builder.add(self, kwargs)


@dataclass(frozen=True)
class PipelineParamRef:
    """A reference to a pipeline-level parameter."""

    name: str


@dataclass(frozen=True)
class OutputRef:
    """A reference to an output artifact of another task."""

    task: str
    output: str


class _Outputs:
    def __init__(self, task: Task) -> None:
        self._task = task

    def __getitem__(self, name: str) -> OutputRef:
        if name not in self._task.step.outputs:
            raise PipelineValidationError(
                f"task {self._task.name!r}: no output named {name!r} "
                f"(has {', '.join(sorted(self._task.step.outputs))})"
            )
        return OutputRef(self._task.name, name)


@dataclass(kw_only=True)
class Task:
    """One use of a step in a pipeline, with its arguments."""

    name: str
    step: Step
    arguments: dict[str, Any]
    depends_on: list[str] = field(default_factory=list)

    @property
    def outputs(self) -> _Outputs:
        return _Outputs(self)

    def after(self, *others: Task) -> Task:
        for other in others:
            if other.name not in self.depends_on:
                self.depends_on.append(other.name)
        return self

    def upstream(self) -> list[str]:
        deps = list(self.depends_on)
        for value in self.arguments.values():
            if isinstance(value, OutputRef) and value.task not in deps:
                deps.append(value.task)
        return deps


class TaskBuilder:
    """Collects the tasks a ``@pipeline`` function's step calls make, while the function runs."""

    _stack: list[TaskBuilder] = []

    def __init__(self, tasks: dict[str, Task]) -> None:
        self.tasks = tasks

    @classmethod
    def current(cls) -> TaskBuilder | None:
        return cls._stack[-1] if cls._stack else None

    def add(self, step_: Step, kwargs: dict[str, Any]) -> Task:
        name = step_.name
        if name in self.tasks:  # trial 8: the second use's events and metrics overwrote the first's in the record
            raise PipelineValidationError(f"step {name!r} is called twice in the pipeline: a run's record keys each "
                                          "step's events and metrics by its name, so each use needs a step of its "
                                          "own (a second @step with another name=)")
        task = Task(name=name, step=step_, arguments=dict(kwargs))
        self.tasks[name] = task
        return task

    def __enter__(self) -> TaskBuilder:
        self._stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.pop()


def iter_param_args(task: Task) -> Iterator[tuple[str, Any]]:
    """The task's parameter arguments (user params, then telemetry params, always wired)."""
    for key, value in task.arguments.items():
        if key in task.step.params:
            yield key, value
    for key in TELEMETRY_PARAMS:
        yield key, PipelineParamRef(key)
