"""Pod phases: from Kubernetes pod, node and event objects to one timeline row per pod.

Pure analysis, stdlib only: the inputs are plain dicts in the API's JSON form (camelCase keys),
exactly the ``items`` of ``kubectl get pods|nodes|events -o json`` or the objects of a watch.

Per pod (see :func:`analyze`): who made it (``orchestrator``: kfp, argo, mlflow, unknown), what it
is (``role``: ``driver`` for KFP's own driver pods, ``executor`` for pods that run step code),
which pipeline ``step`` it runs, where (``node``, ``instance_type``, ``gpu_product``), and when, as
UTC epoch seconds: ``created``, ``scheduled``, ``node_ready`` (only when the node was created after
the pod, i.e. brought up for it), ``sandbox_ready``, ``init_done``, ``container_started``,
``finished``; plus ``image_pull_s`` of the main container and the derived ``queue_s``,
``provision_s``, ``start_s`` and ``run_s``. A Kubeflow Trainer TrainJob's node pods (the finetune
gang, :mod:`components.process.gang`) carry ``gang`` (the TrainJob), ``gang_node`` (the node rank) and
``gang_gpus``; other pods None there.

:func:`to_step_records` turns the rows of one pipeline run into the ``components.record.telemetry``
cluster events (``pod_created``, ``pod_scheduled``, ``node_ready``, ``container_started``).
"""

from __future__ import annotations

import calendar
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from components.errors import InputError
from components.record.telemetry import Record, RunContext, make_record
from llmpack.backends import ORCHESTRATORS
from llmpack.k8s import LABEL_PREFIX, ORCHESTRATOR_LABEL, PIPELINE_RUN_LABEL, RUN_GROUP_LABEL, STEP_LABEL

# Orchestrators' own labels and annotations.
KFP_V2_LABEL = "pipelines.kubeflow.org/v2_component"
KFP_RUN_ID_LABEL = "pipeline/runid"
ARGO_WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
ARGO_NODE_NAME = "workflows.argoproj.io/node-name"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"  # NVIDIA GPU feature discovery
GPU_RESOURCE = "nvidia.com/gpu"
SCALE_DOWN_TAINT = "ToBeDeletedByClusterAutoscaler"  # value: unix seconds when the autoscaler began removing it
# A Kubeflow Trainer TrainJob's node pods (components.process.gang): JobSet names its JobSet after the
# TrainJob and labels every pod with it; the Job controller labels (and annotates) each pod of an
# Indexed Job with its completion index, the torch node rank (PET_NODE_RANK).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # label since Kubernetes 1.28, annotation before
POD_GPU_COUNT_LABEL = "llmpack.io/gpu-count"  # on every gang pod (the TrainJob's runtimePatches)

# KFP v2 on Argo: the templates its compiler emits (pod names are <workflow>-<template>-<hash>).
KFP_DRIVER_TEMPLATES = ("system-dag-driver", "system-container-driver")
KFP_EXECUTOR_TEMPLATE = "system-container-impl"

ARGO_HELPER_CONTAINERS = ("wait", "init")
TERMINAL_PHASES = ("Succeeded", "Failed")

# The columns of a row, in order (the JSON of `llmpack timeline --json` has exactly these keys).
ROW_FIELDS = (
    "pod",
    "namespace",
    "orchestrator",
    "role",
    "step",
    "run_group",
    "pipeline_run",
    "orchestrator_run",
    "gang",
    "gang_node",
    "gang_gpus",
    "phase",
    "node",
    "instance_type",
    "gpu_product",
    "created",
    "scheduled",
    "node_ready",
    "sandbox_ready",
    "init_done",
    "container_started",
    "finished",
    "image_pull_s",
    "queue_s",
    "provision_s",
    "start_s",
    "run_s",
)

# Row field -> telemetry event name (components.record.telemetry.CLUSTER_EVENTS).
STEP_EVENT_FIELDS = (
    ("pod_created", "created"),
    ("pod_scheduled", "scheduled"),
    ("node_ready", "node_ready"),
    ("container_started", "container_started"),
)


class DumpError(InputError):
    """A bad field in one object of a dump: ``kind`` (pods|nodes|events) and ``index`` say which.

    :func:`timeline_from_files` rewrites it as ``FILE: items[i] ...``.
    """

    def __init__(self, kind: str, index: int, detail: str) -> None:
        super().__init__(f"{kind}[{index}]{_join(detail)}")
        self.kind = kind
        self.index = index
        self.detail = detail


def _join(detail: str) -> str:
    """``items[3]`` + detail: "(pod ns/x): field ..." gets a space, ": not an object" none."""
    return detail if detail.startswith(":") else " " + detail


# --------------------------------------------------------------------------- time parsing

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:([Zz])|([+-])(\d{2}):?(\d{2}))$"
)


def parse_time(value: Any) -> float | None:
    """RFC3339 (optional fractional seconds, ``Z`` or an offset) to UTC epoch seconds.

    None and "" give None; anything else unparsable raises ``ValueError``.
    """
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(value)
    m = _RFC3339.match(value.strip())
    if not m:
        raise ValueError(value)
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        raise ValueError(value)
    epoch = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if m.group(9):
        offset = int(m.group(10)) * 3600 + int(m.group(11)) * 60
        epoch -= offset if m.group(9) == "+" else -offset
    frac = float(m.group(7)) if m.group(7) else 0.0
    return epoch + frac


_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float | None:
    """Go's ``time.Duration.String()`` ("1m50.874s", "812.5ms", "0s") to seconds; None if not one."""
    text = text.strip().rstrip(".,")
    if not text:
        return None
    pos, total = 0, 0.0
    for m in _GO_DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _GO_UNITS[m.group(2)]
        pos = m.end()
    return total if pos == len(text) and pos > 0 else None


