"""Build the Argo Workflow for a pipeline object with Hera.

    hera generate yaml argo_workflows/workflow.py --to argo_workflows/finetune.yaml
    argo submit argo_workflows/finetune.yaml -p max_steps=200 -p run_group=...

:func:`build_workflow` compiles any :class:`components.dsl.Pipeline` (never a hand-written copy):
one DAG task and one container template per pipeline task, each running the same command line
every backend runs (:func:`components.commands.step_args`), with Argo placeholders where the
values and artifact directories go. The module-level ``w`` is the fine-tuning pipeline, for the
``hera`` CLI; ``argo_workflows/finetune.yaml`` is its committed output. ``spec.onExit`` runs the
``close-record`` template, which closes the run's record whatever the DAG's outcome.

How a step's :class:`components.dsl.Execution` maps to the cluster (resources, placement, security,
retries without ``maxDuration``, volumes, labels, metrics) and why int-or-string fields are
strings: docs/internals/backend-internals.md, "Argo: the Workflow builder".
"""

from __future__ import annotations

import json
from typing import Any

from components import settings
from components.commands import format_value, step_args
from components.dsl import (
    HF_CACHE_MOUNT,
    OutputRef,
    Pipeline,
    PipelineParamRef,
    Retry,
    Task,
    iter_param_args,
)
from components.gpu_nodes import SHM_MOUNT, SHM_VOLUME, needs_shm, placement, shm_size_limit
from components.podspec import (
    PREEMPTION_MESSAGE,
    PREEMPTION_RETRIES,
    TMP_MOUNT,
    TMP_VOLUME,
    PodExtras,
    grace_fields,
    keeps_checkpoints,
    labels_env,
    pod_labels_of,
    recommended_labels,
    tracking_secret_of,
)
from components.record.close import CLOSE_TASK, billed_uses, record_args, uses_json
from components.record.cost import GpuUse
from components.record.telemetry import TRAIN_STEP
from components.record.tracking import TRACKING_CREDENTIALS, TRACKING_SECRET, TRACKING_URI_KEY
from components.trainjob.rbac import LAUNCHER_SERVICE_ACCOUNT

ORCHESTRATOR = "argo"
IN_DIR = "/tmp/llmpack/in"
OUT_DIR = "/tmp/llmpack/out"
RUN_AS_USER = 1000
# Argo's own init and wait containers keep a token (they write the step's results); the step's own
# container mounts none (``automountServiceAccountToken: false``), but the gang's launcher, which
# runs as the launcher's account (components.trainjob.rbac).
EXECUTOR_SERVICE_ACCOUNT = "default"
# A finished Workflow and its pods are kept this long (ttlStrategy; podGC: a succeeded pod at once, a failed one later).
KEEP_FINISHED_S = 7 * 24 * 3600
# The Workflow's deadline beyond its steps' (with retries and backoff): a stuck controller ends the run.
WORKFLOW_DEADLINE_MARGIN_S = 3600
MLFLOW_SECRET = TRACKING_SECRET
MLFLOW_SECRET_KEY = TRACKING_URI_KEY
from components.labels import LABEL_PREFIX  # noqa: E402 - the one home of the labels

HF_CACHE_VOLUME = "hf-cache"  # the --cache-pvc volume, mounted at components.dsl.HF_CACHE_MOUNT
NO_RETRY_EXIT_CODE = 2  # components.errors.InputError: bad input is not retried
# Defaults of the compiled Workflow that differ from the pipeline's: it is what `argo submit` runs.
ARGO_DEFAULTS: dict[str, Any] = {"orchestrator": ORCHESTRATOR, "mode": "cluster"}
RUN_ID = "{{workflow.name}}"
PIPELINE_RUN = "{{workflow.parameters.pipeline_run}}"  # the run's app.kubernetes.io/instance (cluster submit sets it)
# The run's metrics the exit handler emits: Prometheus name (llmpack_<name>) -> (record metric, help).
RUN_METRICS = {
    "spinup_seconds": ("spinup_s", "Seconds from submit to the training process start (the run's spin-up)."),
    "time_to_first_step_seconds": ("time_to_first_step_s", "Seconds from submit to the run's first training step."),
}
RUN_METRIC_LABELS = ("pipeline_run", "workflow")  # the gauges' per-run labels (never on a histogram)
FINETUNE_BUCKETS = [30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0]


