"""The report's "Preemption" section: per path, how long it took to recover and what each preemption wasted.

Shown when any run of the comparison had a preempted attempt (``llmpack compare --cluster
--preempt``, or a real preemption the watcher saw). Per path, the medians over its runs of
``preemptions``, ``time_to_recover_s`` (preemption to the retry's first step),
``preemption_waste_gpu_hours`` and ``preemption_waste_usd`` (GPU time since the last checkpoint
plus the retry's spin-up and model load) and ``failure_retry_gpu_hours`` (retries a *failure*
cost, apart), from the runs' metrics (:mod:`llmpack.cluster.k8s.preemption`).
"""

from __future__ import annotations

import html
import statistics
from typing import Any

# metric -> (column header, unit, digits)
COLUMNS = {
    "preemptions": ("preempted", "", 0),
    "time_to_recover_s": ("time to recover", "s", 1),
    "preemption_waste_gpu_hours": ("waste", "GPU-h", 4),
    "preemption_waste_usd": ("waste", "$", 4),
    "failure_retry_gpu_hours": ("failure retries", "GPU-h", 4),
}
def _note() -> str:
    from llmpack.ui import glossary

    waste, recover = glossary.term("preemption_waste"), glossary.term("time_to_recover")
    return f"Waste: {waste.short}, priced. Time to recover: {recover.short}. Medians over each path's runs."


def preemption_rows(result: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Path -> the median of each :data:`COLUMNS` metric over its runs; {} when no run was preempted."""
    runs = [r for r in result.get("runs") or () if (r.get("metrics") or {}).get("preemptions")]
    if not runs:
        return {}
    out: dict[str, dict[str, float | None]] = {}
    for path in dict.fromkeys(_path(r) for r in result.get("runs") or ()):
        mine = [r.get("metrics") or {} for r in result["runs"] if _path(r) == path]
        out[path] = {}
        for key in COLUMNS:
            values = [m[key] for m in mine if m.get(key) is not None]
            out[path][key] = statistics.median(values) if values else None
    return out


def _path(run: dict[str, Any]) -> str:
    from components.fusion import path_of

    return path_of(run)


def _fmt(value: float | None, unit: str, digits: int) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return f"${text}" if unit == "$" else text


def _title(result: dict[str, Any]) -> str:
    asked = result.get("preempt")
    return f"Preemption (--preempt {asked})" if asked else "Preemption"


def markdown_lines(result: dict[str, Any]) -> list[str]:
    rows = preemption_rows(result)
    if not rows:
        return []
    head = " | ".join(f"{h} ({u})" if u else h for h, u, _ in COLUMNS.values())
    lines = ["", f"## {_title(result)}", "", _note(), "", f"| path | {head} |", "|---|" + "---|" * len(COLUMNS)]
    for path, vals in rows.items():
        lines.append(f"| {path} | " + " | ".join(_fmt(vals[k], u, d) for k, (_, u, d) in COLUMNS.items()) + " |")
    return lines


def html_section(result: dict[str, Any], badge: Any) -> str:
    rows = preemption_rows(result)
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(h)}" + (f" <span class=unit>({html.escape(u)})</span>" if u else "") + "</th>"
                   for h, u, _ in COLUMNS.values())
    body = "".join(f"<tr><th>{badge(path)}</th>"
                   + "".join(f"<td>{html.escape(_fmt(vals[k], u, d))}</td>" for k, (_, u, d) in COLUMNS.items())
                   + "</tr>"
                   for path, vals in rows.items())
    return (f"<h2>{html.escape(_title(result))}</h2><p class=note>{html.escape(_note())}</p>"
            f"<table class=num><tr><th>path</th>{head}</tr>{body}</table>")


def terminal_lines(result: dict[str, Any]) -> list[str]:
    """One line per path, under 80 columns: ``argo preempted 1 · recover 9.4 s · waste 0.0031 GPU-h $0.0124``."""
    out = []
    for path, vals in preemption_rows(result).items():
        usd = vals["preemption_waste_usd"]
        out.append(f"{path} preempted {_fmt(vals['preemptions'], '', 0)} · recover "
                   f"{_fmt(vals['time_to_recover_s'], 's', 1)} s · waste "
                   f"{_fmt(vals['preemption_waste_gpu_hours'], 'GPU-h', 4)} GPU-h"
                   + ("" if usd is None else f" {_fmt(usd, '$', 4)}"))
    return out
