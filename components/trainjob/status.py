"""A TrainJob's status: its conditions, whether it ended, and how (:class:`TrainJobResult`).

The condition types are Trainer v2's (``Suspended``, ``Complete``, ``Failed``); docs/internals/decisions.md
(the TrainJob launcher) says where each comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from components.errors import StepFailed
from components.servers.remote import one_line

COMPLETE, FAILED, SUSPENDED = "Complete", "Failed", "Suspended"


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 time as the API server writes it (``...Z``, fractions) as epoch seconds; None when absent."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def conditions(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``status.conditions`` by type."""
    listed = ((obj.get("status") or {}).get("conditions")) or []
    return {c["type"]: c for c in listed if isinstance(c, Mapping) and c.get("type")}


def terminal_condition(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``Failed`` or ``Complete`` condition that is True (Failed first), else None."""
    by_type = conditions(obj)
    for kind in (FAILED, COMPLETE):
        cond = by_type.get(kind)
        if cond and cond.get("status") == "True":
            return cond
    return None


@dataclass(frozen=True)
class TrainJobResult:
    """How a TrainJob ended. ``created_at`` / ``finished_at``: RFC 3339 as the API server wrote them."""

    name: str
    namespace: str
    uid: str
    outcome: str  # "Complete" or "Failed"
    reason: str
    message: str
    created_at: str | None
    finished_at: str | None
    adopted: bool = False  # it existed already (a retried launcher following its TrainJob)

    @property
    def succeeded(self) -> bool:
        return self.outcome == COMPLETE

    @property
    def exit_code(self) -> int:
        return 0 if self.succeeded else 1

    @property
    def duration_s(self) -> float | None:
        created, finished = parse_time(self.created_at), parse_time(self.finished_at)
        return None if created is None or finished is None else max(0.0, finished - created)

    def describe(self) -> str:
        why = f" ({self.reason}{': ' + self.message if self.message else ''})" if self.reason or self.message else ""
        return f"TrainJob {self.namespace}/{self.name} {self.outcome}{why}"

    def check(self) -> TrainJobResult:
        """Itself when Complete; :class:`StepFailed` with one line when Failed."""
        if not self.succeeded:
            raise StepFailed(one_line(self.describe(), limit=500))
        return self


def result_of(obj: Mapping[str, Any], cond: Mapping[str, Any], adopted: bool) -> TrainJobResult:
    meta = obj.get("metadata") or {}
    return TrainJobResult(
        name=meta.get("name", ""), namespace=meta.get("namespace", ""), uid=meta.get("uid", ""),
        outcome=str(cond.get("type")), reason=str(cond.get("reason") or ""),
        message=one_line(cond.get("message") or "", limit=1000),
        created_at=meta.get("creationTimestamp"), finished_at=cond.get("lastTransitionTime"), adopted=adopted)