def in_path(name: str) -> str:
    return f"{IN_DIR}/{name}"


def out_path(name: str) -> str:
    return f"{OUT_DIR}/{name}"


def cpu_quantity(cpu: float) -> str:
    """Cores as a Kubernetes quantity: ``8``, ``0.5`` -> ``500m``."""
    if float(cpu).is_integer():
        return str(int(cpu))
    return f"{round(cpu * 1000)}m"


def cap_binds(retry: Retry) -> bool:
    """Whether ``max_backoff_s`` shortens any wait within ``limit`` retries (only then is ``cap`` written).

    ``backoff.cap`` is a recent Argo field; leaving it out where it changes nothing keeps the
    YAML acceptable to older controllers and to ``argo submit``'s strict schema check.
    """
    return any(retry.backoff_s * retry.factor**n > retry.max_backoff_s for n in range(retry.limit))


def workflow_defaults(pipe: Pipeline) -> dict[str, str]:
    """Every workflow argument with the default the compiled Workflow carries."""
    return {
        name: format_value(ARGO_DEFAULTS.get(name, p.default)) for name, p in pipe.all_params.items()
    }


def pod_labels(pipe: Pipeline, task: Task | None, extras: PodExtras) -> dict[str, str]:
    """The labels of a task's pods (``None``: the summarizing task, which holds no GPU): the recommended
    ``app.kubernetes.io/*`` ones (``instance``: the run, a workflow parameter), ``llmpack.io/*`` and the
    user's ``--label``s."""
    res = task.step.execution.resources if task else None
    step = task.step.name if task else CLOSE_TASK
    own = {
        f"{LABEL_PREFIX}step": step,
        f"{LABEL_PREFIX}task": task.name if task else CLOSE_TASK,
        f"{LABEL_PREFIX}orchestrator": ORCHESTRATOR,
        f"{LABEL_PREFIX}mode": "{{workflow.parameters.mode}}",
        f"{LABEL_PREFIX}gpu-type": (res.gpu_type if res else None) or "none",
        f"{LABEL_PREFIX}gpu-count": str(res.gpus if res else 0),
        f"{LABEL_PREFIX}run-group": "{{workflow.parameters.run_group}}",
        f"{LABEL_PREFIX}pipeline-run": PIPELINE_RUN,
    }
    recommended = recommended_labels(name=pipe.name, component=step, managed_by=ORCHESTRATOR, instance=PIPELINE_RUN)
    return pod_labels_of(recommended, own, extras)


def run_metric_labels(use: GpuUse | None) -> list[Any]:
    """The labels every llmpack metric of a run carries: the run (``pipeline_run``, as the pods'
    ``app.kubernetes.io/instance``; ``workflow``, Argo's own name, never empty), so that concurrent runs
    are separate series, and the GPUs billed (``use``: a TrainJob gang's nodes x GPUs)."""
    from hera.workflows import Label

    return [
        *(Label(key=k, value=v) for k, v in zip(RUN_METRIC_LABELS, (PIPELINE_RUN, RUN_ID), strict=True)),
        Label(key="orchestrator", value=ORCHESTRATOR),
        Label(key="gpu_type", value=(use.gpu_type if use else None) or "none"),
        Label(key="gpu_count", value=str(use.gpus if use else 0)),
    ]


