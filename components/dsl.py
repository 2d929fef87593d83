"""The authoring model: typed steps and a validated pipeline DAG.

A step is a plain Python function with typed parameters (int, float, str, bool) and typed
artifacts (``Input[Dataset]``, ``Output[Model]``...), decorated with :func:`step`, which also
records what it needs to run (image, CPU, memory, GPU, retries, timeout, placement).

A pipeline is a function decorated with :func:`pipeline`; calling steps inside it wires them
into a DAG, the way ``kfp.dsl`` does::

    @pipeline(name="llm-finetune")
    def finetune_pipeline(seed: int = 0):
        data = prepare_data(seed=seed)
        tokenize(dataset=data.outputs["dataset"])

Each backend compiles the resulting :class:`Pipeline` object; nothing here imports an
orchestrator library.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from components.artifacts import ARTIFACT_TYPES, PARAM_TYPES, Artifact, Dataset, Input, Metrics, Model, Output
from components.errors import InputError, PipelineValidationError
from components.execution import GPU_TOLERATION, HF_CACHE_MOUNT, Execution, Resources, Retry, Toleration
from components.params import CLOSE_TASK, TELEMETRY_PARAMS, Param

# The authoring model's types live in their own modules and are named here too, as ``kfp.dsl`` names its own.
__all__ = [
    "ARTIFACT_TYPES", "GPU_TOLERATION", "HF_CACHE_MOUNT", "PARAM_TYPES", "Artifact", "Dataset", "Execution", "Input",
    "Metrics", "Model", "Output", "Param", "Pipeline", "Resources", "Retry", "Step", "Task", "Toleration",
    "bind_params", "coerce", "is_dns1123_label", "pipeline", "step",
]

# --------------------------------------------------------------------------- names

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def is_dns1123_label(name: str) -> bool:
    return len(name) <= 63 and bool(DNS1123_LABEL.fullmatch(name))


# --------------------------------------------------------------------------- steps


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
        builder = _Builder.current()
        if builder is None:
            raise PipelineValidationError(
                f"step {self.name!r}: call it inside a @pipeline function, or use step.func to run it"
            )
        return builder.add(self, kwargs)


def _artifact_of(annotation: Any) -> tuple[str, type[Artifact]] | None:
    origin = typing.get_origin(annotation)
    if origin in (Input, Output):
        (art,) = typing.get_args(annotation)
        if not (isinstance(art, type) and issubclass(art, Artifact)):
            raise PipelineValidationError(f"artifact annotation {annotation!r} must wrap an Artifact type")
        return ("in" if origin is Input else "out", art)
    return None


def step(
    *,
    name: str | None = None,
    execution: Execution | None = None,
    description: str | None = None,
    warm_up: Callable[[], None] | None = None,
) -> Callable[[Callable[..., Any]], Step]:
    """Turn a typed function into a :class:`Step`.

    ``warm_up``: the step's start-up (imports, client set-up), which a fused pod may run ahead of
    the step's turn while earlier steps work (:mod:`components.process.warm_ahead`); never its work.
    """

    def wrap(func: Callable[..., Any]) -> Step:
        step_name = name or func.__name__.replace("_", "-")
        hints = typing.get_type_hints(func, include_extras=False)
        params: dict[str, Param] = {}
        inputs: dict[str, type[Artifact]] = {}
        outputs: dict[str, type[Artifact]] = {}
        for pname, p in inspect.signature(func).parameters.items():
            ann = hints.get(pname)
            art = _artifact_of(ann)
            if art is not None:
                (inputs if art[0] == "in" else outputs)[pname] = art[1]
            elif ann in PARAM_TYPES.values():
                if pname in ("submitted_at", "run_group", "pipeline_run", "orchestrator", "mode"):
                    raise PipelineValidationError(f"step {step_name!r}: parameter {pname!r} is reserved for telemetry")
                params[pname] = Param(name=pname, type=ann, default=p.default)
            else:
                raise PipelineValidationError(
                    f"step {step_name!r}: parameter {pname!r} has type {ann!r}; "
                    "use int, float, str, bool, Input[...] or Output[...]"
                )
        if not outputs:
            raise PipelineValidationError(f"step {step_name!r}: declare at least one Output[...] artifact")
        doc = description if description is not None else (inspect.getdoc(func) or "").split("\n")[0]
        return Step(
            name=step_name,
            func=func,
            params=params,
            inputs=inputs,
            outputs=outputs,
            execution=execution or Execution(),
            description=doc,
            warm_up=warm_up,
        )

    return wrap


# --------------------------------------------------------------------------- pipeline graph


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


MAX_VALUE = 6000  # MLflow's MAX_PARAM_VAL_LENGTH: a longer value would be cut in the record, kept whole elsewhere


def shown(value: Any) -> str:
    """The value as an error line shows it: ``repr``, cut to a readable length.

    A 100,000-character name is not echoed.
    """
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(str(value)):,} characters)"


def check_length(name: str, value: Any, flag: str) -> None:
    """A text value over :data:`MAX_VALUE` characters: one InputError (the record would cut it)."""
    if isinstance(value, str) and len(value) > MAX_VALUE:
        raise InputError(f"{flag} {name}: {len(value):,} characters; at most {MAX_VALUE:,} (MLflow's parameter limit)")


Rule = tuple[Callable[[Any], bool], str]  # (is the value allowed, what it must be: for the error line)


def bind_params(params: Mapping[str, Param], values: Mapping[str, Any], *, flag: str = "parameter") -> dict[str, Any]:
    """``values`` as the types ``params`` declare.

    Command-line text is coerced, an int taken as a float; anything else is one InputError.
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        param = params.get(key)
        if param is None:
            raise InputError(f"{flag} {key!r}: unknown pipeline parameter (known: {', '.join(params)})")
        if isinstance(value, str) and param.type is not str:
            value = coerce(value, param.type, f"{flag} {key}")
        elif param.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif not isinstance(value, param.type) or (param.type is int and isinstance(value, bool)):
            raise InputError(f"{flag} {key!r} is {param.type.__name__}, got {type(value).__name__} {value!r}")
        check_length(key, value, flag)
        out[key] = value
    return out


