"""Compile the pipeline object to MLflow project directories.

``write_project(pipe, out_dir)`` writes two projects, both generated from the one
:class:`~components.dsl.Pipeline`: ``finetune/`` for ``mlflow run --env-manager local`` (or
``virtualenv|uv`` with ``python_env.yaml``), and ``finetune-k8s/``, a ``docker_env`` project with the
Kubernetes Job MLflow submits (:mod:`mlflow_projects.k8s_job`). Each has one entry point per task,
running the command every backend runs, plus ``main``: a shim that runs
:func:`mlflow_projects.driver.main` on ``pipeline.json``, every step a child run in DAG order.
MLflow's Kubernetes backend runs one entry point as one Job, so the Job asks for the largest
step's GPUs, CPU and memory.

The decisions (where ``mlflow run`` is typed, so the paths the config names; a user's own step
modules copied into the project; pinning llmpack by ``file://${LLMPACK_SOURCE}``):
docs/internals/backend-internals.md, "MLflow: the project compiler".
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.commands import format_value, step_args
from components.dsl import (
    TELEMETRY_PARAMS,
    OutputRef,
    Pipeline,
    PipelineParamRef,
    Task,
    iter_param_args,
)
from components.errors import PipelineValidationError
from components.record.close import billed_uses, uses_json
from mlflow_projects.driver import MAIN_SHIM
from mlflow_projects.k8s_job import (  # noqa: F401 - the Kubernetes half, split out; these names stay importable here
    ARTIFACTS_MOUNT,
    HEADER,
    JOB_TEMPLATE,
    K8S_DIR,
    NAMESPACE,
    ORCHESTRATOR,
    TYPED_DIR,
    _dump,
    kubernetes_config,
    kubernetes_job_template,
    pipeline_needs,
    render_job_template,
)
from mlflow_projects.settings import IMAGE, SOURCE

LOCAL_DIR = "finetune"
IMAGE_ENV = IMAGE.name
# TYPED_DIR (mlflow_projects.k8s_job): the projects' parent as typed on the command line; SOURCE_ENV: python_env.yaml
# installs llmpack from this checkout (why both: docs/internals/backend-internals.md, "MLflow: the project compiler")
SOURCE_ENV = SOURCE.name

# MLflow checks only `path` and `uri` parameters; the others are labels for the reader (MLflow's own
# examples write `int`). main.py checks every value against pipeline.json before any step starts.
MLFLOW_TYPES = {int: "int", float: "float", str: "string", bool: "string"}
TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool"}

# Kubernetes defaults (namespace, secret, volumes): mlflow_projects.k8s_job.
K8S_ARTIFACTS_DIR = f"{ARTIFACTS_MOUNT}/artifacts"
LOCAL_ARTIFACTS_DIR = "llmpack-artifacts"
LOCAL_MAX_BACKOFF_S = 1.0  # local runs wait at most this between retries, as the direct path does


# --------------------------------------------------------------------------- names and params


def entry_point_name(task: Task | str) -> str:
    """``prepare-data`` -> ``prepare_data`` (MLflow entry points are typed on a command line)."""
    return (task if isinstance(task, str) else task.name).replace("-", "_")


def _param_type(task: Task, key: str) -> type:
    return task.step.params[key].type if key in task.step.params else TELEMETRY_PARAMS[key].type


def _telemetry_defaults(mode: str) -> dict[str, Any]:
    return {"orchestrator": ORCHESTRATOR, "mode": mode}


def _default(pipe: Pipeline, name: str, mode: str) -> Any:
    return _telemetry_defaults(mode).get(name, pipe.all_params[name].default)


def _yaml_default(value: Any, typ: type) -> Any:
    if typ in (int, float) and not isinstance(value, bool):
        return value
    return format_value(value)


def _mlflow_param(typ: type, default: Any) -> dict[str, Any]:
    return {"type": MLFLOW_TYPES[typ], "default": _yaml_default(default, typ)}


def _task_params(pipe: Pipeline, task: Task, mode: str) -> list[tuple[str, type, Any, dict[str, str]]]:
    """(name, type, default, source) for each parameter the task's command takes."""
    out = []
    for key, arg in iter_param_args(task):
        typ = _param_type(task, key)
        if isinstance(arg, PipelineParamRef):
            out.append((key, typ, _default(pipe, arg.name, mode), {"param": arg.name}))
        else:
            out.append((key, typ, arg, {"value": format_value(arg)}))
    return out