def _finetune_metrics(task: Task, use: GpuUse | None) -> list[Any]:
    """Argo's own view of the training node: its duration, live while it runs and when it ends.

    Argo knows when the node started (pod created) but not when the container started, so the
    exact ``spinup_s`` comes from the step's telemetry (MLflow, JSONL) and the pod watcher; these
    give Prometheus the node's wall time, spin-up included, labelled for cost attribution with
    the GPUs the step is billed for (``use``: a TrainJob gang's nodes x GPUs, not its launcher's none).
    """
    from hera.workflows import Gauge, Histogram, Label

    labels = [Label(key="step", value=task.step.name), *run_metric_labels(use)]
    # The histogram is the distribution over runs: a run label would make it one series per run.
    shared = [label for label in labels if label.key not in RUN_METRIC_LABELS]
    return [
        Gauge(
            name="llmpack_finetune_node_seconds",
            help="Seconds since the finetune node started (pod pending, image pull, spin-up, training), live.",
            labels=labels,
            realtime=True,
            value="{{duration}}",
        ),
        Histogram(
            name="llmpack_finetune_node_duration_seconds",
            help="Wall time of the finetune node (pod pending, image pull, spin-up, training) by status.",
            labels=[*shared, Label(key="status", value="{{status}}")],
            buckets=FINETUNE_BUCKETS,
            value="{{duration}}",
        ),
    ]


def tracking_env(secret: str = MLFLOW_SECRET) -> list[Any]:
    """The MLflow Secret (``secret``: ``--tracking-secret``'s) as the MLflow Job maps it: the URI required (no
    Secret, no pod: never a sqlite file in the pod), ``username``/``password``/``token`` each optional."""
    from hera.workflows import SecretEnv

    return [SecretEnv(name="MLFLOW_TRACKING_URI", secret_name=secret, secret_key=MLFLOW_SECRET_KEY),
            *(SecretEnv(name=env, secret_name=secret, secret_key=key, optional=True)
              for key, env in TRACKING_CREDENTIALS.items())]


def _affinity(affinity: dict[str, Any] | None) -> Any:
    """A Kubernetes NodeAffinity dict (components.gpu_nodes) as Hera's model; None stays None."""
    from hera.workflows.models import Affinity, NodeAffinity

    return None if affinity is None else Affinity(node_affinity=NodeAffinity.model_validate(affinity))


def _volumes(ex: Any) -> list[Any] | None:
    """The ``--cache-pvc`` volume, ``--model-pvc``/``--data-pvc`` (read-only), on a pod of several
    GPUs the memory-backed ``/dev/shm`` (bounded), and /tmp (the container's root is read-only)."""
    from hera.workflows import EmptyDirVolume, ExistingVolume

    volumes: list[Any] = []
    if ex.cache_pvc:
        volumes.append(ExistingVolume(name=HF_CACHE_VOLUME, claim_name=ex.cache_pvc, mount_path=HF_CACHE_MOUNT))
    volumes += [ExistingVolume(name=m.volume, claim_name=m.claim, mount_path=m.path, read_only=m.read_only or None)
                for m in ex.pod.mounts]
    if needs_shm(ex.resources.gpus):
        volumes.append(EmptyDirVolume(name=SHM_VOLUME, mount_path=SHM_MOUNT, medium="Memory",
                                      size_limit=shm_size_limit(ex.resources.gpus)))
    volumes.append(EmptyDirVolume(name=TMP_VOLUME, mount_path=TMP_MOUNT))  # the read-only root's one writable place
    return volumes


