"""Step fusion: run several tasks of the pipeline in one process (one pod), computing the same thing.

    llmpack run --fuse gpu      # finetune and evaluate in one process: the tuned model stays in memory
    llmpack run --fuse all      # every step in one pod: one pod per run

:func:`fuse` turns a :class:`~components.dsl.Pipeline` into another pipeline in which each group
of tasks is one task whose step is a :class:`FusedStep`; the backends compile it like any other,
and the step process runs its members one after the other, each with its own telemetry. Each
member's artifacts keep their place (:func:`unfused_artifacts` maps them back), its parameters
keep their pipeline names, the execution is the group's most demanding, and the step process
imports a fused step by reference (``__getattr__ = fused_steps(my_pipeline)`` in the pipeline's
module). The wiring, decision by decision: docs/spinup.md, "How a fused task is wired".
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from components.dsl import (
    Artifact,
    Execution,
    OutputRef,
    Param,
    Pipeline,
    PipelineParamRef,
    Retry,
    Step,
    Task,
)
from components.errors import InputError

FUSE_MODES = ("none", "gpu", "all")
ALL_STEPS_TASK = "all-steps"  # the one task of a fully fused pipeline
FUSE_TAG = "llmpack.fuse"  # the pipeline record's tag: how its steps were packaged


@dataclass(frozen=True, kw_only=True)
class Member:
    """One authored task inside a fused step, with its arguments as the pipeline wired them."""

    task: str
    step: Step
    arguments: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class FusedStep(Step):
    """Several authored steps run in one process, in order."""

    members: tuple[Member, ...] = field(default=())
    module: str = ""  # the module of the pipeline it came from: it resolves the fused step by name

    @property
    def ref(self) -> str:
        return f"{self.module}:{fused_attr([m.task for m in self.members])}"


def fused_attr(tasks: list[str]) -> str:
    """The module attribute that names a fused step: its tasks, ``-`` as ``_``, joined by ``__``."""
    return "__".join(t.replace("-", "_") for t in tasks)


def artifact_name(ref: OutputRef) -> str:
    """A fused step's name for one member artifact: ``<task>_<output>`` as a Python identifier."""
    return f"{ref.task}_{ref.output}".replace("-", "_")


def check_mode(mode: str) -> str:
    if mode not in FUSE_MODES:
        hint = f"; did you mean {mode.lower()!r}?" if mode.lower() in FUSE_MODES else ""
        raise InputError(f"--fuse {mode!r}: choose one of {', '.join(FUSE_MODES)}{hint}")
    return mode


def groups(pipe: Pipeline, mode: str) -> list[list[Task]]:
    """The task groups ``mode`` fuses: runs of consecutive GPU tasks (``gpu``) or every task (``all``)."""
    order = pipe.task_order()
    if check_mode(mode) == "none":
        return []
    if mode == "all":
        return [order] if len(order) > 1 else []
    found: list[list[Task]] = []
    run: list[Task] = []
    for task in [*order, None]:
        if task is not None and task.step.execution.resources.gpus > 0:
            run.append(task)
            continue
        if len(run) > 1:
            found.append(run)
        run = []
    return found


def fuse(pipe: Pipeline, mode: str) -> Pipeline:
    """A copy of ``pipe`` with each group of ``mode`` as one task (``none``: ``pipe`` itself); a mode that finds
    nothing to fuse in ``pipe`` is one :class:`InputError` (it would run unfused under a fused label)."""
    if groups(pipe, mode):
        _check_resolvable(pipe)
    elif mode != "none":
        what = "two consecutive GPU steps" if mode == "gpu" else "two steps"
        raise InputError(f"--fuse {mode}: pipeline {pipe.name!r} has no {what} to fuse (it would run unfused); "
                         "drop --fuse")
    fused = pipe
    for group in groups(pipe, mode):
        fused = _fuse_group(fused, [t.name for t in group])
    return fused if mode == "none" else replace(fused, fuse=mode)  # the record tags the mode asked for


