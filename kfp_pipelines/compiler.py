"""Compile the pipeline object to a KFP v2 pipeline (IR YAML), one lightweight component per task.

For every task (in DAG order) it writes the source of a small Python function whose signature is
the step's typed interface and whose body calls :func:`components.runtime.main` with the argument
list every backend runs (:func:`components.commands.step_args`); the source gets a :mod:`linecache`
entry, so ``kfp.dsl.component`` embeds it in the IR. Nothing is written by hand per step. Each
task carries its step's :class:`components.dsl.Execution` as resources, retry policy and
kfp-kubernetes platform config; caching is off (every run is a measurement).

What each task carries, and the limits of the KFP format with what we do about them (static pod
labels, ``backoff_max_duration``, parameter defaults, least privilege): docs/internals/backend-internals.md,
"KFP: the compiler".
"""

from __future__ import annotations

import hashlib
import keyword
import linecache
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from components import settings
from components.dsl import (
    HF_CACHE_MOUNT,
    TELEMETRY_PARAMS,
    OutputRef,
    Pipeline,
    PipelineParamRef,
    Task,
    iter_param_args,
)
from components.gpu_nodes import SHM_MOUNT, SHM_VOLUME, needs_shm, placement, shm_size_limit
from components.podspec import PodExtras, labels_env, pod_labels_of, recommended_labels, tracking_secret_of
from components.record.close import CLOSE_TASK, billed_uses, fuse_args, uses_json
from components.record.tracking import TRACKING_CREDENTIALS, TRACKING_SECRET, TRACKING_URI_KEY
from components.record.uniform import AUTO_MODE

ORCHESTRATOR = "kfp"
GPU_RESOURCE = "nvidia.com/gpu"
MLFLOW_SECRET = TRACKING_SECRET
MLFLOW_SECRET_KEY = TRACKING_URI_KEY
MLFLOW_ENV = "MLFLOW_TRACKING_URI"
RUN_AS_USER = 1000
RUN_AS_GROUP = 1000
from components.labels import LABEL_PREFIX  # noqa: E402 - the one home of the labels

# Defaults of the telemetry parameters in the compiled pipeline (the rest keep TELEMETRY_PARAMS').
# mode=auto: kfp.local runs this package with its defaults, so the step decides (cluster only in a pod)
TELEMETRY_DEFAULTS = {"orchestrator": ORCHESTRATOR, "mode": AUTO_MODE}

# Names the generated body uses; a step parameter with one of these names is refused.
_BODY_NAMES = {"_llmpack_os", "_llmpack_sys", "_llmpack_fmt", "_llmpack_main", "_llmpack_argv", "_llmpack_code",
               "_llmpack_scalars", "_llmpack_key", "_llmpack_value"}
# The summarizing task's Output[Metrics]: the run's headline numbers as system.Metrics scalars (KFP's run comparison).
HEADLINE_OUTPUT = "headline"
_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool"}
_SOURCE_PREFIX = "<llmpack-kfp-component "


def function_name(task_name: str) -> str:
    """The Python name of a task's component function; KFP turns it back into the task name."""
    name = task_name.replace("-", "_")
    if not name.isidentifier() or keyword.iskeyword(name):
        name = f"step_{name}"
    return name