# Kubelet messages, old and new:
#   Successfully pulled image "img" in 1m50.874s (1m50.874s including waiting). Image size: 123 bytes.
#   Successfully pulled image "img" in 12.3s (12.3s including waiting)
#   Successfully pulled image "img" in 12.3s
#   Successfully pulled image "img"                (no duration: use the Pulling -> Pulled times)
#   Container image "img" already present on machine
_PULLED = re.compile(r'Successfully pulled image "[^"]*" in (\S+?)(?: \((\S+) including waiting\))?(?:[.,]?\s|[.,]?$)')
_PRESENT = re.compile(r'^Container image "[^"]*" already present on machine')


def pull_seconds_from_message(message: str) -> float | None:
    """The pull time a kubelet ``Pulled`` message states (including waiting for a pull slot)."""
    if _PRESENT.match(message or ""):
        return 0.0
    m = _PULLED.search(message or "")
    if not m:
        return None
    # "including waiting" is what the pod actually waited; fall back to the pull time alone.
    for group in (m.group(2), m.group(1)):
        if group:
            seconds = parse_go_duration(group)
            if seconds is not None:
                return seconds
    return None


# --------------------------------------------------------------------------- small accessors


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return _get(obj, "metadata", "labels") or {}


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return _get(obj, "metadata", "annotations") or {}


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 6)


class _Where:
    """Builds :class:`DumpError` for one object of a dump."""

    def __init__(self, kind: str, index: int, obj: Mapping[str, Any]) -> None:
        self.kind, self.index = kind, index
        self.label = _label_of(kind, obj) if isinstance(obj, Mapping) else ""

    def error(self, detail: str) -> DumpError:
        return DumpError(self.kind, self.index, f"{self.label}: {detail}" if self.label else f": {detail}")

    def time(self, value: Any, field: str) -> float | None:
        try:
            return parse_time(value)
        except ValueError:
            raise self.error(f"{field} {value!r} is not an RFC3339 time") from None