def _artifact_params(task: Task) -> tuple[dict[str, OutputRef], dict[str, str]]:
    inputs = {f"in_{k}": v for k, v in task.arguments.items() if isinstance(v, OutputRef)}
    outputs = {f"out_{k}": k for k in task.step.outputs}
    return inputs, outputs


def _check_names(pipe: Pipeline) -> None:
    seen: dict[str, str] = {}
    for task in pipe.task_order():
        ep = entry_point_name(task)
        if ep == "main":
            raise PipelineValidationError(f"task {task.name!r}: the name 'main' is taken "
                                          "by the MLflow main entry point")
        if ep in seen:
            raise PipelineValidationError(f"task {task.name!r}: entry point {ep!r} clashes with task {seen[ep]!r}")
        seen[ep] = task.name
        inputs, outputs = _artifact_params(task)
        for name in [*inputs, *outputs]:
            if name in task.step.params or name in TELEMETRY_PARAMS:
                raise PipelineValidationError(
                    f"task {task.name!r}: parameter {name!r} clashes with the MLflow artifact parameter of that name"
                )
    for name in pipe.params:
        if name in ("artifacts_dir", "base_dir"):
            raise PipelineValidationError(f"pipeline {pipe.name!r}: parameter {name!r} "
                                          "is reserved by the MLflow backend")


# --------------------------------------------------------------------------- MLproject


def _entry_point(pipe: Pipeline, task: Task, mode: str, input_type: str) -> dict[str, Any]:
    inputs, outputs = _artifact_params(task)
    params: dict[str, Any] = {}
    for name in inputs:
        params[name] = {"type": input_type}
    for name in outputs:
        params[name] = {"type": "string"}
    for key, typ, default, _src in _task_params(pipe, task, mode):
        params[key] = _mlflow_param(typ, default)
    args = step_args(
        task,
        inputs={ref_name[3:]: f"{{{ref_name}}}" for ref_name in inputs},
        outputs={out: f"{{out_{out}}}" for out in outputs.values()},
        params={key: f"{{{key}}}" for key, *_ in _task_params(pipe, task, mode)},
    )
    return {"parameters": params, "command": " ".join(["python", *args])}


def _main_entry_point(pipe: Pipeline, mode: str, artifacts_dir: str, with_base_dir: bool) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name, p in pipe.all_params.items():
        params[name] = _mlflow_param(p.type, _default(pipe, name, mode))
    params["artifacts_dir"] = {"type": "string", "default": artifacts_dir}
    command = ["python", "main.py", "--artifacts-dir={artifacts_dir}"]
    if with_base_dir:
        # A `path` parameter: MLflow makes "." absolute from where `mlflow run` was typed.
        params["base_dir"] = {"type": "path", "default": "."}
        command.append("--base-dir={base_dir}")
    command += [f"--param={name}={{{name}}}" for name in pipe.all_params]
    return {"parameters": params, "command": " ".join(command)}


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "".join(pad + line if line.strip() else line for line in text.splitlines(keepends=True))


def _example_param(pipe: Pipeline, max_steps: int) -> str:
    """The header's ``-P NAME=VALUE``: ``max_steps`` when the pipeline has it, else its first parameter (a custom
    pipeline's project never advertises a parameter it lacks)."""
    first = next(iter(pipe.params.values()), None)
    if "max_steps" in pipe.params or first is None:
        return f" -P max_steps={max_steps}" if first is not None else ""
    return f" -P {first.name}={shlex.quote(format_value(first.default))}"


def _example_step(pipe: Pipeline) -> str:
    """The header's one-step example: the pipeline's first step, its first output where it writes it."""
    task = pipe.task_order()[0]
    out = next(iter(task.step.outputs))  # every step has one (components.dsl.step)
    return f"-e {entry_point_name(task)} --env-manager local -P out_{out}=$PWD/{'data' if out == 'dataset' else out}"


