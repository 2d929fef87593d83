"""The projection's two PNG charts (matplotlib, imported when drawn; the report's colours per path).

Gang ready p50 and p99 (or the highest quantile asked) against nodes, each with its 95% band, a
dashed line where the value is extrapolated; and the cost per run at each GPU count stacked into
compute, straggler waste and overhead, the total's interval as an error bar.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from llmpack.cluster.plan.project.model import COST_PARTS, Projection
from llmpack.report.charts import _pyplot, path_colour

PART_STYLE = {"compute": (0.9, None), "straggler_waste": (0.55, "xx"), "overhead": (0.3, "//")}


def chart_gang_ready(projections: Mapping[str, Sequence[Projection]], path: Path) -> None:
    """Gang ready (from submit) vs nodes, log2 x axis: solid median, thin upper quantile, bands = 95% CI."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for name, rows in projections.items():
        labels = list(rows[0].gang_ready)
        shown = [labels[0]] + ([labels[-1]] if len(labels) > 1 else [])
        xs = [r.nodes for r in rows]
        for k, q in enumerate(shown):
            est = [r.gang_ready[q] for r in rows]
            colour, style = path_colour(name), "-" if k == 0 else "--"
            ax.fill_between(xs, [e.low / 60 for e in est], [e.high / 60 for e in est], color=colour,
                            alpha=0.18 if k == 0 else 0.08, linewidth=0)
            ax.plot(xs, [e.value / 60 for e in est], style, color=colour, marker="o", markersize=3,
                    linewidth=2 if k == 0 else 1.2, label=f"{name} {q}")
            for e, x in zip(est, xs, strict=True):
                if e.extrapolated:
                    ax.plot([x], [e.value / 60], marker="o", markersize=7, markerfacecolor="white", color=colour)
    ax.set_xscale("log", base=2)
    ax.set_xticks([r.nodes for rows in projections.values() for r in rows])
    ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    ax.set_ylim(bottom=0)
    ax.set_xlabel("nodes in the gang")
    ax.set_ylabel("gang ready, minutes from submit")
    ax.set_title("Projected gang ready (bands: 95% interval; hollow: extrapolated)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_cost(projections: Mapping[str, Sequence[Projection]], path: Path) -> None:
    """Cost per run at each projected GPU count, one bar per path, stacked compute / waste / overhead."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    priced = {n: rows for n, rows in projections.items() if rows and rows[0].cost_usd}
    sizes = sorted({r.gpus for rows in priced.values() for r in rows})
    fig, ax = plt.subplots(figsize=(8, 4.6))
    width = 0.8 / max(1, len(priced))
    for k, (name, rows) in enumerate(priced.items()):
        for r in rows:
            x = sizes.index(r.gpus) + (k - (len(priced) - 1) / 2) * width
            bottom = 0.0
            for part in COST_PARTS:
                alpha, hatch = PART_STYLE[part]
                value = r.cost_usd[part].value
                ax.bar(x, value, width, bottom=bottom, color=path_colour(name), alpha=alpha, hatch=hatch,
                       edgecolor="white", linewidth=0)
                bottom += value
            total = r.cost_usd["total"]
            ax.errorbar([x], [total.value], yerr=[[total.value - total.low], [total.high - total.value]],
                        color="#333333", capsize=2, linewidth=0.8)
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels([str(s) for s in sizes])
    ax.set_xlabel("GPUs in the gang")
    ax.set_ylabel("cost per run, USD")
    handles = [Patch(facecolor=path_colour(n), label=n) for n in priced]
    handles += [Patch(facecolor="#777777", alpha=PART_STYLE[p][0], hatch=PART_STYLE[p][1], edgecolor="white",
                      label=p.replace("_", " ")) for p in COST_PARTS]
    ax.legend(handles=handles, fontsize=8, frameon=False, ncol=2)
    ax.set_title("Projected cost per run: compute, straggler waste, overhead (bar: 95% interval of the total)",
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