def component_source(task: Task) -> str:
    """The Python source of the task's lightweight component function (embedded in the IR)."""
    step = task.step
    params = [(key, step.params[key].type if key in step.params else TELEMETRY_PARAMS[key].type)
              for key, _ in iter_param_args(task)]
    names = [*step.inputs, *step.outputs, *(k for k, _ in params)]
    clash = _BODY_NAMES.intersection(names)
    if clash:
        raise ValueError(f"step {step.name!r}: parameter name {sorted(clash)[0]!r} is reserved by the KFP backend")

    sig = [f"    {n}: Input[{a.__name__}]," for n, a in step.inputs.items()]
    sig += [f"    {n}: Output[{a.__name__}]," for n, a in step.outputs.items()]
    sig += [f"    {n}: {_TYPE_NAMES[t]}," for n, t in params]
    sig.append("    orchestrator_run_id: str = '',")
    doc = (step.description or f"llmpack step {step.name}").replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    body = [
        f'    """{doc}"""',
        "    import os as _llmpack_os",
        "    import sys as _llmpack_sys",
        "",
        "    from components.commands import format_value as _llmpack_fmt",
        "    from components.runtime import main as _llmpack_main",
        "",
    ]
    body += [f"    _llmpack_os.makedirs({n}.path, exist_ok=True)" for n in step.outputs]
    body.append(f"    _llmpack_argv = [{step.ref!r}]")
    body += [f"    _llmpack_argv.append({f'--input={n}='!r} + {n}.path)" for n in step.inputs]
    body += [f"    _llmpack_argv.append({f'--output={n}='!r} + {n}.path)" for n in step.outputs]
    body += [f"    _llmpack_argv.append({f'--param={n}='!r} + _llmpack_fmt({n}))" for n, _ in params]
    body.append("    _llmpack_argv.append('--param=orchestrator_run_id=' + orchestrator_run_id)")
    body.append("    _llmpack_code = _llmpack_main(_llmpack_argv)")
    body += _log_scalars([n for n, a in step.outputs.items() if a.__name__ == "Metrics"])
    body += [
        "    if _llmpack_code:",
        "        _llmpack_sys.exit(_llmpack_code)",
    ]
    return "\n".join([f"def {function_name(task.name)}(", *sig, "):", *body]) + "\n"


def _log_scalars(outputs: list[str]) -> list[str]:
    """Source lines that log the numbers an ``Output[Metrics]`` holds as its ``system.Metrics`` scalars.

    KFP's UI compares runs by these scalars (``Metrics.log_metric``, kept in the artifact's
    metadata); without them it shows none of our numbers.
    """
    if not outputs:
        return []
    lines = ["    from components.record.uniform import read_scalars as _llmpack_scalars"]
    for name in outputs:
        lines += [f"    for _llmpack_key, _llmpack_value in _llmpack_scalars({name}.path).items():",
                  f"        {name}.log_metric(_llmpack_key, _llmpack_value)"]
    return lines


def close_record_source(pipe: Pipeline) -> str:
    """The exit handler's component: :mod:`components.record` with the run's final status.

    Its submit time falls back to the earliest pod/process time of the run (``first_pod``), not
    to ``dsl.PIPELINE_JOB_CREATE_TIME_UTC_PLACEHOLDER``: the KFP backend resolves that one only
    from 2.17.0 (driver flag ``--pipeline_job_create_time_utc``, kubeflow/pipelines #13474;
    2.16.x passes an empty string, older backends the literal text), and kfp.local 2.17 cannot
    run a package that carries it at all (``IndexError`` in its placeholder parser), which would
    break the plain ``kfp.local`` path. The job id, ``{{$.pipeline_job_uuid}}``, is resolved by
    the backend from 2.5.0 and by kfp.local: it is the run id an empty ``pipeline_run`` takes.
    """
    params = pipe.all_params  # every one: the record logs the pipeline's parameters on every path
    clash = ({"status", "orchestrator_run_id", HEADLINE_OUTPUT} | _BODY_NAMES).intersection(params)
    if clash:
        raise ValueError(f"pipeline parameter name {sorted(clash)[0]!r} is reserved by the KFP summarizing task")
    sig = ["    status: PipelineTaskFinalStatus,"]
    sig += [f"    {n}: {_TYPE_NAMES[p.type]}," for n, p in params.items()]
    sig += [f"    {HEADLINE_OUTPUT}: Output[Metrics],"]
    sig += ["    orchestrator_run_id: str = '',"]
    body = [
        '    """Close the pipeline run record: derive its metrics and cost, end it with the run status."""',
        "    import os as _llmpack_os",
        "    import sys as _llmpack_sys",
        "",
        "    from components.commands import format_value as _llmpack_fmt",
        "    from components.record import main as _llmpack_main",
        "",
        f"    _llmpack_os.makedirs({HEADLINE_OUTPUT}.path, exist_ok=True)",
        "    _llmpack_argv = ['--status=' + status.state, "
        f"{'--uses=' + uses_json(billed_uses(pipe))!r}, "
        f"'--run-id=' + orchestrator_run_id, '--scalars-out=' + {HEADLINE_OUTPUT}.path"
        + "".join(f", {arg!r}" for arg in fuse_args(pipe.fuse)) + "]",
        *(f"    _llmpack_argv.append({f'--param={n}='!r} + _llmpack_fmt({n}))" for n in params),
        "    _llmpack_code = _llmpack_main(_llmpack_argv)",
        *_log_scalars([HEADLINE_OUTPUT]),
        "    if _llmpack_code:",
        "        _llmpack_sys.exit(_llmpack_code)",
    ]
    return "\n".join([f"def {function_name(CLOSE_TASK)}(", *sig, "):", *body]) + "\n"