def render_mlproject(pipe: Pipeline, *, kubernetes: bool, image: str | None = None, typed_dir: str = TYPED_DIR) -> str:
    mode = "cluster" if kubernetes else "local"
    project_dir = f"{typed_dir}/{K8S_DIR if kubernetes else LOCAL_DIR}"
    lines = [HEADER, f"# Pipeline {pipe.name!r}{f': {pipe.description}' if pipe.description else ''}\n#\n"]
    if kubernetes:
        lines.append(
            "# The whole pipeline as one Kubernetes Job (kubernetes_job_template.yaml), each step a child run,\n"
            "# typed in the directory `llmpack compile` ran in (for the committed copies: the repository root):\n"
            f"#   mlflow run {project_dir} --backend kubernetes \\\n"
            f"#     --backend-config {project_dir}/kubernetes_config.json{_example_param(pipe, 200)}\n"
            "# (MLflow opens kube-job-template-path in kubernetes_config.json"
            " relative to where you type `mlflow run`.)\n"
            "# MLflow builds an image FROM docker_env.image with this directory in it and pushes it to the\n"
            "# config's repository-uri; docker_env.image is the step image built from the repository's Dockerfile.\n"
        )
    else:
        lines.append(
            "# The whole pipeline, each step a child run of the main run, in the current environment:\n"
            f"#   mlflow run {project_dir} --env-manager local{_example_param(pipe, 3)}\n"
            "# One step:\n"
            f"#   mlflow run {project_dir} {_example_step(pipe)}\n"
            "# Artifacts go to <artifacts_dir>/<pipeline_run>/<task>/<output>; a relative artifacts_dir is taken\n"
            "# from the directory you run `mlflow run` in.\n"
        )
    body: dict[str, Any] = {"name": pipe.name}
    if kubernetes:
        body["docker_env"] = {"image": image}
    else:
        body["python_env"] = "python_env.yaml"
    lines.append(_dump(body))
    lines.append("entry_points:\n")
    artifacts_dir = K8S_ARTIFACTS_DIR if kubernetes else LOCAL_ARTIFACTS_DIR
    lines.append("  # Run every step below as a child run of this one, in DAG order (main.py, pipeline.json).\n")
    lines.append(_indent(_dump({"main": _main_entry_point(pipe, mode, artifacts_dir, not kubernetes)}), 2))
    # Inputs are MLflow `path` parameters locally (made absolute; remote URIs are downloaded);
    # in the image they are paths on the artifacts volume, which the submitting machine cannot check.
    input_type = "string" if kubernetes else "path"
    for task in pipe.task_order():
        desc = f": {task.step.description}" if task.step.description else ""
        lines.append(f"  # {task.name}{desc}\n")
        lines.append(_indent(_dump({entry_point_name(task): _entry_point(pipe, task, mode, input_type)}), 2))
    return "".join(lines)


# --------------------------------------------------------------------------- pipeline.json


def pipeline_spec(pipe: Pipeline, *, kubernetes: bool) -> dict[str, Any]:
    """The data main.py runs: parameter types and defaults, tasks in DAG order with their wiring."""
    mode = "cluster" if kubernetes else "local"
    tasks = []
    for task in pipe.task_order():
        inputs, outputs = _artifact_params(task)
        ex = task.step.execution
        tasks.append({
            "name": task.name,
            "entry_point": entry_point_name(task),
            "inputs": {k: {"task": ref.task, "output": ref.output} for k, ref in inputs.items()},
            "outputs": outputs,
            "params": {key: src for key, _t, _d, src in _task_params(pipe, task, mode)},
            "retry": {"limit": ex.retry.limit, "backoff_s": ex.retry.backoff_s, "factor": ex.retry.factor,
                      "max_backoff_s": ex.retry.max_backoff_s},
            "timeout_s": ex.timeout_s,
            "resources": {"cpu": ex.resources.cpu, "memory": ex.resources.memory,
                          "gpu_type": ex.resources.gpu_type, "gpus": ex.resources.gpus},
        })
    return {
        "pipeline": pipe.name,
        "description": pipe.description,
        "runner": "in_container" if kubernetes else "projects",
        "max_backoff_s": None if kubernetes else LOCAL_MAX_BACKOFF_S,
        "params": [
            {"name": name, "type": TYPE_NAMES[p.type], "default": format_value(_default(pipe, name, mode))}
            for name, p in pipe.all_params.items()
        ],
        "tasks": tasks,
        "uses": json.loads(uses_json(job_uses(pipe))),
        **({"fuse": pipe.fuse} if pipe.fuse != "none" else {}),  # the record's llmpack.fuse tag
    }