def _condition(obj: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for cond in _get(obj, "status", "conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == ctype:
            return cond
    return None


def _condition_time(obj: Mapping[str, Any], where: _Where, *types: str) -> float | None:
    """lastTransitionTime of the first of ``types`` present, when its status is True."""
    for ctype in types:
        cond = _condition(obj, ctype)
        if cond is not None:
            if str(cond.get("status")) != "True":
                return None
            return where.time(cond.get("lastTransitionTime"), f"status.conditions[{ctype}].lastTransitionTime")
    return None


# --------------------------------------------------------------------------- classification


def orchestrator_of(pod: Mapping[str, Any]) -> str:
    """kfp | argo | mlflow | unknown: our own label first, then the orchestrators' own marks."""
    labels, annotations = _labels(pod), _annotations(pod)
    own = labels.get(ORCHESTRATOR_LABEL)
    if own:
        return own if own in ORCHESTRATORS else "unknown"
    if labels.get(KFP_V2_LABEL) == "true" or annotations.get(KFP_V2_LABEL) == "true" or KFP_RUN_ID_LABEL in labels:
        return "kfp"
    if ARGO_WORKFLOW_LABEL in labels:
        return "argo"
    if any(k in labels for k in JOB_NAME_LABELS) and _has_mlflow_env(pod):
        return "mlflow"
    return "unknown"


def _has_mlflow_env(pod: Mapping[str, Any]) -> bool:
    for container in _get(pod, "spec", "containers") or ():
        for env in container.get("env") or ():
            if isinstance(env, Mapping) and str(env.get("name", "")).startswith("MLFLOW_RUN_ID"):
                return True
    return False


def is_llmpack_pod(pod: Mapping[str, Any]) -> bool:
    return any(k.startswith(LABEL_PREFIX) for k in _labels(pod))


def _node_name_parts(pod: Mapping[str, Any]) -> list[str]:
    """The Argo node name split on dots, retry/loop suffixes stripped: ['wf', 'root', 'finetune', 'executor']."""
    node_name = _annotations(pod).get(ARGO_NODE_NAME) or ""
    parts = [re.sub(r"(\(\d+\)|\[\d+\])+$", "", p) for p in node_name.split(".")]
    return [p for p in parts if p]


def _kfp_template(pod: Mapping[str, Any]) -> str | None:
    name = _get(pod, "metadata", "name") or ""
    for template in (*KFP_DRIVER_TEMPLATES, KFP_EXECUTOR_TEMPLATE):
        if f"-{template}-" in name or name.endswith(f"-{template}"):
            return template
    return None


def role_of(pod: Mapping[str, Any], orchestrator: str) -> str:
    """``driver`` for KFP v2 driver pods (system-dag-driver, system-container-driver), else ``executor``."""
    if orchestrator != "kfp":
        return "executor"
    template = _kfp_template(pod)
    if template is not None:
        return "driver" if template in KFP_DRIVER_TEMPLATES else "executor"
    parts = _node_name_parts(pod)
    if parts:
        if parts[-1] == "executor":
            return "executor"
        if parts[-1].endswith("-driver"):
            return "driver"
    for container in _get(pod, "spec", "containers") or ():
        if container.get("name") == "main":
            command = container.get("command") or []
            image = str(container.get("image") or "")
            if (command[:1] == ["driver"]) or "kfp-driver" in image:
                return "driver"
    return "executor"


def step_of(pod: Mapping[str, Any], orchestrator: str, role: str) -> str | None:
    """Our ``llmpack.io/step`` label, else the Argo node name's task (KFP: the task the driver serves)."""
    label = _labels(pod).get(STEP_LABEL)
    if label:
        return label
    parts = _node_name_parts(pod)
    if not parts:
        return None
    if orchestrator == "kfp" and parts[-1] == "executor" and len(parts) >= 2:
        return parts[-2]
    last = parts[-1]
    if orchestrator == "kfp" and last.endswith("-driver"):
        return last[: -len("-driver")] or None
    return last if len(parts) > 1 else None


def main_container(pod: Mapping[str, Any]) -> str | None:
    """``main`` (Argo, and KFP which runs on Argo), else the first container that is not Argo's ``wait``."""
    names = [c.get("name") for c in _get(pod, "spec", "containers") or () if isinstance(c, Mapping)]
    if not names:
        names = [c.get("name") for c in _get(pod, "status", "containerStatuses") or () if isinstance(c, Mapping)]
    if "main" in names:
        return "main"
    for name in names:
        if name not in ARGO_HELPER_CONTAINERS:
            return name
    return None


def _container_status(pod: Mapping[str, Any], name: str | None) -> Mapping[str, Any] | None:
    for status in _get(pod, "status", "containerStatuses") or ():
        if isinstance(status, Mapping) and status.get("name") == name:
            return status
    return None


def _container_times(pod: Mapping[str, Any], name: str | None, where: _Where) -> tuple[float | None, float | None]:
    """(first start, finish) of a container, from state and lastState (restarts keep the first start)."""
    status = _container_status(pod, name)
    if status is None:
        return None, None
    field = f"status.containerStatuses[{name}]"
    starts = []
    for which in ("state", "lastState"):
        for sub in ("running", "terminated"):
            t = where.time(_get(status, which, sub, "startedAt"), f"{field}.{which}.{sub}.startedAt")
            if t is not None:
                starts.append(t)
    finished = where.time(_get(status, "state", "terminated", "finishedAt"), f"{field}.state.terminated.finishedAt")
    return (min(starts) if starts else None), finished


# --------------------------------------------------------------------------- events


def _event_time(event: Mapping[str, Any], where: _Where) -> float | None:
    """When an event first happened: eventTime (micro time) else firstTimestamp else lastTimestamp."""
    for field in ("eventTime", "firstTimestamp", "lastTimestamp"):
        t = where.time(event.get(field), field)
        if t is not None:
            return t
    return None


def _container_of_field_path(field_path: str | None) -> str | None:
    m = re.match(r"^spec\.(?:initContainers|containers|ephemeralContainers)\{([^}]*)\}$", field_path or "")
    return m.group(1) if m else None


class _PullIndex:
    """Image-pull times per (namespace, pod, container), from Pulling/Pulled events."""

    def __init__(self, events: Sequence[Mapping[str, Any]]) -> None:
        # (ns, pod) -> container -> {"pulling": t, "pulled": t, "stated": seconds, "uid": uid}
        self.by_pod: dict[tuple[str, str], dict[str | None, dict[str, Any]]] = {}
        for i, event in enumerate(events):
            if not isinstance(event, Mapping):
                raise DumpError("events", i, ": not an object")
            reason = event.get("reason")
            if reason not in ("Pulling", "Pulled"):
                continue
            obj = event.get("involvedObject") or event.get("regarding") or {}
            if obj.get("kind", "Pod") != "Pod" or not obj.get("name"):
                continue
            where = _Where("events", i, event)
            ns = obj.get("namespace") or _get(event, "metadata", "namespace") or ""
            container = _container_of_field_path(obj.get("fieldPath"))
            slot = self.by_pod.setdefault((ns, obj["name"]), {}).setdefault(container, {"uid": obj.get("uid")})
            t = _event_time(event, where)
            if reason == "Pulling":
                if t is not None and (slot.get("pulling") is None or t < slot["pulling"]):
                    slot["pulling"] = t
            else:
                if t is not None and (slot.get("pulled") is None or t < slot["pulled"]):
                    slot["pulled"] = t
                stated = pull_seconds_from_message(str(event.get("message") or ""))
                if stated is not None and "stated" not in slot:
                    slot["stated"] = stated

    def seconds(self, namespace: str, pod: str, uid: str | None, container: str | None) -> float | None:
        slots = self.by_pod.get((namespace, pod))
        if not slots:
            return None
        slots = {c: s for c, s in slots.items() if not (uid and s.get("uid") and s["uid"] != uid)}
        if container in slots:
            chosen = [slots[container]]
        elif set(slots) == {None}:  # events without fieldPath: the pod's pulls together
            chosen = [slots[None]]
        else:
            return None
        total, found = 0.0, False
        for slot in chosen:
            value = slot.get("stated")
            if value is None and slot.get("pulling") is not None and slot.get("pulled") is not None:
                value = max(0.0, slot["pulled"] - slot["pulling"])
            if value is not None:
                total, found = total + value, True
        return round(total, 6) if found else None


# --------------------------------------------------------------------------- analysis


# The fields analysis reads and the JSON type each must have where present (null counts as absent).
# A dump from kubectl always fits; a hand-edited or foreign one gets one line naming the field.
_SHAPES: dict[str, tuple[tuple[str, type], ...]] = {
    "common": (("metadata", Mapping), ("metadata.name", str), ("metadata.namespace", str), ("metadata.uid", str),
               ("metadata.labels", Mapping), ("metadata.annotations", Mapping), ("spec", Mapping),
               ("status", Mapping), ("status.conditions", list)),
    "pods": (("spec.nodeName", str), ("spec.containers", list), ("status.phase", str),
             ("status.containerStatuses", list)),
    "nodes": (),
    "events": (("involvedObject", Mapping), ("regarding", Mapping), ("involvedObject.name", str),
               ("regarding.name", str), ("involvedObject.namespace", str), ("regarding.namespace", str),
               ("involvedObject.uid", str), ("regarding.uid", str), ("involvedObject.fieldPath", str),
               ("regarding.fieldPath", str)),
}
_CONTAINER_SHAPE: tuple[tuple[str, type], ...] = (("name", str), ("image", str), ("command", list), ("env", list))


_JSON_NAMES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (str, "string"), (int, "number"), (float, "number"), (Mapping, "object"), (list, "array"),
)


def _a(name: str) -> str:
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _json_name(value: Any) -> str:
    """``string``, ``object``, ``number``...: the JSON type of a parsed value."""
    if value is None:
        return "null"
    return next((name for typ, name in _JSON_NAMES if isinstance(value, typ)), type(value).__name__)


def _wrong_type(obj: Any, fields: Iterable[tuple[str, type]], prefix: str = "") -> str | None:
    for path, typ in fields:
        value = _get(obj, *path.split("."))
        if value is not None and not isinstance(value, typ):
            expected = next(name for t, name in _JSON_NAMES if t is typ)
            return f"{prefix}{path} is {_a(_json_name(value))}, expected {_a(expected)}"
    return None


def shape_problem(kind: str, obj: Mapping[str, Any]) -> str | None:
    """What makes ``obj`` unfit for analysis as one of ``kind`` (a field of the wrong JSON type), or None."""
    problem = _wrong_type(obj, (*_SHAPES["common"], *_SHAPES[kind]))
    if problem:
        return problem
    for field in ("labels", "annotations"):
        for key, value in (_get(obj, "metadata", field) or {}).items():
            if not isinstance(value, str):
                return f"metadata.{field}[{key!r}] is {_a(_json_name(value))}, expected a string"
    if kind == "pods":
        for j, container in enumerate(_get(obj, "spec", "containers") or ()):
            if not isinstance(container, Mapping):
                return f"spec.containers[{j}] is {_a(_json_name(container))}, expected an object"
            problem = _wrong_type(container, _CONTAINER_SHAPE, f"spec.containers[{j}].")
            if problem:
                return problem
    return None


def _label_of(kind: str, obj: Mapping[str, Any]) -> str:
    """``(pod ns/name)`` when the object has a string name, else nothing."""
    name, ns = _get(obj, "metadata", "name"), _get(obj, "metadata", "namespace")
    if not isinstance(name, str) or not name:
        return ""
    noun = {"pods": "pod", "nodes": "node", "events": "event"}[kind]
    return f"({noun} {ns + '/' if isinstance(ns, str) and ns else ''}{name})"


def _check_objects(kind: str, objs: Sequence[Any], *, named: bool = True) -> None:
    for i, obj in enumerate(objs):
        if not isinstance(obj, Mapping):
            raise DumpError(kind, i, ": not an object")
        if named and not _get(obj, "metadata", "name"):
            raise DumpError(kind, i, ": missing metadata.name")
        problem = shape_problem(kind, obj)
        if problem:
            label = _label_of(kind, obj)
            raise DumpError(kind, i, f"{label}: {problem}" if label else f": {problem}")


def _workflow_keys(pod: Mapping[str, Any]) -> set[tuple[str, str]]:
    labels = _labels(pod)
    ns = _get(pod, "metadata", "namespace") or ""
    keys = set()
    if labels.get(ARGO_WORKFLOW_LABEL):
        keys.add((ns, "wf:" + labels[ARGO_WORKFLOW_LABEL]))
    if labels.get(KFP_RUN_ID_LABEL):
        keys.add((ns, "run:" + labels[KFP_RUN_ID_LABEL]))
    return keys


def gang_of(pod: Mapping[str, Any]) -> tuple[str, int | None, int | None] | None:
    """(TrainJob/JobSet name, node rank, GPUs) of a TrainJob node pod; None for any other pod.

    The node rank is the pod's Indexed-Job completion index (label, else annotation); the GPUs
    its ``llmpack.io/gpu-count`` label (the launcher puts it on the gang's pods).
    """
    labels = _labels(pod)
    name = labels.get(JOBSET_NAME_LABEL)
    if not name:
        return None
    index = _int_or_none(labels.get(JOB_COMPLETION_INDEX, _annotations(pod).get(JOB_COMPLETION_INDEX)))
    return name, index, _int_or_none(labels.get(POD_GPU_COUNT_LABEL))


def orchestrator_run_of(pod: Mapping[str, Any]) -> str | None:
    """The orchestrator's own run id: KFP ``pipeline/runid``, the Argo workflow, the MLflow Job
    (a TrainJob's node pods carry their own Job's name: none of the orchestrator's)."""
    labels = _labels(pod)
    if labels.get(JOBSET_NAME_LABEL):
        return None
    for key in (KFP_RUN_ID_LABEL, ARGO_WORKFLOW_LABEL, *JOB_NAME_LABELS):
        if labels.get(key):
            return labels[key]
    return None


def select_pods(
    pods: Sequence[Mapping[str, Any]], run_group: str | None = None, runs: Mapping[str, str | None] | None = None
) -> list[int]:
    """Indexes of the pods that belong to llmpack runs (of ``run_group`` when given).

    A pod belongs when it carries ``llmpack.io/`` labels (and the run group's label), when its
    orchestrator run id (:func:`orchestrator_run_of`) is one of ``runs``, or when it is an
    orchestrator's own pod (a KFP driver has no pipeline labels) of a workflow that has such a
    pod. A dump with no llmpack-labelled pods at all keeps every orchestrator pod.
    """
    return sorted(_select(pods, run_group, runs))


def _select(
    pods: Sequence[Mapping[str, Any]], run_group: str | None, runs: Mapping[str, str | None] | None
) -> dict[int, dict[str, str | None]]:
    """Selected index -> run_group / pipeline_run to fill in where the pod has no such label.

    KFP pod labels are fixed at compile time, so a KFP pod carries no run group or pipeline run:
    ``runs`` (orchestrator run id -> pipeline_run) says which runs belong to the run group.
    """
    runs = runs or {}
    fills: dict[int, dict[str, str | None]] = {}
    for i, p in enumerate(pods):
        labels, orch_run = _labels(p), orchestrator_run_of(p)
        if orch_run is not None and orch_run in runs:
            fills[i] = {"run_group": labels.get(RUN_GROUP_LABEL) or run_group,
                        "pipeline_run": labels.get(PIPELINE_RUN_LABEL) or runs[orch_run]}
        elif is_llmpack_pod(p) and (run_group is None or labels.get(RUN_GROUP_LABEL) == run_group):
            fills[i] = {"run_group": labels.get(RUN_GROUP_LABEL), "pipeline_run": labels.get(PIPELINE_RUN_LABEL)}
    by_workflow: dict[tuple[str, str], dict[str, str | None]] = {}
    for i in fills:
        for key in _workflow_keys(pods[i]):
            by_workflow.setdefault(key, fills[i])
    members = bool(fills)
    for i, p in enumerate(pods):
        if i in fills or is_llmpack_pod(p) or orchestrator_of(p) == "unknown":
            continue
        matched = next((by_workflow[k] for k in sorted(_workflow_keys(p)) if k in by_workflow), None)
        if matched is not None:
            fills[i] = dict(matched)
        elif not members and run_group is None:
            fills[i] = {"run_group": None, "pipeline_run": None}
    return fills


def analyze(
    pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]] | None = None,
    events: Sequence[Mapping[str, Any]] | None = None,
    *,
    run_group: str | None = None,
    runs: Mapping[str, str | None] | None = None,
) -> list[dict[str, Any]]:
    """One row per llmpack/orchestrator pod (fields :data:`ROW_FIELDS`), sorted by creation time.

    Unrelated pods (system pods, other apps) are left out; see :func:`select_pods` for
    ``run_group`` and ``runs`` (orchestrator run id -> pipeline_run, for KFP pods, which
    cannot carry per-run labels). Bad fields
    raise :class:`DumpError` naming the object (``pods[3] (pod ns/name): field ...``).
    """
    nodes, events = list(nodes or ()), list(events or ())
    _check_objects("pods", pods)
    _check_objects("nodes", nodes)
    _check_objects("events", events, named=False)
    node_by_name = {n["metadata"]["name"]: (i, n) for i, n in enumerate(nodes)}
    pulls = _PullIndex(events)
    rows = []
    for i, fill in sorted(_select(pods, run_group, runs).items()):
        row = _analyze_pod(pods[i], _Where("pods", i, pods[i]), node_by_name, pulls)
        row["run_group"] = row["run_group"] or fill["run_group"]
        row["pipeline_run"] = row["pipeline_run"] or fill["pipeline_run"]
        rows.append(row)
    rows.sort(key=lambda r: (r["created"] is None, r["created"] or 0.0, r["namespace"], r["pod"]))
    return rows


