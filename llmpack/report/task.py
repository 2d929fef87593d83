"""The report's task section: per path, exact match of the base model -> the tuned one.

Every path trains the same weights from the same seed, so each path's runs should show one
figure; a spread would be a finding and is shown as one (lowest-highest).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from llmpack.ui.outcome import gated_on, percent

PROMOTION_TAG = "llmpack.promotion"  # what the register step decided for the version it registered

TITLE = "Does the tuned model do the task?"
NOTE = ("Greedy answers to unseen prompts (no eval prompt, nor on the built-in data any word or number in it, "
        "is in training), scored by exact match (normalised: case and spacing forgiven); base model -> tuned "
        "model (docs/serving.md).")


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return percent(lo) if lo == hi else f"{percent(lo)}-{percent(hi)}"


def task_lines(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(path, "exact match 0.0% -> 17.0% ...")`` for each path whose runs scored answers, in run order."""
    by_path: dict[str, list[dict[str, float]]] = {}
    promotions: dict[str, str] = {}  # each path's newest registry decision (the register step's run tag)
    for run in runs:
        m = run.get("metrics") or {}
        if m.get("tuned_exact_match") is not None and m.get("base_exact_match") is not None:
            by_path.setdefault(run["orchestrator"], []).append(m)
            if decided := (run.get("tags") or {}).get(PROMOTION_TAG):
                promotions[run["orchestrator"]] = decided
    lines = []
    for orch, ms in by_path.items():
        text = (f"exact match {_span([m['base_exact_match'] for m in ms])} -> "
                f"{_span([m['tuned_exact_match'] for m in ms])}")
        if all(m.get("tuned_normalised_match") is not None for m in ms):
            text += (f" (normalised {_span([m.get('base_normalised_match', 0.0) for m in ms])} -> "
                     f"{_span([m['tuned_normalised_match'] for m in ms])})")
        tasks = sorted({k.removeprefix("tuned_exact_match_") for m in ms for k in m
                        if k.startswith("tuned_exact_match_")})
        if tasks:
            text += "; tuned by task: " + ", ".join(f"{t} {_span([m.get(f'tuned_exact_match_{t}', 0.0) for m in ms])}"
                                                     for t in tasks)
        rows = ms[0].get("task_rows")
        text += f"; {int(rows)} unseen prompts" if rows else ""
        gate = gated_on(ms[0])
        text += f"; gate: {gate.replace('_', ' ')}" if gate else ""
        text += f"; {len(ms)} run{'s' if len(ms) > 1 else ''}"
        if decided := promotions.get(orch):
            text += f"; registry: {decided}"
        lines.append((orch, text))
    return lines


def markdown(runs: list[dict[str, Any]]) -> list[str]:
    lines = task_lines(runs)
    if not lines:
        return []
    return ["", f"## {TITLE}", "", NOTE, ""] + [f"- **{o}**: {t}" for o, t in lines]


def html_section(runs: list[dict[str, Any]], badge: Callable[[str | None], str]) -> str:
    lines = task_lines(runs)
    if not lines:
        return ""
    items = "".join(f"<li>{badge(o)} {html.escape(t)}</li>" for o, t in lines)
    return f"<h2>{html.escape(TITLE)}</h2><p class=note>{html.escape(NOTE)}</p><ul>{items}</ul>"