def _fuse_group(pipe: Pipeline, names: list[str]) -> Pipeline:
    members = [pipe.tasks[n] for n in names]
    inside = set(names)
    params: dict[str, Param] = {}
    inputs: dict[str, type[Artifact]] = {}
    outputs: dict[str, type[Artifact]] = {}
    arguments: dict[str, Any] = {}
    for task in members:
        for key, value in task.arguments.items():
            if isinstance(value, PipelineParamRef):
                params[value.name] = replace(pipe.all_params[value.name])
                arguments[value.name] = value
            elif isinstance(value, OutputRef) and value.task not in inside:
                inputs[artifact_name(value)] = task.step.inputs[key]
                arguments[artifact_name(value)] = value
        for out, typ in task.step.outputs.items():
            fused_name = artifact_name(OutputRef(task.name, out))
            if fused_name in outputs:  # round 27: `ft`'s `x_model` and `ft-x`'s `model` replaced one another
                raise InputError(f"--fuse: {task.name}'s output {out!r} and another member's would both be "
                                 f"{fused_name!r} in the fused task; rename one of them to fuse this pipeline")
            outputs[fused_name] = typ
    name = ALL_STEPS_TASK if len(names) == len(pipe.tasks) else "-".join(names)
    if name in pipe.tasks and name not in inside:  # round 26: a step of that name was silently replaced
        raise InputError(f"--fuse: the fused task {name!r} would take the name of the pipeline's own step {name!r}; "
                         "rename that step (@step(name=...)) to fuse this pipeline")
    step = FusedStep(
        name=name,
        func=_not_called,
        params=params,
        inputs=inputs,
        outputs=outputs,
        execution=_merged_execution([t.step.execution for t in members]),
        description=f"{', '.join(names)} in one process",
        members=tuple(Member(task=t.name, step=t.step, arguments=dict(t.arguments)) for t in members),
        module=pipe.module,
    )
    fused_task = Task(name=name, step=step, arguments=arguments,
                      depends_on=[d for t in members for d in t.depends_on if d not in inside])
    tasks: dict[str, Task] = {}
    for tname, task in pipe.tasks.items():
        if tname in inside:
            if tname == names[0]:
                tasks[name] = fused_task
            continue
        tasks[tname] = replace(task, arguments={k: _redirect(v, inside, name) for k, v in task.arguments.items()},
                               depends_on=[name if d in inside else d for d in task.depends_on])
    return replace(pipe, tasks=tasks).validate()


def _redirect(value: Any, inside: set[str], fused_task: str) -> Any:
    if isinstance(value, OutputRef) and value.task in inside:
        return OutputRef(fused_task, artifact_name(value))
    return value


def _not_called(**_: Any) -> None:
    raise RuntimeError("a fused step runs its members (components.process.runner), never this function")


def _merged_execution(executions: list[Execution]) -> Execution:
    heaviest = max(executions, key=lambda e: (e.resources.gpus, e.resources.cpu))
    selector: dict[str, str] = {}
    tolerations = []
    for ex in sorted(executions, key=lambda e: e is not heaviest):
        selector = {**ex.node_selector, **selector}
        tolerations += [t for t in ex.tolerations if t not in tolerations]
    retry = max((e.retry for e in executions), key=lambda r: r.limit, default=Retry())
    return Execution(
        image=heaviest.image,
        resources=heaviest.resources,
        retry=retry,
        timeout_s=sum(e.timeout_s for e in executions),
        node_selector=selector,
        tolerations=tuple(tolerations),
        hf_cache=any(e.hf_cache for e in executions),
        cache_pvc=next((e.cache_pvc for e in executions if e.cache_pvc), None),
        pod=functools.reduce(lambda a, b: a.merged(b), (e.pod for e in executions)),
    )


def path_label(backend: str, fuse: str) -> str:
    """What a compared path is called: ``argo``, or ``argo+fuse-gpu`` for a fused variant."""
    return backend if fuse in ("none", "") else f"{backend}+fuse-{fuse}"


def path_of(run: dict[str, Any]) -> str:
    """The compared path a run summary belongs to (its orchestrator and, when fused, the variant)."""
    fuse = run.get("fuse") or (run.get("tags") or {}).get(FUSE_TAG) or "none"
    return path_label(run["orchestrator"], fuse)