def _analyze_pod(
    pod: Mapping[str, Any],
    where: _Where,
    node_by_name: Mapping[str, tuple[int, Mapping[str, Any]]],
    pulls: _PullIndex,
) -> dict[str, Any]:
    meta = pod["metadata"]
    labels = _labels(pod)
    orchestrator = orchestrator_of(pod)
    role = role_of(pod, orchestrator)
    created = where.time(meta.get("creationTimestamp"), "metadata.creationTimestamp")
    node_name = _get(pod, "spec", "nodeName") or None

    instance_type = gpu_product = node_ready = None
    if node_name and node_name in node_by_name:
        n_index, node = node_by_name[node_name]
        n_where = _Where("nodes", n_index, node)
        n_labels = _labels(node)
        instance_type = next((n_labels[k] for k in INSTANCE_TYPE_LABELS if n_labels.get(k)), None)
        gpu_product = n_labels.get(GPU_PRODUCT_LABEL) or None
        node_created = n_where.time(_get(node, "metadata", "creationTimestamp"), "metadata.creationTimestamp")
        if created is not None and node_created is not None and node_created > created:
            node_ready = _condition_time(node, n_where, "Ready")

    container = main_container(pod)
    started, finished = _container_times(pod, container, where)
    scheduled = _condition_time(pod, where, "PodScheduled")
    gang = gang_of(pod)
    row: dict[str, Any] = {
        "pod": meta["name"],
        "namespace": meta.get("namespace") or "",
        "orchestrator": orchestrator,
        "role": role,
        "step": step_of(pod, orchestrator, role),
        "run_group": labels.get(RUN_GROUP_LABEL),
        "pipeline_run": labels.get(PIPELINE_RUN_LABEL),
        "orchestrator_run": orchestrator_run_of(pod),
        "gang": gang[0] if gang else None,
        "gang_node": gang[1] if gang else None,
        "gang_gpus": gang[2] if gang else None,
        "phase": _get(pod, "status", "phase"),
        "node": node_name,
        "instance_type": instance_type,
        "gpu_product": gpu_product,
        "created": created,
        "scheduled": scheduled,
        "node_ready": node_ready,
        # PodReadyToStartContainers since Kubernetes 1.29; PodHasNetwork was its alpha name.
        "sandbox_ready": _condition_time(pod, where, "PodReadyToStartContainers", "PodHasNetwork"),
        "init_done": _condition_time(pod, where, "Initialized"),
        "container_started": started,
        "finished": finished,
        "image_pull_s": pulls.seconds(meta.get("namespace") or "", meta["name"], meta.get("uid"), container),
        "queue_s": _sub(scheduled, created),
        "provision_s": _sub(node_ready, created),
        "start_s": _sub(started, created),
        "run_s": _sub(finished, started),
    }
    return row


