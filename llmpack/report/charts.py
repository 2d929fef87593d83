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

PHASES = (
    # (label, from event, to event, colour)
    # A pod is bound to a new node only once the node is Ready: provisioning spans creation to
    # node ready and is drawn over the queue span; pull + container start follows scheduling.
    ("queue", "pod_created", "pod_scheduled", "#c7c7c7"),
    ("provision", "pod_created", "node_ready", "#9467bd"),
    ("pull + container start", "pod_scheduled", "container_started", "#8c564b"),
    ("process start-up", "container_started|process_started", "model_loaded", "#bcbd22"),
    ("to first step", "model_loaded", "first_step", "#d62728"),
    ("working (first step or load → finished)", "first_step|model_loaded|process_started", "finished", "#17becf"),
)


def path_colour(orch: str) -> str:
    """A path's colour, its backend's (``Coloured.colour``); a fused variant (``argo+fuse-gpu``) takes its backend's."""
    from llmpack.backends import colour

    return colour(orch.split("+", 1)[0])


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
    matplotlib.rcParams["text.parse_math"] = False  # a store's text is text: "$\\x$" is never TeX to parse (or fail on)
    import matplotlib.pyplot as plt

    return plt


# Each authored step's colour in the timeline's step band (light, apart from the phase colours).
STEP_COLOURS = ("#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6", "#fb9a99", "#ffff99", "#8dd3c7", "#bebada")
MIN_N_FOR_BOX = 3  # below it a box collapses onto its dots and reads as an error bar: dots only


def step_colours(runs: list[dict[str, Any]]) -> dict[str, str]:
    """Every step the runs recorded, in the order they ran (by their median start), with its colour."""
    starts: dict[str, list[float]] = {}
    for run in runs:
        for step, ev in (run.get("events") or {}).items():
            if ev:
                starts.setdefault(step, []).append(min(ev.values()) - run["submitted_at"])
    order = sorted(starts, key=lambda s: (statistics.median(starts[s]), s))
    return {step: STEP_COLOURS[i % len(STEP_COLOURS)] for i, step in enumerate(order)}


FAILED_EDGE = "#d62728"


def failed_step(run: dict[str, Any]) -> str | None:
    """The step whose failure ended ``run``: its ``failed_step``, else the one its error names
    (``step 'boom' failed: ...``, as a record rebuilt from MLflow keeps it); None for a run that did not fail."""
    import re

    if run.get("status") == "succeeded":
        return None
    if run.get("failed_step"):
        return str(run["failed_step"])
    found = re.match(r"step '([^']{1,200})' failed", str(run.get("error") or ""))
    return found.group(1) if found else None