@dataclass(kw_only=True)
class Pipeline:
    """A named DAG of tasks with pipeline-level parameters and defaults."""

    name: str
    params: dict[str, Param]
    tasks: dict[str, Task]
    description: str = ""
    module: str = ""  # the module that defines it: a fused step of it is resolved there (components.fusion)
    rules: dict[str, Rule] = field(default_factory=dict)  # what each parameter's value must be (bind checks them)

    def bind(self, values: Mapping[str, Any], *, flag: str = "parameter") -> dict[str, Any]:
        """The one parameter gate: ``values`` coerced, type-checked and held to the rules, or one InputError.

        Every caller goes through it: the CLI's ``--param`` (``flag="--param"``), ``submit`` (library
        calls included) and local runs; the step process binds its own step's parameters with
        :func:`bind_params`. ``None`` values are left out (not given). Telemetry parameters are not
        the user's: they are unknown here.
        """
        bound = bind_params(self.params, values, flag=flag)
        for key, value in bound.items():
            rule = self.rules.get(key)
            if rule is not None and not rule[0](value):
                raise InputError(f"{flag} {key}: {shown(value)} is not allowed; must be {rule[1]}")
        return bound

    @property
    def all_params(self) -> dict[str, Param]:
        """The user's parameters followed by the telemetry parameters every task receives."""
        return {**self.params, **TELEMETRY_PARAMS}

    def task_order(self) -> list[Task]:
        """Tasks in a deterministic topological order (raises on a cycle)."""
        order: list[Task] = []
        state: dict[str, int] = {}

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == 2:
                return
            if state.get(name) == 1:
                cycle = path[path.index(name) :] + [name]
                raise PipelineValidationError(
                    f"pipeline {self.name!r}: cycle {' -> '.join(cycle)}"
                )
            state[name] = 1
            for dep in self.tasks[name].upstream():
                if dep not in self.tasks:
                    raise PipelineValidationError(
                        f"pipeline {self.name!r}: task {name!r} depends on unknown task {dep!r}"
                    )
                visit(dep, path + [name])
            state[name] = 2
            order.append(self.tasks[name])

        for name in self.tasks:
            visit(name, [])
        return order

    def through(self, task: str) -> Pipeline:
        """The pipeline cut after ``task``: it and the tasks it needs, nothing after (compare's start-up rounds)."""
        keep: set[str] = set()
        todo = [task]
        while todo:
            name = todo.pop()
            if name not in keep:
                keep.add(name)
                todo.extend(self.tasks[name].upstream())
        return replace(self, tasks={n: t for n, t in self.tasks.items() if n in keep}).validate()

    def validate(self) -> Pipeline:
        """Check the whole pipeline; every error names the field. Returns self."""
        where = f"pipeline {self.name!r}"
        if not is_dns1123_label(self.name):
            raise PipelineValidationError(f"{where}: name is not a valid DNS-1123 label")
        for p in self.params.values():
            if p.name in TELEMETRY_PARAMS:
                raise PipelineValidationError(f"{where}: parameter {p.name!r} is reserved for telemetry")
        for task in self.tasks.values():
            _validate_task(self, task)
        self.task_order()
        return self