def is_terminal(row: Mapping[str, Any]) -> bool:
    """The pod is done: Succeeded/Failed, or deleted (the watcher sets ``deleted``)."""
    return row.get("phase") in TERMINAL_PHASES or bool(row.get("deleted"))


# --------------------------------------------------------------------------- telemetry records


def _row_matches(row: Mapping[str, Any], ctx: RunContext) -> bool:
    if row.get("run_group") and ctx.run_group and row["run_group"] != ctx.run_group:
        return False
    if row.get("pipeline_run"):
        return row["pipeline_run"] == ctx.pipeline_run
    return row.get("orchestrator") == ctx.orchestrator


# The MLflow Kubernetes Job runs the whole pipeline (the ``main`` entry point) in one pod, labelled
# ``llmpack.io/step=main``: its pod phases are the training step's spin-up.
DEFAULT_STEP_ALIASES = {"main": "finetune"}


def to_step_records(
    rows: Iterable[Mapping[str, Any]],
    ctx: RunContext,
    *,
    steps: Iterable[str] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> list[Record]:
    """Cluster events of one pipeline run as telemetry records, ready for the JSONL sink / MLflow.

    Rows are those of ``ctx``'s pipeline run (``pipeline_run``, from the ``llmpack.io/pipeline-run``
    label or, for KFP pods, from the ``runs`` given to :func:`analyze`; rows with none match on
    orchestrator). A pod's step is renamed through ``aliases`` (default
    :data:`DEFAULT_STEP_ALIASES`: the MLflow Job's ``main`` pod counts as ``finetune``). Per step
    (all, or ``steps``) every executor pod counts, numbered by creation: the first-created is
    attempt 0, a retried pod attempt 1, and so on (records keyed by attempt: a retry never moves
    the first pod's ``pod_created``, and every attempt is billed; see
    :mod:`components.record.telemetry`). A TrainJob's node pods (rows with ``gang``) are not attempts:
    they belong to the attempt of the launcher pod before them (:func:`gang_attempt`) and give
    ``<event>.node<rank>`` records (``node_ready.node1``), one set per node. On a cluster this numbering is the attempt's authority: a retry
    is a fresh pod whose step cannot count its attempts in its own JSONL. KFP driver pods are the
    orchestrator's overhead, not a step, and give no records; ``node_ready`` only appears when a
    node was provisioned for the pod.
    """
    aliases = DEFAULT_STEP_ALIASES if aliases is None else aliases
    wanted = None if steps is None else set(steps)
    pods: dict[str, list[Mapping[str, Any]]] = {}
    gangs: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        step = aliases.get(row.get("step") or "", row.get("step"))
        if not step or row.get("role") == "driver" or not _row_matches(row, ctx):
            continue
        if wanted is not None and step not in wanted:
            continue
        (gangs if row.get("gang") else pods).setdefault(step, []).append(row)
    ordered = {step: sorted(mine, key=_creation_order) for step, mine in pods.items()}
    records = []
    for step in sorted(ordered, key=lambda s: (ordered[s][0].get("created") or 0.0, s)):
        for attempt, row in enumerate(ordered[step]):
            for event, field in STEP_EVENT_FIELDS:
                if row.get(field) is not None:
                    records.append(make_record(ctx, "event", step, event, row[field], attempt))
    for step, mine in sorted(gangs.items()):
        launchers = ordered.get(step, [])
        for row in sorted(mine, key=_creation_order):
            node = row.get("gang_node")
            if node is None:
                continue
            attempt = gang_attempt(row, launchers)
            for event, field in STEP_EVENT_FIELDS:
                if row.get(field) is not None:
                    records.append(make_record(ctx, "event", step, f"{event}.node{node}", row[field], attempt))
    return records


def gang_attempt(row: Mapping[str, Any], launchers: Sequence[Mapping[str, Any]]) -> int:
    """The attempt a TrainJob node pod belongs to: that of the step's last pod (its launcher, or
    the MLflow Job's pod) created before it. A gang's pods are one attempt, never retries."""
    created = _creation_order(row)[0]
    before = [n for n, r in enumerate(launchers) if _creation_order(r)[0] <= created]
    return before[-1] if before else 0


def _creation_order(row: Mapping[str, Any]) -> tuple[float, str]:
    """Pods in the order they were created (one never seen created last), then by name."""
    created = row.get("created")
    return (math.inf if created is None else float(created), str(row.get("pod") or ""))


# --------------------------------------------------------------------------- dumps (files)

_KIND = {"pods": "Pod", "nodes": "Node", "events": "Event"}


def load_dump(path: str | Path, kind: str = "pods") -> list[dict[str, Any]]:
    """The ``items`` of a ``kubectl get <kind> -o json`` dump (a single object is accepted too).

    Raises :class:`InputError` with one line naming the file (and line, item or field).
    """
    if kind not in _KIND:
        raise ValueError(f"kind must be one of {sorted(_KIND)}")
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{name}: file not found") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a directory, expected a 'kubectl get {kind} -o json' file") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InputError(f"{name}: not UTF-8 text; expected 'kubectl get {kind} -o json' output") from None
    if not text.strip():
        raise InputError(f"{name}: empty file; expected 'kubectl get {kind} -o json' output")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}: line {exc.lineno} column {exc.colno}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{name}: JSON nested too deeply to be 'kubectl get {kind} -o json' output") from None
    expected = _KIND[kind]
    if isinstance(data, dict) and data.get("kind") == expected and "items" not in data:
        items: Any = [data]
    elif isinstance(data, dict) and "items" in data:
        items = data["items"]
        if items is None:  # `kubectl get ... -o json` of nothing can print "items": null
            items = []
        if not isinstance(items, list):
            raise InputError(f"{name}: 'items' is a {type(items).__name__}, expected a list of {expected} objects")
    else:
        other = data.get("kind") if isinstance(data, dict) else None
        what = f"a {other} object" if other and not str(other).endswith("List") else "no 'items' list"
        raise InputError(f"{name}: not a 'kubectl get {kind} -o json' dump ({what})")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InputError(f"{name}: items[{i}] is not an object")
        item_kind = item.get("kind")
        if item_kind and item_kind != expected:
            raise InputError(f"{name}: items[{i}] is a {item_kind}, expected a {expected} (is this the {kind} dump?)")
        if not _get(item, "metadata", "name"):
            raise InputError(f"{name}: items[{i}]: missing metadata.name")
        problem = shape_problem(kind, item)
        if problem:
            label = _label_of(kind, item)
            raise InputError(f"{name}: items[{i}]{' ' + label if label else ''}: {problem}")
    return items