def build_close_component(pipe: Pipeline) -> Any:
    from kfp import dsl

    image = next((t.step.execution.image for t in pipe.task_order()), None)
    func = _define(close_record_source(pipe), function_name(CLOSE_TASK), CLOSE_TASK)
    return dsl.component(func, base_image=image, packages_to_install=[], install_kfp_package=False)


def _define(source: str, name: str, label: str) -> Callable[..., Any]:
    """Execute generated source with a linecache entry, so inspect.getsource finds it."""
    from kfp.dsl import Dataset, Input, Metrics, Model, Output, PipelineTaskFinalStatus

    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    filename = f"{_SOURCE_PREFIX}{label} {digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict[str, Any] = {
        "__name__": "kfp_pipelines._generated",
        "Input": Input, "Output": Output, "Dataset": Dataset, "Model": Model, "Metrics": Metrics,
        "PipelineTaskFinalStatus": PipelineTaskFinalStatus,
    }
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # noqa: S102 - our own generated source
    return namespace[name]


def build_component(task: Task) -> Any:
    """The KFP lightweight component (a ``PythonComponent``) that runs ``task``."""
    from kfp import dsl

    func = _define(component_source(task), function_name(task.name), task.name)
    return dsl.component(func, base_image=task.step.execution.image, packages_to_install=[],
                         install_kfp_package=False)


def cpu_quantity(cpu: float) -> str:
    return str(int(cpu)) if float(cpu).is_integer() else f"{round(cpu * 1000)}m"


def retry_window_s(task: Task) -> int:
    """Total seconds within which every attempt of the task can start.

    Why not the step's ``max_backoff_s``: docs/internals/backend-internals.md, "KFP: the compiler".
    """
    ex = task.step.execution
    r = ex.retry
    waits = sum(min(r.backoff_s * r.factor**n, r.max_backoff_s) for n in range(r.limit))
    return (r.limit + 1) * ex.timeout_s + waits


def pod_labels(pipe: Pipeline, task: Task) -> dict[str, str]:
    """A step pod's labels: the recommended ones but ``instance`` (KFP fixes labels at compile time; the run
    is ``pipeline/runid``, which KFP sets), ``llmpack.io/*`` and the user's ``--label``s."""
    ex = task.step.execution
    own = {
        f"{LABEL_PREFIX}pipeline": pipe.name,
        f"{LABEL_PREFIX}step": task.step.name,
        f"{LABEL_PREFIX}gpu-type": ex.resources.gpu_type or "none",
        f"{LABEL_PREFIX}gpu-count": str(ex.resources.gpus),
        f"{LABEL_PREFIX}orchestrator": ORCHESTRATOR,
    }
    return pod_labels_of(recommended_labels(name=pipe.name, component=task.step.name, managed_by=ORCHESTRATOR),
                         own, ex.pod)


def close_labels(pipe: Pipeline, extras: PodExtras) -> dict[str, str]:
    """The exit handler's pod labels (static, as a step's)."""
    own = {f"{LABEL_PREFIX}step": CLOSE_TASK, f"{LABEL_PREFIX}orchestrator": ORCHESTRATOR}
    return pod_labels_of(recommended_labels(name=pipe.name, component=CLOSE_TASK, managed_by=ORCHESTRATOR), own, extras)


def use_tracking_secret(kt: Any, secret: str = MLFLOW_SECRET) -> None:
    """The MLflow Secret as the MLflow Job maps it: the URI required (no Secret, no pod: never a sqlite
    file in the pod), ``username``/``password``/``token`` each optional. kfp-kubernetes marks a
    whole ``secretAsEnv`` optional or not, so the two halves are two entries of the same Secret."""
    from kfp import kubernetes

    kubernetes.use_secret_as_env(kt, secret_name=secret, secret_key_to_env={MLFLOW_SECRET_KEY: MLFLOW_ENV})
    kubernetes.use_secret_as_env(kt, secret_name=secret, secret_key_to_env=dict(TRACKING_CREDENTIALS),
                                 optional=True)


