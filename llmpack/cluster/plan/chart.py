"""The plan's chart (matplotlib, imported when drawn): cost per run against time to first step, one point
per estimated option (p50 of the time, its 95% interval as a horizontal bar; the cost's as a
vertical one), colour by path as in the report, marker by GPU type, hollow for spot, the chosen
option ringed and named.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llmpack.cluster.plan.choice import Choice
from llmpack.cluster.plan.estimate import OptionEstimate
from llmpack.cluster.plan.render import short_gpu

MARKERS = "osD^vP*Xh"


def chart_plan(rows: Sequence[OptionEstimate], choice: Choice, path: Path) -> None:
    """Write the PNG; options without a cost are left out (the table says why)."""
    from llmpack.report.charts import _pyplot, path_colour

    plt = _pyplot()
    shown = [r for r in rows if r.estimated and r.cost]
    gpus = list(dict.fromkeys(r.samples.option.gpu_type for r in shown))
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for r in shown:
        o = r.samples.option
        t, c = r.times["first_step_s"]["p50"], r.cost["total"]
        colour = path_colour(o.path)
        ax.errorbar([t.value / 60], [c.value], xerr=[[(t.value - t.low) / 60], [(t.high - t.value) / 60]],
                    yerr=[[c.value - c.low], [c.high - c.value]], color=colour, linewidth=0.8, capsize=2)
        ax.plot([t.value / 60], [c.value], MARKERS[gpus.index(o.gpu_type) % len(MARKERS)], markersize=8,
                color=colour, markerfacecolor="white" if o.capacity == "spot" else colour,
                label=f"{o.path} {short_gpu(o.gpu_type)} {o.capacity}")
        if r is choice.chosen:
            ax.plot([t.value / 60], [c.value], "o", markersize=20, markerfacecolor="none", color="#d62728",
                    markeredgewidth=2)
            ax.annotate(f"chosen: {o.path} {short_gpu(o.gpu_type)} {o.capacity}", (t.value / 60, c.value),
                        xytext=(-14, 14), textcoords="offset points", ha="right", fontsize=9, color="#d62728")
    ax.set_xlabel("time to first step, p50, minutes from submit (bar: 95% interval)")
    ax.set_ylabel("cost per run, USD (bar: 95% interval)")
    ax.set_title("llmpack cluster plan: cost vs time to first step (hollow: spot; ringed: chosen)", fontsize=10)
    ax.grid(alpha=0.3)
    if shown:
        ax.legend(fontsize=7, frameon=False, loc="best")
    else:
        ax.text(0.5, 0.5, "no option has an estimate with a price", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