def _type_name(t: type) -> str:
    return t.__name__


def _validate_task(pipe: Pipeline, task: Task) -> None:
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
            src = pipe.tasks.get(value.task)
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
            pp = pipe.all_params.get(value.name)
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


class _Builder:
    _stack: list[_Builder] = []

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe

    @classmethod
    def current(cls) -> _Builder | None:
        return cls._stack[-1] if cls._stack else None

    def add(self, step_: Step, kwargs: dict[str, Any]) -> Task:
        name = step_.name
        n = 2
        while name in self.pipe.tasks:
            name = f"{step_.name}-{n}"
            n += 1
        task = Task(name=name, step=step_, arguments=dict(kwargs))
        self.pipe.tasks[name] = task
        return task

    def __enter__(self) -> _Builder:
        self._stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.pop()


def coerce(value: str, typ: type, where: str) -> Any:
    """``value`` (command-line text) as ``typ``; a bad value is one :class:`InputError` naming ``where``."""
    try:
        if typ is bool:
            if value.lower() in ("true", "1", "yes"):
                return True
            if value.lower() in ("false", "0", "no", ""):
                return False
            raise ValueError(value)
        return typ(value)
    except ValueError:
        raise InputError(f"{where}: {value!r} is not a valid {typ.__name__}") from None


def pipeline(*, name: str, description: str = "", rules: Mapping[str, Rule] | None = None,
             ) -> Callable[[Callable[..., Any]], Callable[[], Pipeline]]:
    """Decorate a function that wires steps; the result builds a fresh validated Pipeline.

    ``rules``: what a parameter's value must be, ``{name: (check, "what it must be")}``, held by
    :meth:`Pipeline.bind` before any run or submit.
    """

    def wrap(func: Callable[..., Any]) -> Callable[[], Pipeline]:
        def build() -> Pipeline:
            hints = typing.get_type_hints(func)
            params: dict[str, Param] = {}
            for pname, p in inspect.signature(func).parameters.items():
                ann = hints.get(pname)
                if ann not in PARAM_TYPES.values():
                    raise PipelineValidationError(
                        f"pipeline {name!r}: parameter {pname!r} must be int, float, str or bool"
                    )
                if p.default is inspect.Parameter.empty:
                    raise PipelineValidationError(f"pipeline {name!r}: parameter {pname!r} needs a default")
                params[pname] = Param(name=pname, type=ann, default=p.default)
            pipe = Pipeline(
                name=name,
                params=params,
                tasks={},
                description=description or (inspect.getdoc(func) or "").split("\n")[0],
                module=func.__module__,
                rules=dict(rules or {}),
            )
            with _Builder(pipe):
                func(**{k: PipelineParamRef(k) for k in params})
            return pipe.validate()

        build.__name__ = func.__name__
        build.__doc__ = func.__doc__
        return build

    return wrap


def iter_param_args(task: Task) -> Iterator[tuple[str, Any]]:
    """The task's parameter arguments (user params, then telemetry params, always wired)."""
    for key, value in task.arguments.items():
        if key in task.step.params:
            yield key, value
    for key in TELEMETRY_PARAMS:
        yield key, PipelineParamRef(key)
