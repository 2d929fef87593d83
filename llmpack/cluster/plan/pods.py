"""What a compiled file's pods ask for, read for ``--plan`` (:mod:`llmpack.cluster.plan.record`): only pods as
``llmpack compile`` writes them.

The check is a list of what is allowed, not a search for what is not: every part of the file that makes, multiplies
or places a pod must be one of the forms the compilers write (Argo: ``dag`` and ``container`` templates, tasks
without fan-out or references elsewhere; KFP: container executors and their Kubernetes platform spec; MLflow: the
Job template beside ``kubernetes_config.json``, one pod of one container), each GPU pod must ask for no more GPUs
than the closing task's ``--uses`` bill, and each GPU pod's node affinity must be exactly the billed GPU type's
(:func:`components.gpu_nodes.node_affinity`). Anything else is one line and nothing is sent: what cannot be read as
compiled is never taken as fitting a budget. Rounds 26 to 28 of issue 46 found nine hand edits (sidecars, other
quantity spellings, ``podSpecPatch``, ORed or preferred placement, resource templates, run-time accelerator types)
that a search for bad forms missed; a form not listed here is refused without being understood.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.errors import InputError

GPU = "nvidia.com/gpu"
# A quantity of a sane size: up to 7 digits, a fraction, a small exponent or a suffix (m, k, Ki...).
_QUANTITY = re.compile(r"[0-9]{1,7}(\.[0-9]{1,6})?([eE][0-9]|[a-zA-Z]{1,2})?")
RESOURCE_NAMES = frozenset({"cpu", "memory", "ephemeral-storage", GPU})

# What the compilers write, and what else may be there without changing which pods run, how many, or where.
ARGO_SPEC = frozenset({"activeDeadlineSeconds", "arguments", "automountServiceAccountToken", "entrypoint",
                       "executor", "imagePullSecrets", "onExit", "podGC", "securityContext", "templates",
                       "ttlStrategy", "serviceAccountName", "podMetadata"})
ARGO_TEMPLATE = frozenset({"activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "container", "dag",
                           "inputs", "metadata", "metrics", "name", "outputs", "podSpecPatch", "retryStrategy",
                           "serviceAccountName", "tolerations", "volumes", "nodeSelector"})
ARGO_TASK = frozenset({"arguments", "dependencies", "depends", "name", "template"})
CONTAINER = frozenset({"args", "command", "env", "image", "imagePullPolicy", "resources", "securityContext",
                       "volumeMounts", "name", "workingDir"})
KFP_SPEC = frozenset({"components", "deploymentSpec", "pipelineInfo", "root", "schemaVersion", "sdkVersion",
                      "defaultPipelineRoot"})
KFP_TASK = frozenset({"cachingOptions", "retryPolicy", "triggerPolicy", "dependentTasks", "componentRef", "taskInfo",
                      "inputs"})
KFP_CONTAINER = frozenset({"args", "command", "env", "image", "resources"})
KFP_RESOURCES = frozenset({"accelerator", "cpuLimit", "cpuRequest", "memoryLimit", "memoryRequest",
                           "resourceCpuLimit", "resourceCpuRequest", "resourceMemoryLimit", "resourceMemoryRequest"})
KFP_PLATFORM_EXECUTOR = frozenset({"activeDeadlineSeconds", "emptyDirMounts", "imagePullPolicy", "imagePullSecret",
                                   "nodeAffinity", "podMetadata", "pvcMount", "secretAsEnv", "securityContext",
                                   "tolerations", "nodeSelector", "secretAsVolume", "configMapAsEnv",
                                   "configMapAsVolume", "fieldPathAsEnv"})
JOB_SPEC = frozenset({"activeDeadlineSeconds", "backoffLimit", "podFailurePolicy", "template",
                      "ttlSecondsAfterFinished"})
JOB_POD = frozenset({"affinity", "automountServiceAccountToken", "containers", "imagePullSecrets", "restartPolicy",
                     "securityContext", "serviceAccountName", "terminationGracePeriodSeconds", "tolerations", "volumes",
                     "nodeSelector"})
JOB_TEMPLATE = "kubernetes_job_template.yaml"


@dataclass(frozen=True)
class Pod:
    """One pod the file makes: where it is said, its GPUs, and its node affinity as written (None: none)."""

    where: str
    gpus: int
    affinity: Any


def _not_compiled(where: str, what: str) -> InputError:
    return InputError(f"--plan: {where}: {what}, not as llmpack compile writes it: --plan checks only compiled pods "
                      "(recompile with llmpack compile, or submit without --plan); not submitted")


def _map(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _not_compiled(where, "not a mapping")
    return value


def _only(value: Any, allowed: frozenset[str], where: str) -> Mapping[str, Any]:
    """``value`` as a mapping whose keys are all in ``allowed``; else one line naming the first other key."""
    found = _map(value, where)
    other = sorted(str(k) for k in found if k not in allowed)
    if other:
        raise _not_compiled(where, f"it has {other[0][:60]!r}")
    return found


def gpus(value: Any) -> int:
    """A GPU count as Kubernetes reads it (``8``, ``'8000m'``, ``'8e0'``); a value it cannot read is one line."""
    from kubernetes.utils import parse_quantity

    try:
        if isinstance(value, bool) or not _QUANTITY.fullmatch(str(value)):  # round 28: `1e2000000` took minutes
            raise ValueError
        amount = parse_quantity(value)
        if not amount.is_finite() or amount < 0:
            raise ValueError
        return int(amount.to_integral_value(rounding="ROUND_CEILING"))
    except (ValueError, TypeError, ArithmeticError):
        raise InputError(f"--plan: a GPU count {str(value)[:40]!r} in the compiled pods is not a number of GPUs; "
                         "not submitted") from None


def _container_gpus(container: Any, where: str, allowed: frozenset[str] = CONTAINER) -> int:
    """A container's GPUs (the larger of its limits and requests); other keys or resource names are refused."""
    resources = _only(_only(container, allowed, where).get("resources"), frozenset({"limits", "requests"}),
                      f"{where} resources")
    most = 0
    for key in ("limits", "requests"):
        amounts = _map(resources.get(key), f"{where} resources.{key}")
        other = sorted(str(k) for k in amounts if k not in RESOURCE_NAMES)
        if other:
            raise _not_compiled(where, f"it asks for {other[0][:60]!r}")
        most = max(most, gpus(amounts.get(GPU, 0)))
    return most


