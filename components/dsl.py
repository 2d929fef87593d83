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

Each backend compiles the resulting :class:`Pipeline` object; nothing here imports an orchestrator library.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from components.artifacts import ARTIFACT_TYPES, PARAM_TYPES, Artifact, Dataset, Input, Metrics, Model, Output
from components.binding import MAX_VALUE, Rule, bind_params, check_length, coerce, shown, where
from components.errors import InputError, PipelineValidationError
from components.execution import GPU_TOLERATION, HF_CACHE_MOUNT, Execution, Resources, Retry, Toleration
from components.params import TELEMETRY_PARAMS, Param
from components.validation import is_dns1123_label, validate_pipeline
from components.wiring import OutputRef, PipelineParamRef, Step, Task, TaskBuilder, iter_param_args

# The authoring model's parts live in their own modules (types: artifacts, execution; values:
# binding; wiring; validation) and are named here too, as ``kfp.dsl`` names its own.
__all__ = [
    "ARTIFACT_TYPES", "GPU_TOLERATION", "HF_CACHE_MOUNT", "MAX_VALUE", "PARAM_TYPES", "Artifact", "Dataset",
    "Execution", "Input", "Metrics", "Model", "Output", "OutputRef", "Param", "Pipeline", "PipelineParamRef",
    "Resources", "Retry", "Rule", "Step", "Task", "Toleration", "bind_params", "check_length", "coerce",
    "is_dns1123_label", "iter_param_args", "pipeline", "shown", "step",
]

# --------------------------------------------------------------------------- steps



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


# --------------------------------------------------------------------------- pipeline


@dataclass(kw_only=True)
class Pipeline:
    """A named DAG of tasks with pipeline-level parameters and defaults."""

    name: str
    params: dict[str, Param]
    tasks: dict[str, Task]
    description: str = ""
    module: str = ""  # the module that defines it: a fused step of it is resolved there (components.fusion)
    rules: dict[str, Rule] = field(default_factory=dict)  # what each parameter's value must be (bind checks them)
    fuse: str = "none"  # how its tasks are packaged: components.fusion.fuse sets it, the record's llmpack.fuse tag

    def bind(self, values: Mapping[str, Any], *, flag: str = "parameter",
             flags: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The one parameter gate: ``values`` coerced, type-checked and held to the rules, or one InputError.

        Every caller goes through it: the CLI's ``--param`` (``flag="--param"``), ``submit`` (library
        calls included) and local runs; the step process binds its own step's parameters with
        :func:`bind_params`. ``None`` values are left out (not given). Telemetry parameters are not
        the user's: they are unknown here. ``flags``: the parameters the command line gives by flags of
        their own (``{"max_steps": "--max-steps"}``), named so in an error line; an unknown one is refused
        as an unknown ``--param`` is, with the nearest name the pipeline has.
        """
        bound = bind_params(self.params, values, flag=flag, flags=flags)
        for key, value in bound.items():
            rule = self.rules.get(key)
            if rule is not None and not rule[0](value):
                raise InputError(f"{where(key, flag, flags)}: {shown(value)} is not allowed; must be {rule[1]}")
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
        """Check the whole pipeline (:mod:`components.validation`); every error names the field. Returns self."""
        validate_pipeline(self.name, self.params, self.tasks, self.all_params)
        self.task_order()
        return self


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
            with TaskBuilder(pipe.tasks):
                func(**{k: PipelineParamRef(k) for k in params})
            return pipe.validate()

        build.__name__ = func.__name__
        build.__doc__ = func.__doc__
        return build

    return wrap
