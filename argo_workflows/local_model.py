"""The part of Argo's Workflow model the local executor (:mod:`argo_workflows.local`) accepts, checked.

Templates, retry strategies and DAG tasks as read from a compiled Workflow YAML: the fields a local
run uses, the cluster-only ones it accepts and ignores, and a one-line :class:`InputError` naming
anything else and where it is. Split from :mod:`argo_workflows.local` (which plans and runs them).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from components.commands import format_value
from components.errors import InputError

PREFIX = "argo local executor"
MAX_LOCAL_BACKOFF_S = 1.0

PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}")
RETRY_EXPRESSION = re.compile(r"^\s*asInt\(\s*lastRetry\.exitCode\s*\)\s*(==|!=|<=|>=|<|>)\s*(-?\d+)\s*$")
# The finetune template's with a checkpoint volume (argo_workflows.workflow.retry_strategy): a pod lost to the
# platform is retried, a failure only while fewer than N retries were made. Locally no pod is ever lost.
PREEMPTION_RETRY_EXPRESSION = re.compile(
    r"^\s*lastRetry\.message\s+matches\s+'[^']*'\s*\|\|\s*\(\s*asInt\(\s*lastRetry\.exitCode\s*\)\s*(==|!=|<=|>=|<|>)"
    r"\s*(-?\d+)\s*&&\s*asInt\(\s*retries\s*\)\s*<\s*(\d+)\s*\)\s*$")
COMPARE: dict[str, Callable[[int, int], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
DURATION_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

# Keys the executor understands (run) or knows to have no local effect (cluster-only).
# Any other key is refused: running a Workflow while silently dropping part of it would lie.
WORKFLOW_KEYS = {"apiVersion", "kind", "metadata", "spec", "status"}
SPEC_RUN = {"entrypoint", "arguments", "templates", "onExit"}
SPEC_CLUSTER = {
    "securityContext", "serviceAccountName", "nodeSelector", "tolerations", "affinity", "podGC",
    "ttlStrategy", "metrics", "podMetadata", "imagePullSecrets", "priorityClassName", "podPriorityClassName",
    "schedulerName", "archiveLogs", "artifactRepositoryRef", "podDisruptionBudget",
    "automountServiceAccountToken", "executor", "dnsPolicy", "dnsConfig", "hostAliases", "hostNetwork",
    "activeDeadlineSeconds", "parallelism", "workflowMetadata", "artifactGC", "synchronization", "priority",
}  # fmt: skip
TEMPLATE_RUN = {"name", "inputs", "outputs", "container", "dag", "retryStrategy"}
TEMPLATE_CLUSTER = {
    "metadata", "activeDeadlineSeconds", "nodeSelector", "tolerations", "securityContext", "metrics",
    "affinity", "priorityClassName", "serviceAccountName", "schedulerName", "automountServiceAccountToken",
    "archiveLocation", "failFast", "parallelism", "synchronization", "executor", "hostAliases", "timeout",
    "priority", "podSpecPatch",  # podSpecPatch: only terminationGracePeriodSeconds (--checkpoint-pvc, --grace-period)
}  # fmt: skip
# The template kinds Argo has, named so a refusal says what the YAML asked for.
TEMPLATE_KINDS = {
    "steps": "steps templates",
    "script": "script templates",
    "resource": "resource templates",
    "suspend": "suspend templates",
    "containerSet": "containerSet templates",
    "data": "data templates",
    "http": "http templates",
    "plugin": "plugin templates",
}
CONTAINER_RUN = {"command", "args", "env"}
CONTAINER_CLUSTER = {
    "name", "image", "imagePullPolicy", "resources", "securityContext", "livenessProbe", "readinessProbe",
    "startupProbe", "terminationMessagePath", "terminationMessagePolicy", "resizePolicy",
}  # fmt: skip
DAG_TASK_RUN = {"name", "template", "arguments", "dependencies"}


def shm_only(volumes: Any, mounts: bool = False) -> bool:
    """Whether a template's ``volumes`` (or a container's ``volumeMounts``) are only pod scratch space: the
    memory-backed ``/dev/shm`` of a multi-GPU pod (components.gpu_nodes) and the /tmp of a read-only root
    (components.podspec). Cluster-only: a local process has the host's."""
    from components.gpu_nodes import SHM_MOUNT, SHM_VOLUME
    from components.podspec import TMP_MOUNT, TMP_VOLUME

    scratch = {SHM_VOLUME: SHM_MOUNT, TMP_VOLUME: TMP_MOUNT}
    if not isinstance(volumes, list) or not volumes:
        return False
    if mounts:
        return all(isinstance(m, dict) and set(m) == {"name", "mountPath"} and scratch.get(m["name"]) == m["mountPath"]
                   for m in volumes)
    return all(isinstance(v, dict) and v.get("name") in scratch and set(v) == {"name", "emptyDir"} for v in volumes)