def chart_timeline(runs: list[dict[str, Any]], path: Path) -> None:
    """One lane per run from submit (0 s): a band naming each step over the bar of its phases.

    Each step's band segment carries the step's name inside it where the name fits, and the step
    legend beside the plot names every colour; the phase legend lists only the phases drawn.
    """
    plt = _pyplot()
    from matplotlib.patches import Patch

    lanes = [r for r in runs if r.get("events")]
    colours = step_colours(lanes)
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.62 * max(1, len(lanes))), layout="constrained")
    seen: dict[str, str] = {}
    names = []
    gap = any_failed = retried = False
    for y, run in enumerate(lanes):
        t0 = run["submitted_at"]
        steps = sorted(run["events"].items(), key=lambda kv: min(kv[1].values()))
        first_start = min((min(ev.values()) for _, ev in steps), default=t0)
        if first_start > t0:
            gap = True
            ax.barh(y + 0.1, first_start - t0, left=0, color="#eeeeee", edgecolor="#bbbbbb", height=0.5)
        failed = failed_step(run)
        for step, ev in steps:
            start, end = min(ev.values()), max(ev.values())
            broke = step == failed
            band = ax.barh(y - 0.3, end - start, left=start - t0, height=0.26, color=colours[step],
                           edgecolor=FAILED_EDGE if broke else "white", linewidth=1.6 if broke else 0.6,
                           hatch="xx" if broke else None)
            any_failed = any_failed or broke
            names.append((ax.text(start - t0 + (end - start) / 2, y - 0.3, step, fontsize=7, ha="center", va="center",
                                  clip_on=True), band.patches[0]))
            for label, s, e, colour in _phase_spans(ev):
                seen.setdefault(label, colour)
                ax.barh(y + 0.1, e - s, left=s - t0, color=colour, height=0.5, edgecolor="white", linewidth=0.4)
            if "first_step" in ev:
                ax.plot(ev["first_step"] - t0, y + 0.1, marker="v", color="black", markersize=7)
        for a in run.get("retried_attempts") or []:  # an attempt retried: its band faded and hatched (trial 7)
            if a.get("started_at") is not None and a.get("ended_at") is not None and a["step"] in colours:
                retried = True
                ax.barh(y - 0.3, a["ended_at"] - a["started_at"], left=a["started_at"] - t0, height=0.26,
                        color=colours[a["step"]], alpha=0.45, hatch="//", edgecolor="white", linewidth=0.6)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{path_of(r)} · {r['pipeline_run'][-6:]}" for r in lanes])
    for tick, run in zip(ax.get_yticklabels(), lanes, strict=False):
        tick.set_color(path_colour(path_of(run)))
    ax.set_ylim(len(lanes) - 0.5, -0.6)  # inverted: the first run on top
    ax.set_xlim(left=0)
    ax.set_xlabel("seconds since submit")
    trained = any("first_step" in ev for r in lanes for ev in r["events"].values())
    ax.set_title("Timeline per run: steps (top band) and their phases; gaps = pipeline overhead"
                 + ("; ▼ = first training step" if trained else ""), fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    step_handles = [Patch(color=c, label=s) for s, c in colours.items()]
    if any_failed:  # the step whose failure ended its run: hatched, edged red
        step_handles.append(Patch(facecolor="white", edgecolor=FAILED_EDGE, hatch="xx", label="failed"))
    if retried:
        step_handles.append(Patch(facecolor="#cccccc", hatch="//", label="attempt retried"))
    phase_handles = ([Patch(facecolor="#eeeeee", edgecolor="#bbbbbb", label="submit → first step's process")]
                     if gap else []) + [Patch(color=c, label=lbl) for lbl, _, _, c in PHASES if lbl in seen]
    if step_handles:
        steps_legend = ax.legend(handles=step_handles, title="step (top band)", loc="upper left",
                                 bbox_to_anchor=(1.01, 1.0), fontsize=8, title_fontsize=8, frameon=False,
                                 alignment="left")
        ax.add_artist(steps_legend)
    if phase_handles:
        ax.legend(handles=phase_handles, title="phase (bar)", loc="lower left", bbox_to_anchor=(1.01, 0.0),
                  fontsize=8, title_fontsize=8, frameon=False, alignment="left")
    fig.canvas.draw()  # lay out, then keep each step name only where it fits inside its segment
    renderer = fig.canvas.get_renderer()
    for text, patch in names:
        box, bar = text.get_window_extent(renderer), patch.get_window_extent(renderer)
        if box.width + 4 > bar.width:
            text.set_visible(False)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_boxes(runs: list[dict[str, Any]], path: Path, *, first_step: bool = True, untrained: bool = False) -> None:
    """Spin-up and time to first step per path from 0 s, every run a dot, the median labelled.

    ``first_step=False`` (a pipeline without finetune): spin-up alone, named as the glossary names it then
    (``untrained``: its first step's start).

    A box (quartiles) is drawn only for a path with at least :data:`MIN_N_FOR_BOX` runs; with
    fewer, a box collapses onto its dots and reads as an error bar, so those paths show dots only.
    """
    plt = _pyplot()
    from llmpack.compare.comparison import quantity
    from llmpack.ui.glossary import term

    orchs = list(dict.fromkeys(path_of(r) for r in runs if r["status"] == "succeeded"))
    panels = [("spinup_s", "spinup_first" if untrained else "spinup")]
    if first_step:
        panels.append(("time_to_first_step_s", "time_to_first_step"))
    fig, axes = plt.subplots(1, len(panels), figsize=(11 if first_step else 6.5, 3.8), squeeze=False)
    for ax, (metric, key) in zip(axes[0], panels, strict=True):
        data = [[r["metrics"][metric] for r in runs if path_of(r) == o and r["status"] == "succeeded"
                 and r["metrics"].get(metric) is not None] for o in orchs]
        boxed = [i for i, d in enumerate(data, start=1) if len(d) >= MIN_N_FOR_BOX]
        if boxed:
            box = ax.boxplot([data[i - 1] for i in boxed], positions=boxed, patch_artist=True, showmeans=False,
                             showfliers=False, widths=0.5, medianprops={"color": "black"})
            for patch, i in zip(box["boxes"], boxed, strict=False):
                patch.set_facecolor(path_colour(orchs[i - 1]))
                patch.set_alpha(0.45)
        for i, (values, o) in enumerate(zip(data, orchs, strict=False), start=1):
            xs = [i + 0.12 * ((j % 5) - 2) / 2 for j in range(len(values))]
            ax.scatter(xs, values, color=path_colour(o), edgecolor="black", linewidth=0.5, s=28, zorder=3)
            if values:
                med = statistics.median(values)
                ax.annotate(quantity(med, "s"), (i + 0.3, med), fontsize=8, va="center")
        ax.set_xticks(range(1, len(orchs) + 1), [f"{o}\nn={len(d)}" for o, d in zip(orchs, data, strict=False)])
        highest = max((v for values in data for v in values), default=0.0)
        ax.set_ylim(bottom=0, top=highest * 1.12 or None)  # room above the highest dot for its label
        ax.set_xlim(0.5, len(orchs) + 0.9)
        ax.set_title(f"{term(key).name.capitalize()} (s) — lower is better", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    few = any(0 < len([r for r in runs if path_of(r) == o and r["status"] == "succeeded"]) < MIN_N_FOR_BOX
              for o in orchs)
    if few:
        fig.text(0.01, 0.01,
                 f"each dot is a run; boxes (quartiles, median line) only for paths with n >= {MIN_N_FOR_BOX}",
                 fontsize=8, color="#555555")
    fig.tight_layout(rect=(0, 0.04 if few else 0, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_cost(runs: list[dict[str, Any]], path: Path, splits: dict[str, dict[str, float] | None]) -> None:
    """Cost per run from $0, split into GPU compute and billed non-compute, each bar labelled with its total.

    The legend is built from its own handles, so it is the same whichever run is drawn first (a
    run with no split, e.g. one whose retried attempt left no finish, drew no labelled bar before:
    matplotlib's "No artists with labels found to put in legend").
    """
    plt = _pyplot()
    from matplotlib.patches import Patch

    from llmpack.ui.glossary import term
    from llmpack.ui.numbers import money

    ok = [r for r in runs if r["status"] == "succeeded" and r["metrics"].get("cost_usd") is not None]
    ok.sort(key=lambda r: r["metrics"]["cost_usd"])
    fig, ax = plt.subplots(figsize=(11, 1.4 + 0.4 * max(1, len(ok))))
    for y, r in enumerate(ok):
        total = r["metrics"]["cost_usd"]
        split = splits.get(r["pipeline_run"])
        if split:
            ax.barh(y, split["compute_usd"], color=path_colour(path_of(r)), alpha=0.9)
            ax.barh(y, split["overhead_usd"], left=split["compute_usd"], color=path_colour(path_of(r)), alpha=0.35,
                    hatch="//", edgecolor="white")
        else:
            ax.barh(y, total, color=path_colour(path_of(r)), alpha=0.85)
        ax.annotate(money(total), (total, y), xytext=(4, 0), textcoords="offset points", fontsize=8, va="center")
    ax.set_yticks(range(len(ok)))
    ax.set_yticklabels([f"{path_of(r)} · {r['pipeline_run'][-6:]}" for r in ok])
    ax.invert_yaxis()
    ax.set_xlim(left=0, right=max([r["metrics"]["cost_usd"] for r in ok], default=1) * 1.18 or 1)
    ax.set_xlabel("cost per run, USD (GPUs × billed seconds × price per GPU-hour)")
    split_any = any(splits.get(r["pipeline_run"]) for r in ok)
    if split_any:  # between the title and the bars: inside, it hid the costliest bar's label
        handles = [Patch(facecolor="#777777", label=f"{term('gpu_compute').name} (training, evaluating)"),
                   Patch(facecolor="#dddddd", hatch="//", edgecolor="#777777",
                         label=f"{term('billed_non_compute').name} (start-up, model load, hand-overs, retries)")]
        ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=8, frameon=False)
    projected = all(r.get("mode") == "local" for r in ok)
    ax.set_title("Cost per run" + (" (projected)" if projected and ok else "") + " — cheapest at the top; solid = "
                 f"{term('gpu_compute').name}, hatched = {term('billed_non_compute').name}", pad=22 if split_any else 6,
                 fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