def unfused_artifacts(pipe: Pipeline, artifacts: dict[str, Path]) -> dict[str, Path]:
    """A runner's ``{"task.output": dir}`` with fused keys as the authored ones (``finetune.model``)."""
    out: dict[str, Path] = {}
    for key, path in artifacts.items():
        task, _, output = key.partition(".")
        step = pipe.tasks[task].step if task in pipe.tasks else None
        if isinstance(step, FusedStep):
            for m in step.members:
                for name in m.step.outputs:
                    if artifact_name(OutputRef(m.task, name)) == output:
                        out[f"{m.task}.{name}"] = path
        else:
            out[key] = path
    return out


def member_paths(member: Member, paths: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The member's ``--input`` and ``--output`` directories, from the fused step's (by artifact name)."""
    inputs = {k: paths[artifact_name(v)] for k, v in member.arguments.items() if isinstance(v, OutputRef)}
    outputs = {k: paths[artifact_name(OutputRef(member.task, k))] for k in member.step.outputs}
    return inputs, outputs


def member_values(member: Member, fused_values: dict[str, Any], fused_params: dict[str, Param]) -> dict[str, Any]:
    """The member's parameter values: pipeline-wired ones from the fused step's, constants as authored."""
    values: dict[str, Any] = {}
    for key, arg in member.arguments.items():
        if key not in member.step.params:
            continue
        if isinstance(arg, PipelineParamRef):
            values[key] = fused_values[arg.name] if arg.name in fused_values else fused_params[arg.name].default
        else:
            values[key] = arg
    return values


_RESOLVER = "_llmpack_fused_steps"  # marks a module-level __getattr__ made by fused_steps


def fused_steps(*factories: Callable[[], Pipeline]) -> Callable[[str], FusedStep]:
    """A module ``__getattr__`` resolving ``<module>:<task>__<task>`` to that fused step of the pipelines given.

    Put ``__getattr__ = fused_steps(my_pipeline)`` in the module that defines ``my_pipeline`` (several
    pipelines in one module: ``fused_steps(one, other)``): the step process of a fused task imports its
    step by that reference.
    """
    if not factories:
        raise TypeError("fused_steps() needs the @pipeline functions whose fused steps it resolves")

    def __getattr__(name: str) -> FusedStep:
        parts = name.split("__")
        if name.startswith("__") or len(parts) < 2:  # a step's own name mistyped: Python's own error, not ours
            raise AttributeError(name)
        names = []
        for factory in factories:
            pipe = factory()
            names.append(pipe.name)
            by_attr = {t.replace("-", "_"): t for t in pipe.tasks}
            if all(p in by_attr for p in parts):
                fused = _fuse_group(pipe, [by_attr[p] for p in parts])
                return next(t.step for t in fused.tasks.values() if isinstance(t.step, FusedStep))
        raise AttributeError(f"no fused step {name!r} in pipeline{'s' if len(names) > 1 else ''} "
                             f"{', '.join(map(repr, names))}")

    setattr(__getattr__, _RESOLVER, True)
    __getattr__._llmpack_factories = factories  # type: ignore[attr-defined]  # what _check_resolvable asks
    return __getattr__


def _check_resolvable(pipe: Pipeline) -> None:
    """Refuse, in one line, to fuse a pipeline whose step processes could not find its fused steps."""
    module = sys.modules.get(pipe.module)
    hook = getattr(module, "__getattr__", None) if module is not None else None
    if pipe.module == "__main__" or not getattr(hook, _RESOLVER, False):
        raise InputError(f"pipeline {pipe.name!r}: to run it fused, its module {pipe.module!r} must be importable "
                         "and define `__getattr__ = fused_steps(<the @pipeline function>)` "
                         "(from components.fusion import fused_steps)")
    covered = [factory().name for factory in getattr(hook, "_llmpack_factories", ())]
    if covered and pipe.name not in covered:
        raise InputError(f"pipeline {pipe.name!r}: its module {pipe.module!r} resolves the fused steps of "
                         f"{', '.join(map(repr, covered))} only: name this pipeline's function in it too "
                         "(`__getattr__ = fused_steps(one, other)`)")
