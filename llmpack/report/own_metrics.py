"""The metrics a pipeline's own steps log (``components.reporting.metric``), per path: medians in the report.

A step of one's own records ``metric("mean_prompt_len", v)``; the run carries it as ``step_metrics[task][name]``
(``llmpack run --json``) and MLflow as ``metric.<task>.<name>``. The shipped steps' own figures feed the report's
headlines already; the others are shown here, each task and name with its median over a path's succeeded runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from llmpack.report.escape import html_text, md
from llmpack.ui.numbers import figure

_SHIPPED = ("prepare-data", "tokenize", "finetune", "evaluate", "register")


def from_mlflow_metrics(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """``metric.<task>.<name>`` keys of a record as ``{task: {name: value}}``: a retried step's latest attempt's
    (``.attempt<N>`` keys folded into the name, as ``--json`` shows them: trial 9)."""
    out: dict[str, dict[str, float]] = {}
    attempt_of: dict[tuple[str, str], int] = {}
    for key, value in metrics.items():
        kind, _, rest = key.partition(".")
        task, _, name = rest.partition(".")
        if kind != "metric" or not task or not name:
            continue
        base, _, suffix = name.rpartition(".attempt")
        numbered = bool(base) and suffix.isascii() and suffix.isdigit() and len(suffix) <= 6  # round 28: '²'
        n = int(suffix) if numbered else 0
        name = base if numbered else name
        if n >= attempt_of.get((task, name), -1):
            attempt_of[(task, name)] = n
            out.setdefault(task, {})[name] = value
    return out


def table(runs: list[dict[str, Any]]) -> tuple[list[str], list[tuple[str, dict[str, tuple[float, int]]]]]:
    """``(paths, rows)``: per ``task.name`` of a step of one's own, per path, its median and n."""
    from components.fusion import path_of

    paths = list(dict.fromkeys(path_of(r) for r in runs if r.get("status") == "succeeded"))
    values: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        if r.get("status") != "succeeded":
            continue
        for task, named in (r.get("step_metrics") or {}).items():
            if task in _SHIPPED or not isinstance(named, dict):
                continue
            for name, v in named.items():  # step_failed is llmpack's own mark, said in the failures, not yours
                if name != "step_failed" and isinstance(v, (int, float)) and v == v:
                    values.setdefault(f"{task}.{name}", {}).setdefault(path_of(r), []).append(float(v))
    rows = [(key, {p: (statistics.median(vs), len(vs)) for p, vs in per.items()})
            for key, per in sorted(values.items())]
    return paths, rows


def markdown_lines(runs: list[dict[str, Any]]) -> list[str]:
    paths, rows = table(runs)
    if not rows:
        return []
    lines = ["", "## Your steps' own metrics", "", "Medians over each path's succeeded runs (n).", "",
             "| step.metric | " + " | ".join(md(p) for p in paths) + " |", "|---|" + "---|" * len(paths)]
    for key, per in rows:
        lines.append(f"| {md(key)} | " + " | ".join(f"{figure(per[p][0])} ({per[p][1]})" if p in per else "-"
                                                    for p in paths) + " |")
    return lines


def html_section(runs: list[dict[str, Any]], badge: Callable[[str | None], str]) -> str:
    paths, rows = table(runs)
    if not rows:
        return ""
    head = "".join(f"<th>{badge(p)}</th>" for p in paths)
    body = "".join(f"<tr><th>{html_text(key)}</th>" + "".join(
        f"<td>{html_text(figure(per[p][0]))} <span class=note>n={per[p][1]}</span></td>" if p in per else "<td>-</td>"
        for p in paths) + "</tr>" for key, per in rows)
    return (f"<h2>Your steps' own metrics</h2><p class=note>Medians over each path's succeeded runs.</p>"
            f"<table class=num><tr><th>step.metric</th>{head}</tr>{body}</table>")
