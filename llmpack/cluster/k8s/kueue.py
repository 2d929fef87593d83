"""Kueue's view of a TrainJob: when its Workload got quota, and when it was admitted.

A queued TrainJob (``llmpack compile --queue``) is suspended until Kueue admits its ``Workload``:
``quota_wait_s`` is Workload created to ``QuotaReserved``, ``admission_checks_s`` from there to
``Admitted``; :func:`evicted` reads Kueue taking the quota back (the gang recorded as preempted).
Without Kueue both are None: it is optional. The newest served version is read (``v1beta2``, then
``v1beta1``). Conditions and versions: docs/internals/pod-watcher.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUP, PLURAL = "kueue.x-k8s.io", "workloads"
VERSIONS = ("v1beta2", "v1beta1")  # newest first
QUOTA_RESERVED, ADMITTED = "QuotaReserved", "Admitted"


def owned_by(workload: Mapping[str, Any], kind: str, name: str) -> bool:
    return any(ref.get("kind") == kind and ref.get("name") == name
               for ref in (workload.get("metadata") or {}).get("ownerReferences") or ())


def condition_time(workload: Mapping[str, Any], kind: str) -> float | None:
    """When condition ``kind`` turned True (its ``lastTransitionTime``), else None."""
    from components.trainjob.launch import parse_time

    for cond in (workload.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def waits(workload: Mapping[str, Any] | None) -> dict[str, float | None]:
    """``quota_wait_s`` and ``admission_checks_s`` of a Workload (None where a time is missing)."""
    from components.trainjob.launch import parse_time

    if workload is None:
        return {"quota_wait_s": None, "admission_checks_s": None}
    created = parse_time((workload.get("metadata") or {}).get("creationTimestamp"))
    quota, admitted = condition_time(workload, QUOTA_RESERVED), condition_time(workload, ADMITTED)
    return {"quota_wait_s": None if created is None or quota is None else quota - created,
            "admission_checks_s": None if quota is None or admitted is None else admitted - quota}


def evicted(workload: Mapping[str, Any] | None) -> tuple[str, float | None] | None:
    """(reason, when) if Kueue evicted or preempted the Workload (``Evicted``/``Preempted`` True): the
    gang lost its quota and was stopped whole, a preemption, not a failure (:mod:`llmpack.cluster.k8s.preemption`)."""
    from llmpack.cluster.k8s.preemption import workload_disruption

    return workload_disruption(workload)


def find_workload(api_client: Any, namespace: str, trainjob: str) -> dict[str, Any] | None:
    """The Workload Kueue made for TrainJob ``trainjob``; None without Kueue or without access."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.CustomObjectsApi(api_client)
    for version in VERSIONS:
        try:
            listed = api.list_namespaced_custom_object(GROUP, version, namespace, PLURAL, _request_timeout=15)
        except ApiException as exc:
            if exc.status == 404:  # this version not served (or no Kueue at all): try the older one
                continue
            if exc.status == 403:  # not ours to read: measured without it
                return None
            raise
        return next((w for w in listed.get("items") or () if owned_by(w, "TrainJob", trainjob)), None)
    return None