def retry_strategy(ex: Any) -> tuple[int, str]:
    """``(limit, expression)`` of a step's ``retryStrategy``: bad input (exit 2) is never retried.

    With checkpoints on a volume (``--checkpoint-pvc``) a pod lost to the platform (``lastRetry.message``:
    pod deleted, node shutdown, preemption, eviction) is retried on :data:`~components.podspec.PREEMPTION_RETRIES`
    more tries, and a failure only while fewer than the step's own limit were made: Argo has one retry
    counter, so preemptions cannot be kept out of it, only given room of their own (docs/preemption.md).
    """
    plain = f"asInt(lastRetry.exitCode) != {NO_RETRY_EXIT_CODE}"
    if not keeps_checkpoints(ex.pod):
        return ex.retry.limit, plain
    return (ex.retry.limit + PREEMPTION_RETRIES,
            f"lastRetry.message matches '{PREEMPTION_MESSAGE}' || ({plain} && asInt(retries) < {ex.retry.limit})")


def _container(pipe: Pipeline, task: Task, use: GpuUse | None = None) -> Any:
    from hera.workflows import Artifact, Container, Env, Parameter, Resources, RetryStrategy, SecretEnv
    from hera.workflows.models import Backoff, Capabilities, IntOrString, SecurityContext, Toleration

    from components.trainjob.gang import task_gang

    step = task.step
    ex = step.execution
    res = ex.resources
    launcher = task_gang(pipe, task) is not None
    param_names = [key for key, _ in iter_param_args(task)]
    args = step_args(
        task,
        inputs={name: f"{{{{inputs.artifacts.{name}.path}}}}" for name in step.inputs},
        outputs={name: f"{{{{outputs.artifacts.{name}.path}}}}" for name in step.outputs},
        params={name: f"{{{{inputs.parameters.{name}}}}}" for name in param_names},
    ) + [f"--param=orchestrator_run_id={RUN_ID}"]
    selector, affinity = placement(ex)
    retry = None
    if ex.retry.limit > 0:
        limit, expression = retry_strategy(ex)
        retry = RetryStrategy(
            limit=IntOrString(root=str(limit)),
            retry_policy="Always",
            expression=expression,
            backoff=Backoff(
                duration=f"{ex.retry.backoff_s}s",
                factor=IntOrString(root=format_value(ex.retry.factor)),
                cap=f"{ex.retry.max_backoff_s}s" if cap_binds(ex.retry) else None,
            ),
        )
    return Container(
        name=task.name,
        image=ex.image,
        command=["python"],
        args=args,
        inputs=[
            *(Parameter(name=name) for name in param_names),
            *(Artifact(name=name, path=in_path(name)) for name in step.inputs),
        ],
        outputs=[Artifact(name=name, path=out_path(name)) for name in step.outputs],
        env=[
            *tracking_env(tracking_secret_of(ex.pod, MLFLOW_SECRET)),
            *([Env(name="HF_HOME", value=HF_CACHE_MOUNT)] if ex.cache_pvc else []),
            *(SecretEnv(name=s.env, secret_name=s.secret, secret_key=s.key) for s in ex.pod.secret_env),
            *(Env(name=name, value=value) for name, value in ex.pod.env),  # the checkpoint volume's settings
            *([Env(name=settings.ATTEMPT.name, value="{{retries}}")] if retry else []),  # 0: the first, as locally
        ],
        pod_spec_patch=json.dumps(grace_fields(ex.pod)) if ex.pod.grace_s is not None else None,
        image_pull_policy=ex.pod.pull_policy,
        volumes=_volumes(ex),
        resources=Resources(
            cpu_request=cpu_quantity(res.cpu),
            cpu_limit=cpu_quantity(res.cpu),
            memory_request=res.memory,
            memory_limit=res.memory,
            gpus=res.gpus if res.gpus > 0 else None,
        ),
        security_context=_hardened(SecurityContext, Capabilities),
        # Only the gang's launcher talks to the API, as the launcher's account (trainjob/launcher-rbac.yaml).
        service_account_name=LAUNCHER_SERVICE_ACCOUNT if launcher else None,
        automount_service_account_token=True if launcher else None,
        node_selector=selector or None,
        affinity=_affinity(affinity),
        tolerations=[
            Toleration(key=t.key, operator=t.operator, value=t.value, effect=t.effect) for t in ex.tolerations
        ]
        or None,
        retry_strategy=retry,
        active_deadline_seconds=str(ex.timeout_s),
        labels=pod_labels(pipe, task, ex.pod),
        annotations={"workflows.argoproj.io/description": step.description} if step.description else None,
        metrics=_finetune_metrics(task, use) if step.name == TRAIN_STEP else None,
    )