def argo_pods(doc: Any) -> list[Pod]:
    """An Argo Workflow's pods: one per container template."""
    if not isinstance(doc, Mapping) or doc.get("kind") != "Workflow":
        raise _not_compiled("the file", "not one Argo Workflow")
    spec = _only(doc.get("spec"), ARGO_SPEC, "the Workflow's spec")
    pods = []
    for template in spec.get("templates") or []:
        name = str(_map(template, "a template").get("name"))[:60]
        where = f"template {name!r}"
        template = _only(template, ARGO_TEMPLATE, where)
        if ("dag" in template) == ("container" in template):
            raise _not_compiled(where, "not one dag or one container")
        for task in _only(template.get("dag"), frozenset({"tasks"}), where).get("tasks") or []:
            _only(task, ARGO_TASK, f"{where}'s task {str(_map(task, where).get('name'))[:60]!r}")
        if "container" in template:
            patch = template.get("podSpecPatch")
            if patch is not None:  # the compiler's only patch: the grace period (--checkpoint-pvc, --grace-period)
                try:
                    fields = json.loads(patch) if isinstance(patch, str) else None
                except ValueError:
                    fields = None
                if not (isinstance(fields, dict) and set(fields) == {"terminationGracePeriodSeconds"}):
                    raise _not_compiled(where, "its podSpecPatch changes more than the grace period")
            pods.append(Pod(where, _container_gpus(template["container"], where),
                            _map(template.get("affinity"), where).get("nodeAffinity")))
    return pods


def _tasks(spec: Mapping[str, Any]) -> None:
    """Every KFP DAG task of the known kinds: no iterator (fan-out) and no other key."""
    for name, component in [("root", spec.get("root")), *_map(spec.get("components"), "components").items()]:
        dag = _only(_map(component, f"component {name!r}").get("dag"), frozenset({"tasks", "outputs"}),
                    f"component {str(name)[:60]!r}")
        for task_name, task in _map(dag.get("tasks"), "tasks").items():
            _only(task, KFP_TASK, f"task {str(task_name)[:60]!r}")


