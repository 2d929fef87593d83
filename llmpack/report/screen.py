"""Impossible runs kept out: a run whose record holds what no run can (a submission in the future, a NaN or
infinite figure, a negative duration, cost or count) is excluded from the statistics, the verdicts, the
charts and the traces, and shown apart with its reason; never a traceback, never a verdict.

A tracking store is writable by whoever runs there, so its values are data, never facts: one planted run
must not take down (or tilt) the report of its whole group. :func:`screen` runs where a comparison is made
(:func:`llmpack.compare.comparison.comparison`), so a compare and a rebuilt report judge the same runs.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

FUTURE_SLACK_S = 3600.0  # clocks of a laptop and a cluster disagree; an hour past now is no clock skew
MAX_SPAN_S = 366 * 86400.0  # an event more than a year from its run's submission (or before it) is no run's
# Figures no run can have below zero: the verdicts' and the Numbers table's durations and rates, GPU-hours,
# money, counts and shares. Not every ``_s``: a pipeline's overhead (total less the steps' compute) is
# negative when steps overlap, a provision wait when the node was up before the pod.
NON_NEGATIVE_SUFFIXES = ("_hours", "_usd", "_pct")
NON_NEGATIVE = frozenset({"spinup_s", "time_to_first_step_s", "total_s", "train_s", "time_to_recover_s",
                          "tokens_per_s", "usd_per_1m_tokens", "goodput", "preemptions", "train_tokens"})


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _when(t: float) -> str:
    try:
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, OSError, ValueError):
        return f"{t:g} s since 1970"


def _figure_problem(what: str, name: str, value: Any) -> str | None:
    if not _number(value):
        return None
    if not math.isfinite(value):
        return f"{what} {name} is {value}"
    if value < 0 and (name.endswith(NON_NEGATIVE_SUFFIXES) or name in NON_NEGATIVE):
        return f"{what} {name} is negative ({value:g})"
    return None


def problem(run: Mapping[str, Any], now: float | None = None) -> str | None:
    """Why ``run`` cannot be a real run's record, in a few words; None when nothing is impossible."""
    now = time.time() if now is None else now
    for key in ("pipeline_run", "orchestrator", "status"):
        if not isinstance(run.get(key), str):
            return f"its {key} is not text"
    submitted = run.get("submitted_at")
    if submitted is not None:
        if not _number(submitted) or not math.isfinite(submitted):
            return f"submitted_at {submitted!r} is not a time"
        if submitted > now + FUTURE_SLACK_S:
            return f"submitted in the future ({_when(submitted)})"
    metrics = run.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        return "its metrics are not a mapping"
    for name, value in metrics.items():
        if found := _figure_problem("metric", name, value):
            return found
    events = run.get("events") or {}
    if not isinstance(events, Mapping) or not all(isinstance(e, Mapping) for e in events.values()):
        return "its events are not a mapping of steps"
    for step, named in events.items():
        for name, t in named.items():
            if not _number(t) or not math.isfinite(t):
                return f"event {step}.{name} ({t!r}) is not a time"
            if t > now + FUTURE_SLACK_S:
                return f"event {step}.{name} is in the future ({_when(t)})"
            if submitted is not None and not -FUTURE_SLACK_S <= t - submitted <= MAX_SPAN_S:
                return f"event {step}.{name} is {t - submitted:+.3g} s from the run's submission"
    for attempt in run.get("retried_attempts") or ():
        for name, value in (attempt.items() if isinstance(attempt, Mapping) else ()):
            if found := _figure_problem("retried attempt's", name, value):
                return found
    return None


def screen(runs: Iterable[dict[str, Any]], now: float | None = None) -> tuple[list[dict[str, Any]],
                                                                              list[dict[str, str]]]:
    """``(kept, excluded)``: the runs with nothing impossible, in order; each other one as
    ``{pipeline_run, orchestrator, reason}`` (its names made text: they may be what is wrong)."""
    kept, excluded = [], []
    for run in runs:
        why = problem(run, now)
        if why is None:
            kept.append(run)
        else:
            excluded.append({"pipeline_run": str(run.get("pipeline_run")), "orchestrator": str(run.get("orchestrator")),
                             "reason": why})
    return kept, excluded


def markdown_lines(excluded: list[dict[str, str]]) -> list[str]:
    """report.md's section (none when nothing was excluded); every value through the one escaping."""
    from llmpack.report.escape import md

    if not excluded:
        return []
    return ["", "## Excluded runs", "", "Impossible values in the store: left out of every figure and verdict.", ""] + [
        f"- **{md(e['orchestrator'])}** {md(e['pipeline_run'])}: {md(e['reason'])}" for e in excluded]


def html_section(excluded: list[dict[str, str]]) -> str:
    from llmpack.report.escape import html_text

    if not excluded:
        return ""
    items = "".join(f"<li><b>{html_text(e['orchestrator'])}</b> <code>{html_text(e['pipeline_run'])}</code>: "
                    f"{html_text(e['reason'])}</li>" for e in excluded)
    return ("<h2>Excluded runs</h2><p class=note>Impossible values in the store: left out of every figure and "
            f"verdict.</p><ul>{items}</ul>")