def _hardened(security_context: Any, capabilities: Any) -> Any:
    """Every step container's context: Pod Security ``restricted`` and a read-only root (/tmp an emptyDir)."""
    return security_context(run_as_non_root=True, run_as_user=RUN_AS_USER, allow_privilege_escalation=False,
                            privileged=False, read_only_root_filesystem=True, capabilities=capabilities(drop=["ALL"]))


def _dag_task(task: Task) -> Any:
    from hera.workflows import Artifact, Parameter
    from hera.workflows import Task as HeraTask

    params = []
    for key, value in iter_param_args(task):
        if isinstance(value, PipelineParamRef):
            params.append(Parameter(name=key, value=f"{{{{workflow.parameters.{value.name}}}}}"))
        else:
            params.append(Parameter(name=key, value=format_value(value)))
    artifacts = [
        Artifact(name=name, from_=f"{{{{tasks.{ref.task}.outputs.artifacts.{ref.output}}}}}")
        for name, ref in task.arguments.items()
        if isinstance(ref, OutputRef)
    ]
    return HeraTask(
        name=task.name,
        template=task.name,
        arguments=[*params, *artifacts],
        dependencies=task.upstream() or None,
    )


def _close_container(pipe: Pipeline) -> Any:
    """The ``onExit`` template: close the run's record with the workflow's final status."""
    from hera.workflows import Container, EmptyDirVolume, Env, Parameter, Resources
    from hera.workflows.models import Capabilities, SecurityContext, ValueFrom

    first = next(iter(pipe.task_order()), None)
    extras = first.step.execution.pod if first else PodExtras()
    gpus = max(billed_uses(pipe), key=lambda u: u.gpus, default=None)  # the run's metrics: labelled with its GPUs
    image = first.step.execution.image if first else None
    args = record_args(
        status="{{workflow.status}}",
        uses=uses_json(billed_uses(pipe)),
        run_id=RUN_ID,
        created_at="{{workflow.creationTimestamp}}",
        params={name: f"{{{{workflow.parameters.{name}}}}}" for name in pipe.all_params},  # the record logs them all
        fuse=pipe.fuse,
    ) + [f"--metric-file={key}={{{{outputs.parameters.{name}.path}}}}" for name, (key, _) in RUN_METRICS.items()]
    return Container(
        name=CLOSE_TASK,
        image=image,
        command=["python"],
        args=args,
        env=[*tracking_env(tracking_secret_of(extras, MLFLOW_SECRET)),
             *(Env(name=k, value=v) for k, v in labels_env(extras).items())],
        image_pull_policy=extras.pull_policy,
        resources=Resources(cpu_request="250m", cpu_limit="250m", memory_request="512Mi", memory_limit="512Mi"),
        security_context=_hardened(SecurityContext, Capabilities),
        volumes=[EmptyDirVolume(name=TMP_VOLUME, mount_path=TMP_MOUNT)],
        labels=pod_labels(pipe, None, extras),
        outputs=[Parameter(name=name, value_from=ValueFrom(path=f"{OUT_DIR}/prometheus/{name}", default=""))
                 for name in RUN_METRICS],
        metrics=_run_metrics(gpus),
    )