DAG_TASK_NAMED = {
    "withItems": "withItems loops",
    "withParam": "withParam loops",
    "withSequence": "withSequence loops",
    "when": "when-conditions",
    "depends": "depends expressions",
    "onExit": "exit handlers",
    "hooks": "lifecycle hooks",
    "templateRef": "templateRef",
    "inline": "inline templates",
    "continueOn": "continueOn",
}
PYTHONS = {"python", "python3"}


def unsupported(feature: str, where: str) -> InputError:
    return InputError(f"{PREFIX}: unsupported feature {feature} at {where}")


def check_keys(obj: Mapping[str, Any], run: set[str], cluster: set[str], where: str,
                named: Mapping[str, str] | None = None) -> None:
    for key in obj:
        if key in run or key in cluster:
            continue
        feature = (named or {}).get(key, f"'{key}'")
        raise unsupported(feature, f"{where}.{key}")


def seconds(text: Any, where: str) -> float:
    match = DURATION.match(str(text).strip())
    if not match:
        raise InputError(f"{PREFIX}: {where}: cannot read duration {text!r}")
    return float(match.group(1)) * DURATION_UNITS[match.group(2)]


# --------------------------------------------------------------------------- placeholders


def substitute(text: Any, scope: Mapping[str, str], where: str) -> str:
    """Replace every ``{{name}}`` from ``scope``; any other placeholder is refused."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        if name in scope:
            return scope[name]
        if name.startswith("="):
            raise unsupported(f"expression placeholder {match.group(0)}", where)
        if name.startswith(("inputs.", "outputs.", "workflow.parameters.")):
            raise InputError(f"{PREFIX}: undefined placeholder {match.group(0)} at {where}")
        raise unsupported(f"placeholder {match.group(0)}", where)

    return PLACEHOLDER.sub(one, text if isinstance(text, str) else format_value(text))


# --------------------------------------------------------------------------- the parsed workflow


class Template:
    """A container template, checked, with what the executor needs from it."""

    def __init__(self, spec: Mapping[str, Any], where: str) -> None:
        self.where = where
        if not spec.get("name"):
            raise InputError(f"{PREFIX}: {where}: template without a name")
        self.name = str(spec["name"])
        container = spec["container"]
        cwhere = f"{where}.container"
        shm = {"volumeMounts"} if shm_only(container.get("volumeMounts"), mounts=True) else set()
        check_keys(container, CONTAINER_RUN, CONTAINER_CLUSTER | shm, cwhere,
                    {"volumeMounts": "volume mounts", "workingDir": "workingDir", "envFrom": "envFrom",
                     "lifecycle": "lifecycle hooks", "volumeDevices": "volume devices"})
        # (text, where) for every word of command + args, so a bad placeholder is named exactly.
        self.command = [(str(c), f"{cwhere}.command[{i}]") for i, c in enumerate(container.get("command") or [])]
        self.command += [(str(a), f"{cwhere}.args[{i}]") for i, a in enumerate(container.get("args") or [])]
        if not container.get("command"):
            raise unsupported("a container without command (the image's entrypoint)", f"{cwhere}.command")
        if self.command[0][0] not in PYTHONS:
            raise unsupported(f"container command {self.command[0][0]!r} (only python runs locally)",
                               f"{cwhere}.command[0]")
        self.env: dict[str, str] = {}
        for i, var in enumerate(container.get("env") or []):
            ewhere = f"{cwhere}.env[{i}]"
            if "value" in var:
                self.env[str(var["name"])] = format_value(var["value"])
                continue
            value_from = var.get("valueFrom") or {}
            if set(value_from) == {"secretKeyRef"}:
                continue  # the cluster's secret; locally the caller's environment stands in
            raise unsupported(f"env valueFrom {sorted(value_from)}", ewhere)

        inputs = spec.get("inputs") or {}
        check_keys(inputs, {"parameters", "artifacts"}, set(), f"{where}.inputs")
        self.params: dict[str, dict[str, Any]] = {}
        for i, p in enumerate(inputs.get("parameters") or []):
            pwhere = f"{where}.inputs.parameters[{i}]"
            check_keys(p, {"name", "value", "default", "enum"}, {"description"}, pwhere,
                        {"valueFrom": "parameter valueFrom"})
            self.params[str(p["name"])] = p
        self.in_artifacts: list[str] = []
        for i, a in enumerate(inputs.get("artifacts") or []):
            check_keys(a, {"name", "path"}, {"mode", "archive", "recurseMode"}, f"{where}.inputs.artifacts[{i}]",
                        {"optional": "optional artifacts", "from": "template-level artifact from"})
            self.in_artifacts.append(str(a["name"]))

        outputs = spec.get("outputs") or {}
        check_keys(outputs, {"artifacts", "parameters"}, set(), f"{where}.outputs",
                    {"result": "output result", "exitCode": "output exitCode"})
        # Output parameters read from a file (valueFrom.path): locally the file is the task's own, under the
        # workdir; their values feed only metrics (a cluster field), never another task.
        self.out_params: list[str] = []
        for i, p in enumerate(outputs.get("parameters") or []):
            pwhere = f"{where}.outputs.parameters[{i}]"
            check_keys(p, {"name", "valueFrom"}, {"description"}, pwhere, {"globalName": "global parameters"})
            check_keys(p.get("valueFrom") or {}, {"path"}, {"default"}, f"{pwhere}.valueFrom")
            self.out_params.append(str(p["name"]))
        self.out_artifacts: list[str] = []
        for i, a in enumerate(outputs.get("artifacts") or []):
            check_keys(a, {"name", "path"}, {"archive", "mode", "artifactGC", "deleted", "recurseMode"},
                        f"{where}.outputs.artifacts[{i}]",
                        {"optional": "optional artifacts", "globalName": "global artifacts",
                         "fromExpression": "artifact fromExpression"})
            self.out_artifacts.append(str(a["name"]))

        self.retry = Retry(spec.get("retryStrategy"), f"{where}.retryStrategy")


class Retry:
    def __init__(self, spec: Mapping[str, Any] | None, where: str) -> None:
        spec = spec or {}
        check_keys(spec, {"limit", "retryPolicy", "expression", "backoff"}, {"affinity"}, where)
        if spec and "limit" not in spec:
            raise unsupported("retryStrategy without limit (unbounded retries)", where)
        self.limit = int(spec.get("limit", 0))
        policy = spec.get("retryPolicy", "OnFailure")
        if policy not in ("Always", "OnFailure", "OnError", "OnTransientError"):
            raise InputError(f"{PREFIX}: {where}.retryPolicy: unknown policy {policy!r}")
        # A process that exits non-zero is a Failed node; OnError / OnTransientError never retry it.
        self.retries_failures = policy in ("Always", "OnFailure")
        self.condition: Callable[[int, int], bool] = lambda code, attempt: True
        if "expression" in spec:
            match = RETRY_EXPRESSION.match(str(spec["expression"]))
            lost = PREEMPTION_RETRY_EXPRESSION.match(str(spec["expression"]))
            if not match and not lost:
                raise unsupported(f"retry expression {spec['expression']!r}", f"{where}.expression")
            op, bound = COMPARE[(match or lost).group(1)], int((match or lost).group(2))  # type: ignore[union-attr]
            failures = int(lost.group(3)) if lost else self.limit
            self.condition = lambda code, attempt: op(code, bound) and attempt < failures
        backoff = spec.get("backoff") or {}
        check_keys(backoff, {"duration", "factor", "cap", "maxDuration"}, set(), f"{where}.backoff")
        self.duration = seconds(backoff["duration"], f"{where}.backoff.duration") if "duration" in backoff else 0.0
        self.factor = float(backoff.get("factor", 1))
        self.cap = seconds(backoff["cap"], f"{where}.backoff.cap") if "cap" in backoff else None

    def should_retry(self, attempt: int, code: int) -> bool:
        return attempt < self.limit and self.retries_failures and self.condition(code, attempt)

    def delay(self, attempt: int) -> float:
        wait = self.duration * self.factor**attempt
        if self.cap is not None:
            wait = min(wait, self.cap)
        return min(wait, MAX_LOCAL_BACKOFF_S)


class DagTask:
    def __init__(self, spec: Mapping[str, Any], where: str) -> None:
        check_keys(spec, DAG_TASK_RUN, set(), where, DAG_TASK_NAMED)
        self.where = where
        if not spec.get("name") or not spec.get("template"):
            raise InputError(f"{PREFIX}: {where}: a DAG task needs a name and a template")
        self.name = str(spec["name"])
        self.template = str(spec["template"])
        self.dependencies = [str(d) for d in spec.get("dependencies") or []]
        arguments = spec.get("arguments") or {}
        check_keys(arguments, {"parameters", "artifacts"}, set(), f"{where}.arguments")
        self.params: dict[str, Any] = {}
        for i, p in enumerate(arguments.get("parameters") or []):
            check_keys(p, {"name", "value"}, {"description"}, f"{where}.arguments.parameters[{i}]",
                        {"valueFrom": "parameter valueFrom"})
            self.params[str(p["name"])] = p.get("value", "")
        self.artifacts: dict[str, tuple[str, str]] = {}
        for i, a in enumerate(arguments.get("artifacts") or []):
            awhere = f"{where}.arguments.artifacts[{i}]"
            check_keys(a, {"name", "from"}, set(), awhere,
                        {"fromExpression": "artifact fromExpression", "optional": "optional artifacts"})
            if "from" not in a:
                raise unsupported("an artifact argument without from", awhere)
            match = re.fullmatch(r"\{\{\s*tasks\.([^.{}]+)\.outputs\.artifacts\.([^.{}]+)\s*\}\}", str(a["from"]))
            if not match:
                raise unsupported(f"artifact source {a['from']!r}", f"{awhere}.from")
            self.artifacts[str(a["name"])] = (match.group(1), match.group(2))