def use_pod_extras(kt: Any, extras: PodExtras) -> None:
    """``--model-pvc``/``--data-pvc``, ``HF_TOKEN`` (required secretKeyRef), pull policy and secrets
    (:mod:`components.podspec`). kfp-kubernetes 2.x has no read-only flag for a PVC mount: the
    claims are mounted as given; make them ReadOnlyMany (or read-only at the volume) to be sure."""
    from kfp import kubernetes

    for mount in extras.mounts:
        kubernetes.mount_pvc(kt, pvc_name=mount.claim, mount_path=mount.path)
    for secret in extras.secret_env:
        kubernetes.use_secret_as_env(kt, secret_name=secret.secret, secret_key_to_env={secret.key: secret.env})
    if extras.pull_policy:
        kubernetes.set_image_pull_policy(kt, extras.pull_policy)
    if extras.pull_secrets:
        kubernetes.set_image_pull_secrets(kt, list(extras.pull_secrets))
    for name, value in extras.env:  # the checkpoint volume's settings (--checkpoint-pvc ...)
        if name != settings.GRACE_PERIOD_S.name:  # not compiled here (below): the step must not log a grace it lacks
            kt.set_env_variable(name, value)
    # extras.grace_s: the KFP platform spec has no terminationGracePeriodSeconds (kfp-kubernetes 2.x); the
    # pods keep the cluster's default (30 s) and a TrainJob the finetune step creates gets it (docs/preemption.md).


def configure_task(pipe: Pipeline, task: Task, kt: Any) -> None:
    """Apply the step's execution needs to a KFP ``PipelineTask``."""
    from kfp import kubernetes

    ex = task.step.execution
    res = ex.resources
    kt.set_caching_options(False)
    kt.set_cpu_request(cpu_quantity(res.cpu)).set_cpu_limit(cpu_quantity(res.cpu))
    kt.set_memory_request(res.memory).set_memory_limit(res.memory)
    if res.gpus > 0:
        kt.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(res.gpus)
    if ex.retry.limit > 0:
        kt.set_retry(
            num_retries=ex.retry.limit,
            backoff_duration=f"{ex.retry.backoff_s}s",
            backoff_factor=float(ex.retry.factor),
            backoff_max_duration=f"{retry_window_s(task)}s",
        )
    selector, affinity = placement(ex)
    for key, value in sorted(selector.items()):
        kubernetes.add_node_selector(kt, label_key=key, label_value=value)
    # One kfp-kubernetes term per way a node names the GPU type: required terms, ORed by the backend.
    for term in (affinity or {}).get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", []):
        kubernetes.add_node_affinity(kt, match_expressions=term["matchExpressions"])
    for tol in ex.tolerations:
        kubernetes.add_toleration(kt, key=tol.key, operator=tol.operator, value=tol.value, effect=tol.effect)
    for key, value in pod_labels(pipe, task).items():
        kubernetes.add_pod_label(kt, label_key=key, label_value=value)
    if ex.timeout_s > 0:
        kubernetes.set_timeout(kt, seconds=ex.timeout_s)
    kubernetes.set_security_context(kt, run_as_user=RUN_AS_USER, run_as_group=RUN_AS_GROUP, run_as_non_root=True)
    use_tracking_secret(kt, tracking_secret_of(ex.pod, MLFLOW_SECRET))
    if ex.cache_pvc:
        kubernetes.mount_pvc(kt, pvc_name=ex.cache_pvc, mount_path=HF_CACHE_MOUNT)
        kt.set_env_variable("HF_HOME", HF_CACHE_MOUNT)
    if needs_shm(res.gpus):
        kubernetes.empty_dir_mount(kt, volume_name=SHM_VOLUME, mount_path=SHM_MOUNT, medium="Memory",
                                   size_limit=shm_size_limit(res.gpus))
    use_pod_extras(kt, ex.pod)