def load_pods(path: str | Path) -> list[dict[str, Any]]:
    """Pods of a dump; at least one must be an llmpack or orchestrator (KFP, Argo, MLflow) pod."""
    items = load_dump(path, "pods")
    if not any(is_llmpack_pod(p) or orchestrator_of(p) != "unknown" for p in items):
        raise InputError(
            f"{path}: no llmpack or orchestrator pods among {len(items)} pods "
            f"(no {LABEL_PREFIX} labels, no KFP, Argo or MLflow pods)"
        )
    return items


def load_nodes(path: str | Path) -> list[dict[str, Any]]:
    return load_dump(path, "nodes")


def load_events(path: str | Path) -> list[dict[str, Any]]:
    return load_dump(path, "events")


def timeline_from_files(
    pods: str | Path,
    nodes: str | Path | None = None,
    events: str | Path | None = None,
    *,
    run_group: str | None = None,
    runs: Mapping[str, str | None] | None = None,
) -> list[dict[str, Any]]:
    """``llmpack timeline``: rows from dump files; every error is one line naming the file.

    ``run_group`` keeps that run group's pods; ``runs`` adds pods by orchestrator run id (a KFP
    run id -> its pipeline_run), see :func:`select_pods`.
    """
    files = {"pods": str(pods), "nodes": str(nodes) if nodes else "nodes", "events": str(events) if events else "events"}
    pod_items = load_pods(pods)
    node_items = load_nodes(nodes) if nodes else []
    event_items = load_events(events) if events else []
    try:
        rows = analyze(pod_items, node_items, event_items, run_group=run_group, runs=runs)
    except DumpError as exc:
        raise InputError(f"{files[exc.kind]}: items[{exc.index}]{_join(exc.detail)}") from None
    if not rows:
        if run_group is not None:
            raise InputError(f"{files['pods']}: no pods of run group {run_group!r} (label {RUN_GROUP_LABEL})")
        raise InputError(
            f"{files['pods']}: no llmpack or orchestrator pods among {len(pod_items)} pods "
            f"(no {LABEL_PREFIX} labels, no KFP, Argo or MLflow pods)"
        )
    return rows


