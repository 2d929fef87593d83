"""The run's outcome in one line: does the tuned model do the task better than the base one?

``llmpack run`` ends with it, e.g. ``outcome: exact match base 0.0% -> tuned 17.0% on 200
held-out prompts (gate: exact match)``. Built from the run's metrics alone (evaluate's task
metrics, docs/evaluation.md), so a record read back from MLflow gives the same line; a caller
may append more to it (the registry's decision) with ``; ``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GATE_PREFIX = "gated_by_"


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def gated_on(metrics: Mapping[str, Any]) -> str | None:
    """The metric the quality gate judged (``exact_match``, ``eval_loss``...), from its ``gated_by_*`` metric."""
    names = sorted(k[len(GATE_PREFIX):] for k, v in metrics.items() if k.startswith(GATE_PREFIX) and v)
    return names[0] if names else None


def task_text(metrics: Mapping[str, Any]) -> str | None:
    """``exact match base 0.0% -> tuned 17.0% on 200 held-out prompts``, or the eval loss where no answers were scored."""
    base, tuned = metrics.get("base_exact_match"), metrics.get("tuned_exact_match")
    if base is not None and tuned is not None:
        rows = metrics.get("task_rows")
        where = f" on {int(rows)} held-out prompts" if rows else ""
        return f"exact match base {percent(base)} -> tuned {percent(tuned)}{where}"
    base_loss, loss = metrics.get("base_eval_loss"), metrics.get("eval_loss")
    if base_loss is not None and loss is not None:
        return f"eval loss base {base_loss:.3f} -> tuned {loss:.3f}"
    return None


def outcome_line(summary: Mapping[str, Any]) -> str | None:
    """The run's final line, or None when evaluate recorded nothing (a run that failed before it)."""
    metrics = summary.get("metrics") or {}
    text = task_text(metrics)
    if text is None:
        return None
    gate = gated_on(metrics)
    return f"outcome: {text}" + (f" (gate: {gate.replace('_', ' ')})" if gate else "")