def job_uses(pipe: Pipeline) -> list[Any]:
    """What the run is billed for on this path: :func:`billed_uses`, as the Job's pod holds it.

    MLflow runs every step in one Job, sized for its largest step. With a TrainJob gang
    (``llmpack compile --nodes N``) finetune is the gang's launcher and the Job runs on CPU
    (:func:`mlflow_projects.k8s_job.on_cpu`: no GPU idles in it while the gang trains), so the
    record bills the gang's N x G GPUs and no other step's.
    """
    from dataclasses import replace

    from components.trainjob.gang import task_gang

    uses = billed_uses(pipe)
    gangs = {t.name for t in pipe.task_order() if task_gang(pipe, t) is not None}
    if not gangs:
        return uses
    return [u if u.step in gangs else replace(u, gpus=0, gpu_type=None) for u in uses]


def pipeline_image(pipe: Pipeline, image: str | None = None) -> str:
    """The image every step runs in: ``image``, else ``$LLMPACK_IMAGE``, else the step specs' one."""
    if image:
        return image
    if IMAGE.is_set():
        return str(IMAGE.get())
    images = {t.step.execution.image for t in pipe.tasks.values()}
    if len(images) != 1:
        raise PipelineValidationError(
            f"pipeline {pipe.name!r}: steps use several images ({', '.join(sorted(images))}); an MLflow "
            f"project has one docker_env image: pass image= or set {IMAGE_ENV}"
        )
    return images.pop()


# --------------------------------------------------------------------------- files


PYTHON_ENV = f"""\
# For `mlflow run --env-manager virtualenv` (or uv): a fresh environment with llmpack installed from
# your checkout: `{SOURCE_ENV}=/abs/path/to/llmpack mlflow run ...` (pip expands ${{{SOURCE_ENV}}}).
# Pinned to a file URL on purpose: `llmpack` on a package index is not ours, so it is never looked up
# there; with {SOURCE_ENV} unset the install fails. `--env-manager local` uses the current environment.
python: "3.11"
build_dependencies:
  - pip
dependencies:
  - llmpack @ file://${{{SOURCE_ENV}}}
"""


# The pack's own top-level packages: installed wherever llmpack is, so never copied into a project.
PACK_PACKAGES = frozenset({"components", "kfp_pipelines", "argo_workflows", "mlflow_projects", "llmpack"})


def _module_source(module: str, funcs: list[Any]) -> Path | None:
    """The source file of step module ``module``: its step function's, else the import system's; None when neither."""
    import importlib.util
    import inspect

    for func in funcs:
        try:
            found = inspect.getsourcefile(func)
        except TypeError:  # a builtin or a callable with no source
            found = None
        if found and found.endswith(".py"):
            return Path(found)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that is not importable here
        spec = None
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def user_modules(pipe: Pipeline) -> dict[str, str]:
    """Project-relative path -> source of each step module outside the pack, with its packages' ``__init__.py``.

    A module whose source cannot be found here (made in memory) is not carried: the environment the
    project runs in must provide it, as it must for any module outside the project.
    """
    files: dict[str, str] = {}
    by_module: dict[str, list[Any]] = {}
    for task in pipe.tasks.values():
        module = task.step.ref.partition(":")[0]
        func = getattr(task.step, "func", None)
        by_module.setdefault(module, []).extend([func] if func is not None and func.__module__ == module else [])
    for module, funcs in sorted(by_module.items()):
        if module.split(".")[0] in PACK_PACKAGES:
            continue
        source = _module_source(module, funcs)
        if source is None:
            continue
        parts = module.split(".")
        files["/".join(parts) + ".py"] = source.read_text(encoding="utf-8")
        package_dir = source.parent
        for depth in range(len(parts) - 1, 0, -1):  # examples/__init__.py, when examples is a regular package
            init = package_dir / "__init__.py"
            if init.is_file():
                files["/".join(parts[:depth]) + "/__init__.py"] = init.read_text(encoding="utf-8")
            package_dir = package_dir.parent
    clash = sorted(set(files) & set(GENERATED))
    if clash:
        raise PipelineValidationError(f"pipeline {pipe.name!r}: step module file {clash[0]!r} would overwrite a file "
                                      "the MLflow project needs; rename the module")
    return files


