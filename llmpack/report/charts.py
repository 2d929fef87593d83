"""The report's PNG charts (matplotlib, imported only when a chart is drawn).

The timeline (one lane per run, its phases coloured), the spin-up and first-step box plots, and
the cost per run split into compute and overhead. Each path keeps one colour across charts and
the HTML badges (:func:`path_colour`).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from components.fusion import path_of

PALETTE = {"direct": "#7f7f7f", "kfp": "#1f77b4", "argo": "#ff7f0e", "mlflow": "#2ca02c"}
PHASES = (
    # (label, from event, to event, colour)
    # A pod is bound to a new node only once the node is Ready: provisioning spans creation to
    # node ready and is drawn over the queue span; pull + container start follows scheduling.
    ("queue", "pod_created", "pod_scheduled", "#c7c7c7"),
    ("provision", "pod_created", "node_ready", "#9467bd"),
    ("pull + container start", "pod_scheduled", "container_started", "#8c564b"),
    ("process start-up", "container_started|process_started", "model_loaded", "#bcbd22"),
    ("to first step", "model_loaded", "first_step", "#d62728"),
    ("compute", "first_step|model_loaded|process_started", "finished", "#17becf"),
)


def path_colour(orch: str) -> str:
    """A path's colour; a fused variant (``argo+fuse-gpu``) takes its backend's."""
    return PALETTE.get(orch, PALETTE.get(orch.split("+", 1)[0], "#444444"))


def _phase_spans(events: dict[str, float]) -> list[tuple[str, float, float, str]]:
    spans = []
    for label, start_names, end_name, colour in PHASES:
        start = next((events[n] for n in start_names.split("|") if n in events), None)
        end = events.get(end_name)
        if start is not None and end is not None and end > start:
            spans.append((label, start, end, colour))
    return spans


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def chart_timeline(runs: list[dict[str, Any]], path: Path) -> None:
    """One lane per run from submit (0 s); the legend lists only the phases drawn."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    lanes = [r for r in runs if r.get("events")]
    fig, ax = plt.subplots(figsize=(11, 2.4 + 0.45 * max(1, len(lanes))))
    seen: dict[str, str] = {}
    gap = False
    for y, run in enumerate(lanes):
        t0 = run["submitted_at"]
        steps = sorted(run["events"].items(), key=lambda kv: min(kv[1].values()))
        first_start = min((min(ev.values()) for _, ev in steps), default=t0)
        if first_start > t0:
            gap = True
            ax.barh(y, first_start - t0, left=0, color="#eeeeee", edgecolor="#bbbbbb", height=0.7)
        for step, ev in steps:
            for label, s, e, colour in _phase_spans(ev):
                seen.setdefault(label, colour)
                ax.barh(y, e - s, left=s - t0, color=colour, height=0.7, edgecolor="white", linewidth=0.4)
            if "first_step" in ev:
                ax.plot(ev["first_step"] - t0, y, marker="v", color="black", markersize=7)
            if step == "finetune" and "process_started" in ev:
                ax.text(ev["process_started"] - t0, y + 0.42, "finetune", fontsize=7, va="bottom")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{path_of(r)} · {r['pipeline_run'][-6:]}" for r in lanes])
    for tick, run in zip(ax.get_yticklabels(), lanes, strict=False):
        tick.set_color(path_colour(path_of(run)))
    ax.invert_yaxis()
    ax.set_xlim(left=0)
    ax.set_xlabel("seconds since submit")
    ax.set_title("Timeline per run: each step's phases; gaps are orchestrator overhead; ▼ = first training step")
    handles = ([Patch(color="#eeeeee", label="submit → first step process")] if gap else []) + [
        Patch(color=c, label=lbl) for lbl, _, _, c in PHASES if lbl in seen]
    ax.grid(axis="x", alpha=0.3)
    if handles:
        fig.legend(handles=handles, loc="lower center", fontsize=8, ncol=len(handles), frameon=False)
        fig.tight_layout(rect=(0, 0.4 / fig.get_figheight(), 1, 1))  # room for the one-row legend, no more
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_boxes(runs: list[dict[str, Any]], path: Path) -> None:
    """Spin-up and time to first step per path from 0 s, every run a dot, the median labelled."""
    plt = _pyplot()
    from llmpack.compare import quantity

    orchs = list(dict.fromkeys(path_of(r) for r in runs if r["status"] == "succeeded"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, metric, title in ((axes[0], "spinup_s", "Spin-up (s)"), (axes[1], "time_to_first_step_s", "Time to first training step (s)")):
        data = [[r["metrics"][metric] for r in runs if path_of(r) == o and r["status"] == "succeeded"
                 and r["metrics"].get(metric) is not None] for o in orchs]
        if any(data):
            box = ax.boxplot(data, patch_artist=True, showmeans=False)
            ax.set_xticks(range(1, len(orchs) + 1), [f"{o}\nn={len(d)}" for o, d in zip(orchs, data, strict=False)])
            for patch, o in zip(box["boxes"], orchs, strict=False):
                patch.set_facecolor(path_colour(o))
                patch.set_alpha(0.6)
            for i, (values, o) in enumerate(zip(data, orchs, strict=False), start=1):
                xs = [i + 0.12 * ((j % 5) - 2) / 2 for j in range(len(values))]
                ax.scatter(xs, values, color=path_colour(o), edgecolor="black", linewidth=0.5, s=28, zorder=3)
                if values:
                    med = statistics.median(values)
                    ax.annotate(quantity(med, "s"), (i + 0.3, med), fontsize=8, va="center")
        highest = max((v for values in data for v in values), default=0.0)
        ax.set_ylim(bottom=0, top=highest * 1.12 or None)  # room above the highest dot for its label
        ax.set_xlim(0.5, len(orchs) + 0.9)
        ax.set_title(title + " — lower is better")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_cost(runs: list[dict[str, Any]], path: Path, splits: dict[str, dict[str, float] | None]) -> None:
    """Cost per run from $0, split into compute and overhead, each bar labelled with its total."""
    plt = _pyplot()
    from llmpack.compare import quantity

    ok = [r for r in runs if r["status"] == "succeeded" and r["metrics"].get("cost_usd") is not None]
    ok.sort(key=lambda r: r["metrics"]["cost_usd"])
    fig, ax = plt.subplots(figsize=(11, 1.4 + 0.4 * max(1, len(ok))))
    for y, r in enumerate(ok):
        total = r["metrics"]["cost_usd"]
        split = splits.get(r["pipeline_run"])
        if split:
            ax.barh(y, split["compute_usd"], color=path_colour(path_of(r)), alpha=0.9,
                    label="compute (training, evaluating)" if y == 0 else None)
            ax.barh(y, split["overhead_usd"], left=split["compute_usd"], color=path_colour(path_of(r)), alpha=0.35,
                    hatch="//", edgecolor="white", label="overhead (start-up, model load, hand-overs)" if y == 0 else None)
        else:
            ax.barh(y, total, color=path_colour(path_of(r)), alpha=0.85)
        ax.annotate(quantity(total, "$"), (total, y), xytext=(4, 0), textcoords="offset points", fontsize=8, va="center")
    ax.set_yticks(range(len(ok)))
    ax.set_yticklabels([f"{r['orchestrator']} · {r['pipeline_run'][-6:]}" for r in ok])
    ax.invert_yaxis()
    ax.set_xlim(left=0, right=max([r["metrics"]["cost_usd"] for r in ok], default=1) * 1.18 or 1)
    ax.set_xlabel("cost per run, USD (GPU-seconds billed x price)")
    split_any = any(splits.values())
    if split_any:  # between the title and the bars: inside, it hid the costliest bar's label
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=8, frameon=False)
    ax.set_title("Cost per run — cheapest at the top; solid = compute, hatched = overhead", pad=22 if split_any else 6)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