def _run_metrics(use: GpuUse | None) -> list[Any]:
    """The run's spin-up and time to first step (``llmpack_<name>``), emitted when the exit handler ends.

    Only the record knows them (measured from the submit instant to the training process start and
    its first step, docs/telemetry-and-cost.md): the exit handler writes each to its output parameter
    (``close --metric-file``); a run that never got there writes nothing and emits nothing (``when``).
    One series per run (its labels), as the live node gauge.
    """
    from hera.workflows import Gauge

    return [
        Gauge(name=f"llmpack_{name}", help=doc, labels=run_metric_labels(use), realtime=False,
              value=f"{{{{outputs.parameters.{name}}}}}", when=f"'{{{{outputs.parameters.{name}}}}}' != ''")
        for name, (_, doc) in RUN_METRICS.items()
    ]


def workflow_deadline_s(pipe: Pipeline) -> int:
    """The Workflow's ``activeDeadlineSeconds``: every step's attempts end to end (each attempt's deadline and
    its longest backoff), plus :data:`WORKFLOW_DEADLINE_MARGIN_S`."""
    total = 0
    for task in pipe.task_order():
        ex = task.step.execution
        attempts = 1 + retry_strategy(ex)[0] if ex.retry.limit > 0 else 1
        total += attempts * (ex.timeout_s + ex.retry.max_backoff_s)
    return total + WORKFLOW_DEADLINE_MARGIN_S


def build_workflow(pipe: Pipeline) -> Any:
    """The Argo Workflow (a ``hera.workflows.Workflow``) for a validated pipeline object.

    Built offline; ``.create()`` finds its server then: Hera's ``global_config.host``, else ``ARGO_SERVER``,
    else one :class:`~components.errors.InputError` line, as :func:`argo_workflows.pipeline.finetune_workflow`.
    """
    from hera.workflows import DAG, Parameter
    from hera.workflows.models import (
        ExecutorConfig,
        LocalObjectReference,
        PodGC,
        PodSecurityContext,
        SeccompProfile,
        TTLStrategy,
    )

    from argo_workflows.service import service_when_used, workflow_class

    pipe.validate()
    order = pipe.task_order()
    dag = DAG(name=pipe.name, tasks=[_dag_task(t) for t in order])
    defaults = workflow_defaults(pipe)
    uses = {u.step: u for u in billed_uses(pipe)}
    pull_secrets = list(dict.fromkeys(n for t in order for n in t.step.execution.pod.pull_secrets))
    return workflow_class()(
        generate_name=f"{pipe.name}-",
        labels={f"{LABEL_PREFIX}pipeline": pipe.name, f"{LABEL_PREFIX}orchestrator": ORCHESTRATOR},
        annotations={"workflows.argoproj.io/description": pipe.description} if pipe.description else None,
        entrypoint=pipe.name,
        on_exit=CLOSE_TASK,
        arguments=[Parameter(name=name, value=value) for name, value in defaults.items()],
        security_context=PodSecurityContext(
            run_as_non_root=True,
            run_as_user=RUN_AS_USER,
            run_as_group=RUN_AS_USER,
            fs_group=RUN_AS_USER,
            seccomp_profile=SeccompProfile(type="RuntimeDefault"),
        ),
        templates=[dag, *(_container(pipe, t, uses.get(t.name)) for t in order), _close_container(pipe)],
        image_pull_secrets=[LocalObjectReference(name=n) for n in pull_secrets] or None,  # every pod of the Workflow
        automount_service_account_token=False,  # the launcher template alone says otherwise
        executor=ExecutorConfig(service_account_name=EXECUTOR_SERVICE_ACCOUNT),
        active_deadline_seconds=workflow_deadline_s(pipe),
        ttl_strategy=TTLStrategy(seconds_after_completion=KEEP_FINISHED_S),
        pod_gc=PodGC(strategy="OnPodSuccess"),
        workflows_service=service_when_used(None),  # not rendered: only .create()/.wait()/.lint() use it
    )


# For `hera generate yaml argo_workflows/workflow.py`: the fine-tuning pipeline's Workflow.
from components.finetune_pipeline import build as _shipped  # noqa: E402 - the pipeline, once the builders exist

w = build_workflow(_shipped())