# --------------------------------------------------------------------------- output


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of the rows (seconds, one decimal; '-' for not applicable / unknown).

    A TrainJob node pod's step reads ``finetune/node<rank>``: every node of the gang has its row."""
    header = ("POD", "ORCH", "ROLE", "STEP", "NODE TYPE", "QUEUE_S", "PROVISION_S", "PULL_S", "START_S", "RUN_S", "PHASE")
    table = [header]
    for r in rows:
        table.append(
            (
                r["pod"],
                r["orchestrator"],
                r["role"],
                (r["step"] or "-") + ("" if r.get("gang_node") is None else f"/node{r['gang_node']}"),
                r["instance_type"] or "-",
                _fmt_s(r["queue_s"]),
                _fmt_s(r["provision_s"]),
                _fmt_s(r["image_pull_s"]),
                _fmt_s(r["start_s"]),
                _fmt_s(r["run_s"]),
                r["phase"] or "-",
            )
        )
    widths = [max(len(str(line[c])) for line in table) for c in range(len(header))]
    numeric = {5, 6, 7, 8, 9}
    out = []
    for line in table:
        cells = [str(v).rjust(w) if c in numeric else str(v).ljust(w) for c, (v, w) in enumerate(zip(line, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


# --------------------------------------------------------------------------- slim objects (the watcher)


_SLIM_CONDITIONS = ("PodScheduled", "PodReadyToStartContainers", "PodHasNetwork", "Initialized")
_SLIM_LABELS = (KFP_V2_LABEL, KFP_RUN_ID_LABEL, ARGO_WORKFLOW_LABEL, *JOB_NAME_LABELS, JOBSET_NAME_LABEL,
                JOBSET_REPLICATED_JOB_LABEL, JOB_COMPLETION_INDEX)


def _intern(value: Any) -> Any:
    """Share repeated strings (label keys and values, condition types...) between stored pods."""
    return sys.intern(value) if isinstance(value, str) else value


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a pod the analysis reads, nothing else (the watcher keeps one per pod).

    Labels are ours and the orchestrators'; conditions those the phases use; environment
    variables only the name of MLflow's run id (values may hold credentials). Repeated strings
    are interned, so a thousand pods of one run group share them.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}

    def container(c: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": _intern(c.get("name"))}
        if c.get("name") == "main":  # role_of() looks at the main container's image and command
            if c.get("image"):
                out["image"] = _intern(c["image"])
            if c.get("command"):
                out["command"] = [_intern(c["command"][0])]
        if any(str((e or {}).get("name", "")).startswith("MLFLOW_RUN_ID") for e in c.get("env") or ()):
            out["env"] = [{"name": "MLFLOW_RUN_ID"}]
        return out

    def cstatus(st: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": _intern(st.get("name"))}
        for which in ("state", "lastState"):
            state = st.get(which) or {}
            kept = {}
            for sub in ("running", "terminated"):
                if state.get(sub):
                    kept[sub] = {k: v for k, v in state[sub].items() if k in ("startedAt", "finishedAt")}
            if kept:
                out[which] = kept
        return out

    slim_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta}
    if "namespace" in slim_meta:
        slim_meta["namespace"] = _intern(slim_meta["namespace"])
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    labels = {
        _intern(k): _intern(v)
        for k, v in (meta.get("labels") or {}).items()
        if k.startswith(LABEL_PREFIX) or k in _SLIM_LABELS
    }
    if labels:
        slim_meta["labels"] = labels
    annotations = {
        _intern(k): v for k, v in (meta.get("annotations") or {}).items()
        if k in (ARGO_NODE_NAME, KFP_V2_LABEL, JOB_COMPLETION_INDEX)
    }
    if annotations:
        slim_meta["annotations"] = annotations
    return {
        "metadata": slim_meta,
        "spec": {
            "nodeName": _intern(spec.get("nodeName")),
            "containers": [container(c) for c in spec.get("containers") or ()],
        },
        "status": {
            "phase": _intern(status.get("phase")),
            "conditions": [
                {"type": _intern(c.get("type")), "status": _intern(c.get("status")), "lastTransitionTime": c.get("lastTransitionTime")}
                for c in status.get("conditions") or ()
                if c.get("type") in _SLIM_CONDITIONS
            ],
            "containerStatuses": [cstatus(st) for st in status.get("containerStatuses") or ()],
        },
    }


def slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """What the phases and node billing read: labels, Ready, GPU capacity, and signs of removal."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    keep = (*INSTANCE_TYPE_LABELS, GPU_PRODUCT_LABEL, GPU_COUNT_LABEL)
    slim_meta = {
        "name": meta.get("name"),
        "creationTimestamp": meta.get("creationTimestamp"),
        "labels": {k: labels[k] for k in keep if k in labels},
    }
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    taints = [{k: t.get(k) for k in ("key", "value", "timeAdded")} for t in _get(node, "spec", "taints") or ()
              if isinstance(t, Mapping) and t.get("key") == SCALE_DOWN_TAINT]
    capacity = _get(node, "status", "capacity") or {}
    status: dict[str, Any] = {
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "lastTransitionTime")}
            for c in _get(node, "status", "conditions") or ()
            if c.get("type") == "Ready"
        ]
    }
    if GPU_RESOURCE in capacity:
        status["capacity"] = {GPU_RESOURCE: capacity[GPU_RESOURCE]}
    return {"metadata": slim_meta, **({"spec": {"taints": taints}} if taints else {}), "status": status}


def _int_or_none(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _lenient_time(value: Any) -> float | None:
    try:
        return parse_time(value)
    except ValueError:
        return None


def node_facts(node: Mapping[str, Any]) -> dict[str, Any]:
    """``name``, ``gpus`` (``status.capacity`` of ``nvidia.com/gpu``, else GFD's
    ``nvidia.com/gpu.count`` label, else None), ``created``, ``ready`` and ``removed`` (epoch s).

    ``removed`` is the node's ``deletionTimestamp`` (a node with a finalizer, as Karpenter sets,
    stays visible while its instance terminates), else the time in the cluster-autoscaler's
    ``ToBeDeletedByClusterAutoscaler`` taint (set just before it deletes the node), else None.
    Unparsable times are None here (billing falls back), never an error.
    """
    meta = node.get("metadata") or {}
    gpus = _int_or_none((_get(node, "status", "capacity") or {}).get(GPU_RESOURCE))
    if gpus is None:
        gpus = _int_or_none((meta.get("labels") or {}).get(GPU_COUNT_LABEL))
    ready = None
    cond = _condition(node, "Ready")
    if cond is not None and str(cond.get("status")) == "True":
        ready = _lenient_time(cond.get("lastTransitionTime"))
    removed = _lenient_time(meta.get("deletionTimestamp"))
    if removed is None:
        for taint in _get(node, "spec", "taints") or ():
            if isinstance(taint, Mapping) and taint.get("key") == SCALE_DOWN_TAINT:
                removed = _lenient_time(taint.get("timeAdded"))
                if removed is None and _int_or_none(taint.get("value")) is not None:
                    removed = float(int(str(taint["value"])))  # the autoscaler writes unix seconds
    return {"name": meta.get("name"), "gpus": gpus, "created": _lenient_time(meta.get("creationTimestamp")),
            "ready": ready, "removed": removed}


def slim_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an event the image-pull analysis reads (the message only of ``Pulled``)."""
    obj = event.get("involvedObject") or event.get("regarding") or {}
    reason = event.get("reason")
    return {
        "metadata": {"name": _get(event, "metadata", "name"), "namespace": _intern(_get(event, "metadata", "namespace"))},
        "reason": _intern(reason),
        "message": (event.get("message") or event.get("note")) if reason == "Pulled" else None,
        "involvedObject": {k: _intern(obj.get(k)) for k in ("kind", "name", "namespace", "uid", "fieldPath")},
        "eventTime": event.get("eventTime"),
        "firstTimestamp": event.get("firstTimestamp"),
        "lastTimestamp": event.get("lastTimestamp"),
    }
