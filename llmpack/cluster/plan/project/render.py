"""The projection as words: the terminal table (80 columns), the summary sentences, JSON and HTML."""

from __future__ import annotations

import html
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from llmpack.cluster.plan.project.fit import PathFit
from llmpack.cluster.plan.project.model import METHOD, Estimate, Projection

WIDTH = 80


def wrapped(sentences: Sequence[str]) -> str:
    """Sentences for the terminal, each wrapped at :data:`WIDTH` columns."""
    return "\n".join(textwrap.fill(s, WIDTH, subsequent_indent="  ") for s in sentences)


def seconds(value: float) -> str:
    """Seconds, short: 42 s, 318 s, 12.4 min, 2.1 h (sentences)."""
    if value < 600:
        return f"{value:.0f} s"
    if value < 36_000:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _unit(rows: Sequence[Projection]) -> tuple[str, Any]:
    """One unit for a path's whole table: seconds, or minutes when any figure reaches 10 minutes."""
    top = max(e.high for r in rows for e in r.gang_ready.values())
    if top < 600:
        return "s", lambda v: f"{v:.0f}"
    return "min", lambda v: f"{v / 60:.1f}"


def _usd(value: float) -> str:
    return f"${value:,.2f}" if value < 100 else f"${value:,.0f}"


def _cell(e: Estimate, fmt: Any = seconds) -> str:
    return f"{fmt(e.value)} ({fmt(e.low)}-{fmt(e.high)}){'*' if e.extrapolated else ''}"


def fit_line(fit: PathFit) -> str:
    price = f"${fit.price_per_gpu_hour:g}/GPU-h" if fit.price_per_gpu_hour is not None else "no price"
    sizes = ",".join(str(s) for s in fit.gang_sizes)
    return (f"{fit.path}: {fit.node_samples} node samples from {fit.runs} runs of {sizes}-node gangs; "
            f"{fit.gpus_per_node} GPUs/node, {price}")


def table(fits: Mapping[str, PathFit], projections: Mapping[str, Sequence[Projection]]) -> str:
    """Per path: gang ready (seconds from submit) per quantile, then cost per run split; '*' = extrapolated."""
    lines = []
    for name, rows in projections.items():
        lines += textwrap.wrap(fit_line(fits[name]), WIDTH, subsequent_indent="  ")
        qs = list(rows[0].gang_ready)
        unit, fmt = _unit(rows)
        lines.append(f"{'nodes':>5} {'GPUs':>5}  " + "".join(f"{'ready ' + q + ' ' + unit:<21}" for q in qs).rstrip())
        for r in rows:
            lines.append(f"{r.nodes:>5} {r.gpus:>5}  "
                         + "".join(f"{_cell(r.gang_ready[q], fmt):<21}" for q in qs).rstrip())
        if rows[0].cost_usd:
            lines.append(f"{'nodes':>5} {'GPU-h':>7}  {'compute':>9} {'waste':>9} {'overhead':>9}  "
                         "total $/run (95% CI)")
            for r in rows:
                c = r.cost_usd
                lines.append(f"{r.nodes:>5} {r.gpu_hours.value:>7.1f}  {_usd(c['compute'].value):>9} "
                             f"{_usd(c['straggler_waste'].value):>9} {_usd(c['overhead'].value):>9}  "
                             f"{_cell(c['total'], _usd)}")
        lines.append("")
    lines.append("* extrapolated: past what was measured (an exponential tail beyond the slowest)")
    return "\n".join(lines)


def summary(projections: Mapping[str, Sequence[Projection]], flip: Mapping[str, Any] | None) -> list[str]:
    """One sentence per path (its largest gang), and the flip's."""
    out = []
    for name, rows in projections.items():
        r = rows[-1]
        qs = list(r.gang_ready)
        mid, top = r.gang_ready[qs[0]], r.gang_ready[qs[-1]]
        text = (f"{name}: {r.nodes} nodes ({r.gpus} GPUs) ready in {seconds(mid.value)} at {qs[0]} "
                f"({seconds(mid.low)} to {seconds(mid.high)}), {seconds(top.value)} at {qs[-1]}"
                f"{' (extrapolated)' if top.extrapolated else ''}")
        if r.cost_usd:
            waste, total = r.cost_usd["straggler_waste"].value, r.cost_usd["total"].value
            text += f"; straggler waste {_usd(waste)} of {_usd(total)} a run"
        out.append(text)
    if flip:
        out.append(flip["sentence"])
    return out


def as_json(fits: Mapping[str, PathFit], projections: Mapping[str, Sequence[Projection]],
            flip: Mapping[str, Any] | None) -> dict[str, Any]:
    paths = {}
    for name, rows in projections.items():
        fit = fits[name]
        paths[name] = {
            "fit": {"runs": fit.runs, "node_samples": fit.node_samples, "gang_sizes": list(fit.gang_sizes),
                    "gpus_per_node": fit.gpus_per_node, "price_per_gpu_hour": fit.price_per_gpu_hour,
                    "train_s": fit.train_s, "median_s": fit.phases},
            "projections": [{"nodes": r.nodes, "gpus": r.gpus,
                             "gang_ready_s": {q: e.as_json() for q, e in r.gang_ready.items()},
                             "first_step_s": {q: e.as_json() for q, e in r.first_step.items()},
                             "gpu_hours": r.gpu_hours.as_json(),
                             "cost_usd": {k: e.as_json() for k, e in r.cost_usd.items()}} for r in rows],
        }
    return {"method": METHOD, "paths": paths, "flip": dict(flip) if flip else None,
            "summary": summary(projections, flip)}


def as_html(text: str, sentences: Sequence[str], charts: Sequence[str]) -> str:
    """A one-page summary: the sentences, the charts, the table as text."""
    items = "".join(f"<li>{html.escape(s)}</li>" for s in sentences)
    images = "".join(f'<p><img src="{html.escape(c)}" alt="{html.escape(c)}"></p>' for c in charts)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>llmpack cluster plan project</title></head><body>"
            f"<h1>Projected gangs</h1><ul>{items}</ul>{images}<pre>{html.escape(text)}</pre>"
            f"<p><small>{html.escape(METHOD)}</small></p></body></html>\n")