def configure_close_task(kt: Any, pipe: Pipeline) -> None:
    """The summarizing task: small, never cached, non-root, MLflow URI and credentials from the same Secret."""
    from kfp import kubernetes

    kt.set_caching_options(False)
    kt.set_cpu_request("250m").set_cpu_limit("1").set_memory_request("512Mi").set_memory_limit("1Gi")
    first = next(iter(pipe.task_order()), None)  # its image (build_close_component): pulled the same way
    pod = first.step.execution.pod if first is not None else PodExtras()
    for key, value in close_labels(pipe, pod).items():
        kubernetes.add_pod_label(kt, label_key=key, label_value=value)
    kubernetes.set_security_context(kt, run_as_user=RUN_AS_USER, run_as_group=RUN_AS_GROUP, run_as_non_root=True)
    use_tracking_secret(kt, tracking_secret_of(pod, MLFLOW_SECRET))
    for name, value in labels_env(pod).items():  # the user's labels: the record's llmpack.label.* tags
        kt.set_env_variable(name, value)
    if first is not None:
        use_pod_extras(kt, PodExtras(pull_policy=pod.pull_policy, pull_secrets=pod.pull_secrets))


def pipeline_signature(pipe: Pipeline) -> Any:
    """The KFP pipeline function's signature: every user and telemetry parameter with its default."""
    import inspect

    return inspect.Signature([
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=p.type,
                          default=TELEMETRY_DEFAULTS.get(name, p.default))
        for name, p in pipe.all_params.items()
    ])


def build_kfp_pipeline(pipe: Pipeline) -> Any:
    """Turn the pipeline object into a KFP v2 pipeline (a ``GraphComponent``)."""
    from kfp import dsl

    pipe.validate()
    order = pipe.task_order()
    components = {task.name: build_component(task) for task in order}
    close_component = build_close_component(pipe)
    signature = pipeline_signature(pipe)

    def pipeline_func(*args: Any) -> None:
        values = dict(zip(signature.parameters, args, strict=True))
        close = close_component(**{n: values[n] for n in pipe.all_params},
                                orchestrator_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        configure_close_task(close, pipe)
        with dsl.ExitHandler(close, name="llmpack-run"):
            kfp_tasks: dict[str, Any] = {}
            for task in order:
                kwargs: dict[str, Any] = {"orchestrator_run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER}
                for name, arg in task.arguments.items():
                    if isinstance(arg, OutputRef):
                        kwargs[name] = kfp_tasks[arg.task].outputs[arg.output]
                for name, arg in iter_param_args(task):
                    kwargs[name] = values[arg.name] if isinstance(arg, PipelineParamRef) else arg
                kt = components[task.name](**kwargs)
                for dep in task.depends_on:
                    kt.after(kfp_tasks[dep])
                configure_task(pipe, task, kt)
                kfp_tasks[task.name] = kt

    pipeline_func.__name__ = pipe.name.replace("-", "_")
    pipeline_func.__qualname__ = pipeline_func.__name__
    pipeline_func.__doc__ = pipe.description or None
    pipeline_func.__signature__ = signature  # type: ignore[attr-defined]
    pipeline_func.__annotations__ = {name: p.annotation for name, p in signature.parameters.items()}
    return dsl.pipeline(name=pipe.name, description=pipe.description or None)(pipeline_func)


@contextmanager
def _pyyaml_default_str_style() -> Iterator[None]:
    """PyYAML's own string style while kfp dumps the IR.

    Importing Hera registers a process-wide ``str`` representer (block style for multi-line
    strings). Without this guard the KFP YAML would depend on whether Hera was imported first;
    with it, ``llmpack compile`` writes exactly what ``kfp dsl compile`` writes.
    """
    import yaml

    classes = [yaml.representer.SafeRepresenter, yaml.representer.Representer, yaml.SafeDumper, yaml.Dumper]
    saved = [(cls, cls.__dict__.get("yaml_representers")) for cls in classes]
    for cls, reps in saved:
        if reps is not None and str in reps:
            cls.yaml_representers = {**reps, str: yaml.representer.SafeRepresenter.represent_str}
    try:
        yield
    finally:
        for cls, reps in saved:
            if reps is not None:
                cls.yaml_representers = reps


def compile_pipeline(pipe: Pipeline, path: str | Path) -> Path:
    """Compile the pipeline object to KFP IR YAML at ``path``; returns the path."""
    from kfp import compiler

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _pyyaml_default_str_style():
        compiler.Compiler().compile(build_kfp_pipeline(pipe), package_path=str(path))
    return path