def kfp_pods(docs: Any) -> list[Pod]:
    """A KFP package's pods: one per container executor, placed by its Kubernetes platform spec."""
    docs = docs if isinstance(docs, list) else [docs]
    if not 1 <= len(docs) <= 2:
        raise _not_compiled("the package", f"{len(docs)} documents")
    spec = _only(docs[0], KFP_SPEC, "the pipeline spec")
    _tasks(spec)
    platform = _only(docs[1] if len(docs) == 2 else {}, frozenset({"platforms"}), "the platform spec")
    kubernetes = _only(_only(platform.get("platforms"), frozenset({"kubernetes"}), "platforms").get("kubernetes"),
                       frozenset({"deploymentSpec"}), "platforms.kubernetes")
    placed = _map(_only(kubernetes.get("deploymentSpec"), frozenset({"executors"}), "its deploymentSpec")
                  .get("executors"), "its executors")
    executors = _map(_only(spec.get("deploymentSpec"), frozenset({"executors"}), "deploymentSpec").get("executors"),
                     "executors")
    pods = []
    for name, executor in executors.items():
        where = f"executor {str(name)[:60]!r}"
        container = _only(executor, frozenset({"container"}), where).get("container")
        resources = _only(_only(container, KFP_CONTAINER, where).get("resources"), KFP_RESOURCES, f"{where} resources")
        accelerator = _only(resources.get("accelerator"), frozenset({"count", "type", "resourceCount",
                                                                     "resourceType"}), f"{where} accelerator")
        if any(accelerator.get(k) not in (None, GPU) for k in ("type", "resourceType")):
            raise _not_compiled(where, f"its accelerator type is not {GPU}")
        count = max(gpus(accelerator.get(k) or 0) for k in ("count", "resourceCount"))
        own = _only(placed.get(name), KFP_PLATFORM_EXECUTOR, f"{where} platform spec")
        terms = own.get("nodeAffinity")
        pods.append(Pod(where, count, None if terms is None else
                        {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}))
    return pods


def job_pods(artifact: Path) -> list[Pod]:
    """An MLflow project's pod: its Job template's, the one ``llmpack cluster submit mlflow`` sends (beside
    ``kubernetes_config.json``; a config naming another template is refused here)."""
    from components import yamltext

    config, template = artifact / "kubernetes_config.json", artifact / JOB_TEMPLATE
    try:
        named = _config_template(config) if config.is_file() else None
        if named is not None and Path(str(named)).name != JOB_TEMPLATE:
            raise _not_compiled(f"{artifact.name}/kubernetes_config.json", "it names another Job template")
        if not template.is_file():
            raise _not_compiled(str(artifact.name), f"no {JOB_TEMPLATE}")
        job = yamltext.load_file(template, f"{artifact}: {JOB_TEMPLATE}")
    except OSError as exc:
        raise InputError(f"{artifact}: cannot read its Job template ({exc.strerror or exc})") from None
    where = JOB_TEMPLATE
    job = _only(job, frozenset({"apiVersion", "kind", "metadata", "spec"}), where)
    if job.get("kind") != "Job":
        raise _not_compiled(where, "not a Job")
    pod = _only(_only(_only(job.get("spec"), JOB_SPEC, f"{where} spec").get("template"),
                      frozenset({"metadata", "spec"}), f"{where} pod template").get("spec"), JOB_POD, f"{where} pod")
    containers = pod.get("containers")
    if not isinstance(containers, list) or len(containers) != 1:
        raise _not_compiled(where, "not one container")
    return [Pod(where, _container_gpus(containers[0], where), _map(pod.get("affinity"), where).get("nodeAffinity"))]


def _config_template(config: Path) -> Any:
    """The Job template ``kubernetes_config.json`` names (bounded read); one line when it is not a JSON object."""
    from components import bounded

    data = bounded.read_json(config)
    if not isinstance(data, dict):
        raise _not_compiled(f"{config.parent.name}/{config.name}", "not a JSON object")
    return data.get("kube-job-template-path")


def compiled_pods(artifact: str, compiled: Any) -> list[Pod]:
    """The pods of the compiled artifact ``artifact`` (its documents: ``compiled``), read as the compilers write
    them (:func:`argo_pods`, :func:`kfp_pods`, :func:`job_pods`)."""
    if Path(artifact).is_dir():
        return job_pods(Path(artifact))
    docs = compiled if isinstance(compiled, list) else [compiled]
    if docs and isinstance(docs[0], Mapping) and "apiVersion" in docs[0]:
        if len(docs) != 1:
            raise _not_compiled("the file", f"{len(docs)} documents, not one Argo Workflow")
        return argo_pods(docs[0])
    return kfp_pods(docs)


def check_pods(artifact: str, compiled: Any, gpu_type: str | None, per_pod: int) -> None:
    """Refuse a file whose pods are not as compiled, ask for more GPUs a pod than its ``--uses`` bill, or whose GPU
    pods are not each placed exactly on the billed GPU type's nodes (rounds 26 to 28)."""
    from components.gpu_nodes import node_affinity

    expected = node_affinity(gpu_type)
    for pod in compiled_pods(artifact, compiled):
        if pod.gpus > per_pod:
            raise InputError(f"--plan: {artifact}'s {pod.where} asks for {pod.gpus} GPUs a pod, its closing task's "
                             f"--uses bill {per_pod}: not as llmpack compile wrote it; not submitted")
        if pod.gpus and expected is not None and pod.affinity != expected:
            raise InputError(f"--plan: {artifact}'s {pod.where} is not placed on {gpu_type} nodes only as its --uses "
                             "bill (its node affinity is not the one llmpack compile writes for that type); "
                             "not submitted")
