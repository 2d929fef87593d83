"""Slim objects for the watcher: pods, nodes and events trimmed to the fields the analysis reads.

A watch of a long run group keeps every pod it saw; storing whole API objects would grow without
need. :func:`slim_pod`, :func:`slim_node` and :func:`slim_event` keep what
:func:`~llmpack.cluster.k8s.podphases.analyze` and node billing read (repeated strings interned), and
:func:`node_facts` is a node's billing facts.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping
from typing import Any

from llmpack.backends import all_pod_marks
from llmpack.cluster.k8s import LABEL_PREFIX
from llmpack.cluster.k8s.objects import (
    CAPACITY_TYPE_LABELS,
    GPU_COUNT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    INSTANCE_TYPE_LABELS,
    JOB_COMPLETION_INDEX,
    JOBSET_NAME_LABEL,
    JOBSET_REPLICATED_JOB_LABEL,
    SCALE_DOWN_TAINT,
    condition_of,
    dig,
    int_or_none,
    parse_time,
)
from llmpack.cluster.k8s.preemption import DISRUPTION_CONDITION, TERMINATION_TAINTS

# --------------------------------------------------------------------------- slim objects


_SLIM_CONDITIONS = ("PodScheduled", "PodReadyToStartContainers", "PodHasNetwork", "Initialized", DISRUPTION_CONDITION)


@functools.cache
def _kept() -> tuple[frozenset[str], frozenset[str], tuple[str, ...]]:
    """(labels, annotations, variable-name prefixes) a slim pod keeps: the orchestrators' own (the registry's)
    and the gang's; worked out once, the watcher slims thousands of pods."""
    marks = all_pod_marks()
    labels = frozenset((*marks.labels(), JOBSET_NAME_LABEL, JOBSET_REPLICATED_JOB_LABEL, JOB_COMPLETION_INDEX))
    annotations = frozenset((*marks.node_annotations, *marks.keep_annotations, JOB_COMPLETION_INDEX))
    return labels, annotations, marks.keep_env


def _intern(value: Any) -> Any:
    """Share repeated strings (label keys and values, condition types...) between stored pods."""
    return sys.intern(value) if isinstance(value, str) else value


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a pod the analysis reads, nothing else (the watcher keeps one per pod).

    Labels are ours and the orchestrators'; conditions those the phases use; environment
    variables only the name prefixes the orchestrators' marks read (MLflow's run id; values may
    hold credentials). Repeated strings are interned, so a thousand pods of one run group share them.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    kept_labels, kept_annotations, kept_env = _kept()

    def container(c: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": _intern(c.get("name"))}
        if c.get("name") == "main":  # role_of() looks at the main container's image and command
            if c.get("image"):
                out["image"] = _intern(c["image"])
            if c.get("command"):
                out["command"] = [_intern(c["command"][0])]
        env = [{"name": prefix} for prefix in kept_env
               if any(str((e or {}).get("name", "")).startswith(prefix) for e in c.get("env") or ())]
        if env:
            out["env"] = env
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
        if k.startswith(LABEL_PREFIX) or k in kept_labels
    }
    if labels:
        slim_meta["labels"] = labels
    annotations = {
        _intern(k): v for k, v in (meta.get("annotations") or {}).items()
        if k in kept_annotations
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
            "conditions": [_slim_condition(c) for c in status.get("conditions") or ()
                           if c.get("type") in _SLIM_CONDITIONS],
            "containerStatuses": [cstatus(st) for st in status.get("containerStatuses") or ()],
        },
    }


def _slim_condition(c: Mapping[str, Any]) -> dict[str, Any]:
    """type, status and time; a ``DisruptionTarget``'s reason too (who took the pod: a preemption's cause)."""
    out = {"type": _intern(c.get("type")), "status": _intern(c.get("status")),
           "lastTransitionTime": c.get("lastTransitionTime")}
    if c.get("type") == DISRUPTION_CONDITION:
        out["reason"] = _intern(c.get("reason"))
    return out


def slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """What the phases and node billing read: labels, Ready, GPU capacity, and signs of removal
    (the scale-down and termination taints: a node going away under a running pod preempts it)."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    keep = (*INSTANCE_TYPE_LABELS, GPU_PRODUCT_LABEL, GPU_COUNT_LABEL, *CAPACITY_TYPE_LABELS)
    slim_meta = {
        "name": meta.get("name"),
        "creationTimestamp": meta.get("creationTimestamp"),
        "labels": {k: labels[k] for k in keep if k in labels},
    }
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    taints = [{k: t.get(k) for k in ("key", "value", "timeAdded")} for t in dig(node, "spec", "taints") or ()
              if isinstance(t, Mapping) and (t.get("key") == SCALE_DOWN_TAINT or t.get("key") in TERMINATION_TAINTS)]
    capacity = dig(node, "status", "capacity") or {}
    status: dict[str, Any] = {
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "lastTransitionTime")}
            for c in dig(node, "status", "conditions") or ()
            if c.get("type") == "Ready"
        ]
    }
    if GPU_RESOURCE in capacity:
        status["capacity"] = {GPU_RESOURCE: capacity[GPU_RESOURCE]}
    return {"metadata": slim_meta, **({"spec": {"taints": taints}} if taints else {}), "status": status}


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
    gpus = int_or_none((dig(node, "status", "capacity") or {}).get(GPU_RESOURCE))
    if gpus is None:
        gpus = int_or_none((meta.get("labels") or {}).get(GPU_COUNT_LABEL))
    ready = None
    cond = condition_of(node, "Ready")
    if cond is not None and str(cond.get("status")) == "True":
        ready = _lenient_time(cond.get("lastTransitionTime"))
    removed = _lenient_time(meta.get("deletionTimestamp"))
    if removed is None:
        for taint in dig(node, "spec", "taints") or ():
            if isinstance(taint, Mapping) and taint.get("key") == SCALE_DOWN_TAINT:
                removed = _lenient_time(taint.get("timeAdded"))
                if removed is None and int_or_none(taint.get("value")) is not None:
                    removed = float(int(str(taint["value"])))  # the autoscaler writes unix seconds
    return {"name": meta.get("name"), "gpus": gpus, "created": _lenient_time(meta.get("creationTimestamp")),
            "ready": ready, "removed": removed}


def slim_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an event the image-pull analysis reads (the message only of ``Pulled``)."""
    obj = event.get("involvedObject") or event.get("regarding") or {}
    reason = event.get("reason")
    return {
        "metadata": {"name": dig(event, "metadata", "name"), "namespace": _intern(dig(event, "metadata", "namespace"))},
        "reason": _intern(reason),
        "message": (event.get("message") or event.get("note")) if reason == "Pulled" else None,
        "involvedObject": {k: _intern(obj.get(k)) for k in ("kind", "name", "namespace", "uid", "fieldPath")},
        "eventTime": event.get("eventTime"),
        "firstTimestamp": event.get("firstTimestamp"),
        "lastTimestamp": event.get("lastTimestamp"),
    }