def render_local_project(pipe: Pipeline, *, typed_dir: str = TYPED_DIR) -> dict[str, str]:
    """File name -> text of the ``finetune/`` project."""
    _check_names(pipe)
    return {
        "MLproject": render_mlproject(pipe, kubernetes=False, typed_dir=typed_dir),
        "python_env.yaml": HEADER + PYTHON_ENV,
        "pipeline.json": json.dumps(pipeline_spec(pipe, kubernetes=False), indent=2) + "\n",
        "main.py": MAIN_SHIM,
        **user_modules(pipe),
    }


def render_k8s_project(pipe: Pipeline, *, image: str | None = None, typed_dir: str = TYPED_DIR,
                       namespace: str = NAMESPACE, repository_uri: str | None = None) -> dict[str, str]:
    """File name -> text of the ``finetune-k8s/`` project.

    The Job runs in ``namespace``; MLflow pushes its image to ``repository_uri``.
    """
    _check_names(pipe)
    img = pipeline_image(pipe, image)
    return {
        "MLproject": render_mlproject(pipe, kubernetes=True, image=img, typed_dir=typed_dir),
        "pipeline.json": json.dumps(pipeline_spec(pipe, kubernetes=True), indent=2) + "\n",
        "main.py": MAIN_SHIM,
        "kubernetes_config.json": json.dumps(kubernetes_config(img, typed_dir=typed_dir, repository_uri=repository_uri),
                                             indent=2) + "\n",
        JOB_TEMPLATE: render_job_template(pipe, namespace=namespace),
        **user_modules(pipe),
    }


GENERATED = ("MLproject", "python_env.yaml", "pipeline.json", "main.py", "kubernetes_config.json",
             "kubernetes_job_template.yaml")


def _write(files: Mapping[str, str], project_dir: Path) -> Path:
    project_dir.mkdir(parents=True, exist_ok=True)
    for name in GENERATED:  # one this compiler wrote before and writes no more
        if name not in files and (project_dir / name).is_file():
            (project_dir / name).unlink()
    for name, text in files.items():
        (project_dir / name).parent.mkdir(parents=True, exist_ok=True)  # a user's step module at its package path
        (project_dir / name).write_text(text, encoding="utf-8")
    return project_dir


def write_local_project(pipe: Pipeline, project_dir: str | os.PathLike[str], *, typed_dir: str = TYPED_DIR) -> Path:
    return _write(render_local_project(pipe, typed_dir=typed_dir), Path(project_dir))


def write_k8s_project(pipe: Pipeline, project_dir: str | os.PathLike[str], *, image: str | None = None,
                      typed_dir: str = TYPED_DIR, **k8s: Any) -> Path:
    return _write(render_k8s_project(pipe, image=image, typed_dir=typed_dir, **k8s), Path(project_dir))


def write_project(pipe: Pipeline, out_dir: str | os.PathLike[str], *, image: str | None = None,
                  typed_dir: str = TYPED_DIR, **k8s: Any) -> dict[str, Path]:
    """Write ``out_dir/finetune/`` and ``out_dir/finetune-k8s/``; returns their paths.

    ``typed_dir`` is ``out_dir`` as the user types it in ``mlflow run`` (docs/internals/backend-internals.md,
    "MLflow: the project compiler").
    """
    out = Path(out_dir)
    return {
        "local": write_local_project(pipe, out / LOCAL_DIR, typed_dir=typed_dir),
        "kubernetes": write_k8s_project(pipe, out / K8S_DIR, image=image, typed_dir=typed_dir, **k8s),
    }
