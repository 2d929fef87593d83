"""Image-pull times from Pulling/Pulled events, per (namespace, pod, container): one of the phases
:func:`llmpack.cluster.k8s.podphases.analyze` puts on a pod's row (docs/internals/pod-watcher.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from llmpack.cluster.k8s.objects import DumpError, Where, dig, pull_seconds_from_message


def _event_time(event: Mapping[str, Any], where: Where) -> float | None:
    """When an event first happened: eventTime (micro time) else firstTimestamp else lastTimestamp."""
    for field in ("eventTime", "firstTimestamp", "lastTimestamp"):
        t = where.time(event.get(field), field)
        if t is not None:
            return t
    return None


def _container_of_field_path(field_path: str | None) -> str | None:
    m = re.match(r"^spec\.(?:initContainers|containers|ephemeralContainers)\{([^}]*)\}$", field_path or "")
    return m.group(1) if m else None


class PullIndex:
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
            where = Where("events", i, event)
            ns = obj.get("namespace") or dig(event, "metadata", "namespace") or ""
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
