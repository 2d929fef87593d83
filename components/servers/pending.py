"""Why a submitted run's pod has not started: what a ``--wait`` that ran out of time says (trial 7: a Job whose
claim did not exist waited two minutes, then said only ``timeout``).

The scheduler writes its reason into the pod's ``PodScheduled`` condition (``persistentvolumeclaim "x" not
found``, ``0/3 nodes are available: 3 Insufficient nvidia.com/gpu``); a kubelet into a container's waiting
state (``ImagePullBackOff``). The first pod found Pending says it, redacted, in one line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from components.redaction import printable
from components.servers.remote import one_line

LIST_LIMIT = 20  # pods read: a run's are few


def pending_reason(api_client: Any, namespace: str, selector: str, secrets: Iterable[str] = (),
                   request_timeout_s: float = 10.0) -> str | None:
    """``pod P is Pending: <the scheduler's or kubelet's reason>`` for the first not-started pod matching
    ``selector`` in ``namespace``; ``no pod was created`` when none exists; None when it cannot be read."""
    from kubernetes import client as k8s

    try:
        pods = k8s.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=selector, limit=LIST_LIMIT,
                                                             _request_timeout=request_timeout_s).items
    except Exception:  # noqa: BLE001 - a hint only: the timeout is said either way
        return None
    if not pods:
        return "no pod was created yet"
    for pod in pods:
        status = pod.status
        if status is None or status.phase != "Pending":
            continue
        why = next((f"{c.reason}: {c.message}" for c in status.conditions or []
                    if c.type == "PodScheduled" and c.status == "False" and (c.message or c.reason)), None)
        why = why or next((f"{s.state.waiting.reason}: {s.state.waiting.message or ''}".rstrip(": ")
                           for s in status.container_statuses or []
                           if s.state and s.state.waiting and s.state.waiting.reason), None)
        said = printable(one_line(why, tuple(secrets)), 300) if why else ""  # a stranger's text: redacted, no escapes
        return f"pod {printable(str(pod.metadata.name), 80)} is Pending" + (f": {said}" if said else "")
    return None
