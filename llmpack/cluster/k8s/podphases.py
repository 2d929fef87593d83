"""Pod phases: from Kubernetes pod, node and event objects to one timeline row per pod.

Pure analysis, stdlib only, on the API's JSON form (``kubectl get pods|nodes|events -o json`` or a
watch's objects). Per pod (:func:`analyze`): who made it, its role and step, where it ran, when
each phase began (UTC epoch seconds), the derived ``queue_s``, ``provision_s``, ``start_s``,
``run_s``, and how the attempt ended (:mod:`llmpack.cluster.k8s.preemption`); a TrainJob's node pods carry
``gang``, ``gang_node``, ``gang_gpus``. :func:`llmpack.cluster.k8s.step_records.to_step_records` turns one
run's rows into the record's cluster events. Every field: docs/internals/pod-watcher.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from components.backend import Drivers
from llmpack.backends import ORCHESTRATORS, all_pod_marks, orchestrator_of_pod, pod_marks
from llmpack.cluster.k8s import LABEL_PREFIX, ORCHESTRATOR_LABEL, PIPELINE_RUN_LABEL, RUN_GROUP_LABEL, STEP_LABEL
from llmpack.cluster.k8s.objects import (
    GPU_PRODUCT_LABEL,
    INSTANCE_TYPE_LABELS,
    JOB_COMPLETION_INDEX,
    JOBSET_NAME_LABEL,
    POD_GPU_COUNT_LABEL,
    TERMINAL_PHASES,
    Where,
    annotations_of,
    capacity_type,
    check_objects,
    dig,
    int_or_none,
    labels_of,
    minus,
    object_condition_time,
)
from llmpack.cluster.k8s.preemption import attempt_outcome, disruption_fields
from llmpack.cluster.k8s.pulls import PullIndex

# The columns of a row, in order (the JSON of `llmpack cluster timeline --json` has exactly these keys).
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
    "capacity_type",
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
    "outcome",
    "disruption",
    "disrupted_at",
)


# --------------------------------------------------------------------------- classification


def orchestrator_of(pod: Mapping[str, Any]) -> str:
    """kfp | argo | mlflow | unknown: our own label first, then the orchestrators' own marks (the registry's)."""
    own = labels_of(pod).get(ORCHESTRATOR_LABEL)
    if own:
        return own if own in ORCHESTRATORS else "unknown"
    return orchestrator_of_pod(pod)


def is_llmpack_pod(pod: Mapping[str, Any]) -> bool:
    return any(k.startswith(LABEL_PREFIX) for k in labels_of(pod))


def _node_name_parts(pod: Mapping[str, Any]) -> list[str]:
    """The workflow node name (Argo's) split on dots, retry/loop suffixes stripped:
    ['wf', 'root', 'finetune', 'executor']."""
    annotations = annotations_of(pod)
    node_name = next((annotations[k] for k in all_pod_marks().node_annotations if annotations.get(k)), "")
    parts = [re.sub(r"(\(\d+\)|\[\d+\])+$", "", p) for p in node_name.split(".")]
    return [p for p in parts if p]


def _template(pod: Mapping[str, Any], drivers: Drivers) -> str | None:
    name = dig(pod, "metadata", "name") or ""
    for template in (*drivers.templates, *drivers.executor_templates):
        if f"-{template}-" in name or name.endswith(f"-{template}"):
            return template
    return None


def role_of(pod: Mapping[str, Any], orchestrator: str) -> str:
    """``driver`` for an orchestrator's own driver pods (KFP v2: system-dag-driver, system-container-driver),
    else ``executor``."""
    drivers = pod_marks(orchestrator).drivers
    if drivers is None:
        return "executor"
    template = _template(pod, drivers)
    if template is not None:
        return "driver" if template in drivers.templates else "executor"
    parts = _node_name_parts(pod)
    if parts:
        if parts[-1] == drivers.executor_node:
            return "executor"
        if parts[-1].endswith(drivers.node_suffix):
            return "driver"
    for container in dig(pod, "spec", "containers") or ():
        if container.get("name") == "main":
            command = container.get("command") or []
            image = str(container.get("image") or "")
            if (command[:1] == [drivers.command]) or drivers.image in image:
                return "driver"
    return "executor"


def step_of(pod: Mapping[str, Any], orchestrator: str, role: str) -> str | None:
    """Our ``llmpack.io/step`` label, else the workflow node name's task (KFP: the task the driver serves)."""
    label = labels_of(pod).get(STEP_LABEL)
    if label:
        return label
    parts = _node_name_parts(pod)
    if not parts:
        return None
    drivers = pod_marks(orchestrator).drivers
    if drivers is not None and parts[-1] == drivers.executor_node and len(parts) >= 2:
        return parts[-2]
    last = parts[-1]
    if drivers is not None and last.endswith(drivers.node_suffix):
        return last[: -len(drivers.node_suffix)] or None
    return last if len(parts) > 1 else None


def main_container(pod: Mapping[str, Any]) -> str | None:
    """``main`` (Argo, and KFP which runs on Argo), else the first container that is not Argo's ``wait``."""
    names = [c.get("name") for c in dig(pod, "spec", "containers") or () if isinstance(c, Mapping)]
    if not names:
        names = [c.get("name") for c in dig(pod, "status", "containerStatuses") or () if isinstance(c, Mapping)]
    if "main" in names:
        return "main"
    helpers = all_pod_marks().helper_containers
    for name in names:
        if name not in helpers:
            return name
    return None


def _container_status(pod: Mapping[str, Any], name: str | None) -> Mapping[str, Any] | None:
    for status in dig(pod, "status", "containerStatuses") or ():
        if isinstance(status, Mapping) and status.get("name") == name:
            return status
    return None


def _container_times(pod: Mapping[str, Any], name: str | None, where: Where) -> tuple[float | None, float | None]:
    """(first start, finish) of a container, from state and lastState (restarts keep the first start)."""
    status = _container_status(pod, name)
    if status is None:
        return None, None
    field = f"status.containerStatuses[{name}]"
    starts = []
    for which in ("state", "lastState"):
        for sub in ("running", "terminated"):
            t = where.time(dig(status, which, sub, "startedAt"), f"{field}.{which}.{sub}.startedAt")
            if t is not None:
                starts.append(t)
    finished = where.time(dig(status, "state", "terminated", "finishedAt"), f"{field}.state.terminated.finishedAt")
    return (min(starts) if starts else None), finished


def _workflow_keys(pod: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    labels = labels_of(pod)
    ns = dig(pod, "metadata", "namespace") or ""
    keys = set()
    for label in all_pod_marks().workflow_labels:
        if labels.get(label):
            keys.add((ns, label, labels[label]))
    return keys


def gang_of(pod: Mapping[str, Any]) -> tuple[str, int | None, int | None] | None:
    """(TrainJob/JobSet name, node rank, GPUs) of a TrainJob node pod; None for any other pod.

    The node rank is the pod's Indexed-Job completion index (label, else annotation); the GPUs
    its ``llmpack.io/gpu-count`` label (the launcher puts it on the gang's pods).
    """
    labels = labels_of(pod)
    name = labels.get(JOBSET_NAME_LABEL)
    if not name:
        return None
    index = int_or_none(labels.get(JOB_COMPLETION_INDEX, annotations_of(pod).get(JOB_COMPLETION_INDEX)))
    return name, index, int_or_none(labels.get(POD_GPU_COUNT_LABEL))


def orchestrator_run_of(pod: Mapping[str, Any]) -> str | None:
    """The orchestrator's own run id (its :attr:`~components.backend.PodMarks.run_labels`): KFP ``pipeline/runid``,
    the Argo workflow, the MLflow Job (a TrainJob's node pods carry their own Job's name: none of the
    orchestrator's)."""
    labels = labels_of(pod)
    if labels.get(JOBSET_NAME_LABEL):
        return None
    for key in all_pod_marks().run_labels:
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
        labels, orch_run = labels_of(p), orchestrator_run_of(p)
        if orch_run is not None and orch_run in runs:
            fills[i] = {"run_group": labels.get(RUN_GROUP_LABEL) or run_group,
                        "pipeline_run": labels.get(PIPELINE_RUN_LABEL) or runs[orch_run]}
        elif is_llmpack_pod(p) and (run_group is None or labels.get(RUN_GROUP_LABEL) == run_group):
            fills[i] = {"run_group": labels.get(RUN_GROUP_LABEL), "pipeline_run": labels.get(PIPELINE_RUN_LABEL)}
    by_workflow: dict[tuple[str, str, str], dict[str, str | None]] = {}
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
    check_objects("pods", pods)
    check_objects("nodes", nodes)
    check_objects("events", events, named=False)
    node_by_name = {n["metadata"]["name"]: (i, n) for i, n in enumerate(nodes)}
    pulls = PullIndex(events)
    rows = []
    for i, fill in sorted(_select(pods, run_group, runs).items()):
        row = _analyze_pod(pods[i], Where("pods", i, pods[i]), node_by_name, pulls)
        row["run_group"] = row["run_group"] or fill["run_group"]
        row["pipeline_run"] = row["pipeline_run"] or fill["pipeline_run"]
        rows.append(row)
    rows.sort(key=lambda r: (r["created"] is None, r["created"] or 0.0, r["namespace"], r["pod"]))
    return rows


def _analyze_pod(
    pod: Mapping[str, Any],
    where: Where,
    node_by_name: Mapping[str, tuple[int, Mapping[str, Any]]],
    pulls: PullIndex,
) -> dict[str, Any]:
    meta = pod["metadata"]
    labels = labels_of(pod)
    orchestrator = orchestrator_of(pod)
    role = role_of(pod, orchestrator)
    created = where.time(meta.get("creationTimestamp"), "metadata.creationTimestamp")
    node_name = dig(pod, "spec", "nodeName") or None

    instance_type = gpu_product = node_ready = capacity = None
    if node_name and node_name in node_by_name:
        n_index, node = node_by_name[node_name]
        n_where = Where("nodes", n_index, node)
        n_labels = labels_of(node)
        instance_type = next((n_labels[k] for k in INSTANCE_TYPE_LABELS if n_labels.get(k)), None)
        gpu_product = n_labels.get(GPU_PRODUCT_LABEL) or None
        capacity = capacity_type(n_labels)
        node_created = n_where.time(dig(node, "metadata", "creationTimestamp"), "metadata.creationTimestamp")
        if created is not None and node_created is not None and node_created > created:
            node_ready = object_condition_time(node, n_where, "Ready")

    container = main_container(pod)
    started, finished = _container_times(pod, container, where)
    scheduled = object_condition_time(pod, where, "PodScheduled")
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
        "phase": dig(pod, "status", "phase"),
        "node": node_name,
        "instance_type": instance_type,
        "gpu_product": gpu_product,
        "capacity_type": capacity,
        "created": created,
        "scheduled": scheduled,
        "node_ready": node_ready,
        # PodReadyToStartContainers since Kubernetes 1.29; PodHasNetwork was its alpha name.
        "sandbox_ready": object_condition_time(pod, where, "PodReadyToStartContainers", "PodHasNetwork"),
        "init_done": object_condition_time(pod, where, "Initialized"),
        "container_started": started,
        "finished": finished,
        "image_pull_s": pulls.seconds(meta.get("namespace") or "", meta["name"], meta.get("uid"), container),
        "queue_s": minus(scheduled, created),
        "provision_s": minus(node_ready, created),
        "start_s": minus(started, created),
        "run_s": minus(finished, started),
        "outcome": None,
        **disruption_fields(pod, node_by_name[node_name][1] if node_name in node_by_name else None, finished, started),
    }
    row["outcome"] = attempt_outcome(row)
    return row


def is_terminal(row: Mapping[str, Any]) -> bool:
    """The pod is done: Succeeded/Failed, or deleted (the watcher sets ``deleted``)."""
    return row.get("phase") in TERMINAL_PHASES or bool(row.get("deleted"))


# --------------------------------------------------------------------------- stop conditions (the watcher's)


def all_terminated(*, steps: Iterable[str] = (), min_pods: int = 1) -> Callable[[list[dict[str, Any]]], bool]:
    """Stop when ``min_pods`` pods were seen, all are done, and each of ``steps`` has a done pod.

    Between two steps every pod may be done while the next is not yet created: pass the
    pipeline's step names (or call :meth:`~llmpack.cluster.k8s.watcher.PodWatcher.stop` when the orchestrator reports
    the run finished) so the watch does not end early.
    """
    wanted = set(steps)

    def done(rows: list[dict[str, Any]]) -> bool:
        if len(rows) < min_pods or not all(is_terminal(r) for r in rows):
            return False
        have = {r["step"] for r in rows if r.get("role") != "driver" and is_terminal(r)}
        return wanted <= have

    done.requires_all_terminal = True  # type: ignore[attr-defined]  # lets the watcher skip the analysis
    return done
