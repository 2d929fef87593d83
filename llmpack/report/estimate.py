"""Estimate vs actual: the report's section for runs submitted with ``--plan`` (their ``llmpack.plan.*``
tags, :mod:`llmpack.cluster.plan.record`), one row per run and headline: the planned p50 and p90 with their
95% intervals, what the run measured, and where it fell.

Where it fell, per headline: ``<= p50`` when the actual is at most the p50 interval's upper end,
``<= p90`` when at most the p90's, ``above p90`` otherwise (a run is one draw: it is expected
below the p90 nine times in ten and below the p50 half the time, which ``llmpack cluster plan
--calibration`` counts over many). The cost is ``inside`` or ``outside`` its interval.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llmpack.report.escape import html_text, md

TITLE = "Estimate vs actual"
NOTE = ("The plan's p50 and p90 (95% intervals) for each run submitted with --plan, and what the run measured. "
        "One run is one draw: below p90 nine times in ten, below p50 half the time "
        "(llmpack cluster plan --calibration counts them over many).")
METRICS = {"spin_up_s": "gang_ready_s", "first_step_s": "time_to_first_step_s", "total_s": "total_s"}
NAMES = {"spin_up_s": "spin-up", "first_step_s": "first step", "total_s": "total", "cost_usd": "cost"}
COLUMNS = ("run", "headline", "p50", "p90", "actual", "fell")
PREFIX = "llmpack.plan."  # the estimate's tags on a run (written by llmpack.cluster.plan.record)


def parse_triple(text: str | None) -> tuple[float, float, float] | None:
    """A tag's ``"61.2,57,67.1"`` -> (value, low, high); None when absent or unreadable."""
    try:
        v, lo, hi = (float(x) for x in str(text).split(","))
    except (TypeError, ValueError):
        return None
    return v, lo, hi


def where_fell(actual: float, p50: tuple[float, float, float] | None, p90: tuple[float, float, float] | None) -> str:
    """``<= p50``, ``<= p90`` or ``above p90`` (by the intervals' upper ends)."""
    if p50 is not None and actual <= p50[2]:
        return "<= p50"
    if p90 is not None and actual <= p90[2]:
        return "<= p90"
    return "above p90"


def _fmt(value: float, usd: bool) -> str:
    return f"${value:,.2f}" if usd else (f"{value:.0f} s" if value < 600 else f"{value / 60:.1f} min")


def _est(t: tuple[float, float, float] | None, usd: bool = False) -> str:
    return "-" if t is None else f"{_fmt(t[0], usd)} ({_fmt(t[1], usd)}-{_fmt(t[2], usd)})"


def rows(runs: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """[run, headline, p50, p90, actual, fell] for every planned run's headlines it measured."""
    out = []
    for run in runs:
        tags, metrics = run.get("tags") or {}, run.get("metrics") or {}
        if f"{PREFIX}option" not in tags:
            continue
        name = str(run.get("pipeline_run") or run.get("orchestrator"))
        for h, metric in METRICS.items():
            actual = metrics.get(metric)
            p50, p90 = parse_triple(tags.get(f"{PREFIX}{h}.p50")), parse_triple(tags.get(f"{PREFIX}{h}.p90"))
            if actual is None or (p50 is None and p90 is None):
                continue
            out.append([name, NAMES[h], _est(p50), _est(p90), _fmt(float(actual), False),
                        where_fell(float(actual), p50, p90)])
        cost, actual = parse_triple(tags.get(f"{PREFIX}cost_usd")), metrics.get("cost_usd")
        if cost is not None and actual is not None:
            fell = "inside" if cost[1] <= float(actual) <= cost[2] else "outside"
            out.append([name, "cost", _est(cost, True), "-", _fmt(float(actual), True), fell])
    return out


def markdown(runs: Iterable[Mapping[str, Any]], text: Callable[[Any], str] = md) -> list[str]:
    """The section in Markdown, every cell through ``text`` (:func:`llmpack.report.escape.md`)."""
    found = rows(runs)
    if not found:
        return []
    lines = ["", f"## {TITLE}", "", NOTE, "", "| " + " | ".join(COLUMNS) + " |", "|---|---|---:|---:|---:|---|"]
    return lines + ["| " + " | ".join(text(c) for c in r) + " |" for r in found]


def html_section(runs: Iterable[Mapping[str, Any]]) -> str:
    found = rows(runs)
    if not found:
        return ""
    head = "".join(f"<th>{html_text(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html_text(c)}</td>" for c in r) + "</tr>" for r in found)
    return f"<h2>{TITLE}</h2><p class=note>{html_text(NOTE)}</p><table class=num><tr>{head}</tr>{body}</table>"
