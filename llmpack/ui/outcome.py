"""The run's outcome in one line: does the tuned model do the task better than the base one?

``llmpack run`` ends with it, e.g. ``outcome: exact match base 0.0% -> tuned 0.0% on 200
unseen prompts (gate: exact match); version 3 -> champion (...)``. The task half comes from the
run's metrics alone (evaluate's task metrics, docs/serving.md); the registry's decision from the
register step's ``registration.json`` in the run's directory
(:func:`components.serving.promotion.Decision.phrase`, docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components import bounded
from components.errors import InputError

GATE_PREFIX = "gated_by_"
REGISTRATION_DIR = "register.registration_dir"  # the register step's output in a local run's summary
# ... or, with the step fused into another task (``--fuse all``), that task's ``register_registration``
FUSED_REGISTRATION_DIR = ".register_registration_dir"


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def gated_on(metrics: Mapping[str, Any]) -> str | None:
    """The metric the quality gate judged (``exact_match``, ``eval_loss``...), from its ``gated_by_*`` metric."""
    names = sorted(k[len(GATE_PREFIX):] for k, v in metrics.items() if k.startswith(GATE_PREFIX) and v)
    return names[0] if names else None


def task_text(metrics: Mapping[str, Any]) -> str | None:
    """``exact match base 0.0% -> tuned 0.0% on 200 unseen prompts``, or the eval loss where no answers were
    scored."""
    base, tuned = metrics.get("base_exact_match"), metrics.get("tuned_exact_match")
    if base is not None and tuned is not None:
        rows = metrics.get("task_rows")
        where = f" on {int(rows)} unseen prompts" if rows else ""
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
    line = f"outcome: {text}" + (f" (gate: {gate.replace('_', ' ')})" if gate else "")
    phrase = summary.get("promotion") or promotion_phrase(summary)
    return f"{line}; {phrase}" if phrase else line


def promotion_phrase(summary: Mapping[str, Any]) -> str | None:
    """``version 3 -> champion (beat v2: ...)`` or ``version 3 stays challenger (...)``; None when nothing was
    registered."""
    artifacts = summary.get("artifacts") or {}
    where = artifacts.get(REGISTRATION_DIR) or next(
        (v for k, v in sorted(artifacts.items()) if k.endswith(FUSED_REGISTRATION_DIR)), None)
    if not where:
        return None
    try:
        record = bounded.read_json(Path(where) / "registration.json", 64 << 10)
    except (OSError, ValueError, InputError):  # a failed run has no registration: nothing to say
        return None
    phrase = record.get("promotion") if isinstance(record, dict) else None
    return phrase if isinstance(phrase, str) else None
