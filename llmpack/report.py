"""The comparison report: report.md, a self-contained report.html, report.json and PNG charts.

A report is built from run records (the ``llmpack run --json`` summaries, or the same rebuilt
from MLflow alone by :func:`runs_from_mlflow`, so cluster runs logged from anywhere can be
reported). Someone who opens the HTML sees which path reached training first and which cost
least from the headline and the charts, without reading a number.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from components.errors import InputError
from components.telemetry import ALL_EVENTS

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


def _colour(orch: str) -> str:
    return PALETTE.get(orch, "#444444")


# --------------------------------------------------------------------------- loading


def runs_from_mlflow(mc: Any, run_group: str) -> list[dict[str, Any]]:
    """Rebuild the run records of a run group from MLflow alone."""
    from components import tracking

    found = mc.search_runs(
        [tracking.experiment_id(mc)],
        filter_string=f"tags.`llmpack.run_group` = '{run_group}' and tags.`{tracking.RECORD_TAG}` = 'pipeline'",
        max_results=5000,
        order_by=["attributes.start_time ASC"],
    )
    runs = []
    for r in found:
        tags = {k: v for k, v in r.data.tags.items() if k.startswith("llmpack.")}
        metrics: dict[str, Any] = {k: v for k, v in r.data.metrics.items() if "." not in k}
        events: dict[str, dict[str, float]] = {}
        for key, value in r.data.metrics.items():
            kind, _, rest = key.partition(".")
            step, _, name = rest.partition(".")
            if kind == "event" and name in ALL_EVENTS:
                events.setdefault(step, {})[name] = value
        status = tags.get("llmpack.status") or ("succeeded" if r.info.status == "FINISHED" else r.info.status.lower())
        runs.append(
            {
                "run_group": run_group,
                "pipeline_run": tags.get("llmpack.pipeline_run", r.info.run_id),
                "orchestrator": tags.get("llmpack.orchestrator", "unknown"),
                "mode": tags.get("llmpack.mode", "unknown"),
                "status": status,
                "error": tags.get("llmpack.error"),
                "submitted_at": float(r.data.params.get("submitted_at", r.info.start_time / 1000)),
                "metrics": metrics,
                "tags": tags,
                "events": events,
                "artifacts": {"mlflow_run_id": r.info.run_id},
            }
        )
    if not runs:
        raise InputError(f"run group {run_group!r}: no llmpack runs in MLflow at {tracking.redact_uri(str(mc.tracking_uri))}")
    return runs


# --------------------------------------------------------------------------- analysis


def leaders(summary: dict[str, dict[str, dict[str, Any]]]) -> dict[str, str | None]:
    """Which orchestrator is best on the headline measures (by median)."""

    def best(metric: str, high: bool = False) -> str | None:
        scored = [(v[metric]["p50"], o) for o, v in summary.items() if v.get(metric, {}).get("p50") is not None]
        if not scored:
            return None
        return (max if high else min)(scored)[1]

    return {
        "first_to_training": best("time_to_first_step_s"),
        "fastest_spinup": best("spinup_s"),
        "cheapest": best("cost_usd"),
        "least_overhead": best("pipeline_overhead_s"),
    }


def break_even(
    runs: list[dict[str, Any]], control_plane_usd_month: dict[str, float]
) -> dict[str, Any] | None:
    """Where the cheapest orchestrator flips as training GPU-hours per month grow.

    Monthly cost of orchestrator o at H training GPU-hours: ``C_o + H * u_o``, where ``C_o`` is
    its control-plane cost per month (given) and ``u_o`` its measured USD per training
    GPU-hour: Σ cost_usd / Σ (train_s x GPUs / 3600) over its succeeded runs.
    """
    unit: dict[str, float] = {}
    for orch in control_plane_usd_month:
        mine = [r for r in runs if r["orchestrator"] == orch and r["status"] == "succeeded"]
        cost = sum(r["metrics"].get("cost_usd") or 0.0 for r in mine)
        train_h = sum((r["metrics"].get("train_s") or 0.0) * float(r["tags"].get("llmpack.gpu_count", 0) or 0) / 3600 for r in mine)
        if cost > 0 and train_h > 0:
            unit[orch] = cost / train_h
    if len(unit) < 2:
        return None
    fixed = {o: control_plane_usd_month[o] for o in unit}

    def cheapest(h: float) -> str:
        return min(unit, key=lambda o: (fixed[o] + h * unit[o], o))

    # Lower envelope of lines: walk the crossing points in order.
    crossings = sorted(
        {
            (fixed[b] - fixed[a]) / (unit[a] - unit[b])
            for a in unit
            for b in unit
            if a < b and unit[a] != unit[b] and (fixed[b] - fixed[a]) / (unit[a] - unit[b]) > 0
        }
    )
    segments: list[dict[str, Any]] = []
    start, current = 0.0, cheapest(0.0)
    for h in crossings:
        after = cheapest(h * (1 + 1e-9) + 1e-9)
        if after != current:
            segments.append({"from_gpu_hours": start, "to_gpu_hours": h, "cheapest": current})
            start, current = h, after
    segments.append({"from_gpu_hours": start, "to_gpu_hours": None, "cheapest": current})
    inputs = ", ".join(f"{o} ${fixed[o]:,.0f}/month + ${unit[o]:,.2f}/training GPU-hour" for o in sorted(unit))
    if len(segments) == 1:
        sentence = f"{segments[0]['cheapest']} is cheapest at every volume (inputs: {inputs})."
    else:
        parts = [f"{s['cheapest']} is cheapest up to {s['to_gpu_hours']:,.0f} training GPU-hours/month" for s in segments[:-1]]
        sentence = "; ".join(parts) + f", then {segments[-1]['cheapest']} (inputs: {inputs})."
    return {"unit_usd_per_train_gpu_hour": unit, "control_plane_usd_month": fixed, "segments": segments, "sentence": sentence}


def parse_control_plane(items: tuple[str, ...] | list[str], path: str | None = None) -> dict[str, float]:
    """``--control-plane-cost kfp=450`` flags and/or a YAML ``{kfp: 450, argo: 120}``."""
    out: dict[str, float] = {}
    if path:
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise InputError(f"{path}: cannot read control-plane costs ({type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a mapping like 'kfp: 450'")
        for key, value in data.items():
            out[str(key)] = _usd(value, f"{path}: {key}")
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--control-plane-cost {item!r}: expected ORCHESTRATOR=USD_PER_MONTH")
        out[key] = _usd(value, f"--control-plane-cost {key}")
    return out


def _usd(value: Any, where: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {value!r} is not a number") from None
    if v < 0 or v != v:
        raise InputError(f"{where}: must be >= 0")
    return v


# --------------------------------------------------------------------------- charts


def _phase_spans(events: dict[str, float]) -> list[tuple[str, float, float, str]]:
    spans = []
    for label, start_names, end_name, colour in PHASES:
        start = next((events[n] for n in start_names.split("|") if n in events), None)
        end = events.get(end_name)
        if start is not None and end is not None and end > start:
            spans.append((label, start, end, colour))
    return spans


def chart_timeline(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes = [r for r in runs if r.get("events")]
    fig, ax = plt.subplots(figsize=(11, 2.2 + 0.45 * max(1, len(lanes))))
    for y, run in enumerate(lanes):
        t0 = run["submitted_at"]
        steps = sorted(run["events"].items(), key=lambda kv: min(kv[1].values()))
        first_start = min((min(ev.values()) for _, ev in steps), default=t0)
        ax.barh(y, first_start - t0, left=0, color="#eeeeee", edgecolor="#bbbbbb", height=0.7)
        for step, ev in steps:
            for _label, s, e, colour in _phase_spans(ev):
                ax.barh(y, e - s, left=s - t0, color=colour, height=0.7, edgecolor="white", linewidth=0.4)
            if "first_step" in ev:
                ax.plot(ev["first_step"] - t0, y, marker="v", color="black", markersize=7)
            if step == "finetune" and "process_started" in ev:
                ax.text(ev["process_started"] - t0, y + 0.42, "finetune", fontsize=7, va="bottom")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{r['orchestrator']} · {r['pipeline_run'][-6:]}" for r in lanes])
    for tick, run in zip(ax.get_yticklabels(), lanes, strict=False):
        tick.set_color(_colour(run["orchestrator"]))
    ax.invert_yaxis()
    ax.set_xlabel("seconds since submit")
    ax.set_title("Timeline per run: each step's phases; gaps are orchestrator overhead; ▼ = first training step")
    handles = [Patch(color="#eeeeee", label="submit → first step process")] + [Patch(color=c, label=lbl) for lbl, _, _, c in PHASES]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18 if len(lanes) > 3 else -0.35),
              fontsize=7, ncol=4, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_boxes(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    orchs = list(dict.fromkeys(r["orchestrator"] for r in runs if r["status"] == "succeeded"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, metric, title in ((axes[0], "spinup_s", "Spin-up (s)"), (axes[1], "time_to_first_step_s", "Time to first training step (s)")):
        data = [[r["metrics"][metric] for r in runs if r["orchestrator"] == o and r["status"] == "succeeded"
                 and r["metrics"].get(metric) is not None] for o in orchs]
        if any(data):
            box = ax.boxplot(data, patch_artist=True, showmeans=False)
            ax.set_xticks(range(1, len(orchs) + 1), orchs)
            for patch, o in zip(box["boxes"], orchs, strict=False):
                patch.set_facecolor(_colour(o))
                patch.set_alpha(0.6)
            for i, (values, o) in enumerate(zip(data, orchs, strict=False), start=1):
                xs = [i + 0.12 * ((j % 5) - 2) / 2 for j in range(len(values))]
                ax.scatter(xs, values, color=_colour(o), edgecolor="black", linewidth=0.5, s=28, zorder=3)
            medians = [sorted(d)[len(d) // 2] if d else float("inf") for d in data]
            best = medians.index(min(medians))
            ax.get_xticklabels()[best].set_fontweight("bold")
        ax.set_title(title + " — lower is better")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_cost(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in runs if r["status"] == "succeeded" and r["metrics"].get("cost_usd") is not None]
    ok.sort(key=lambda r: r["metrics"]["cost_usd"])
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.4 * max(1, len(ok))))
    for y, r in enumerate(ok):
        ax.barh(y, r["metrics"]["cost_usd"], color=_colour(r["orchestrator"]), alpha=0.85)
    ax.set_yticks(range(len(ok)))
    ax.set_yticklabels([f"{r['orchestrator']} · {r['pipeline_run'][-6:]}" for r in ok])
    ax.invert_yaxis()
    ax.set_xlabel("cost per run, USD (GPU-seconds billed x price)")
    ax.set_title("Cost per run — cheapest at the top")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- documents

TABLE_COLUMNS = (
    ("spinup_s", "spin-up s"),
    ("time_to_first_step_s", "to first step s"),
    ("total_s", "total s"),
    ("pipeline_overhead_s", "overhead s"),
    ("tokens_per_s", "tokens/s"),
    ("cost_usd", "cost $"),
    ("usd_per_1m_tokens", "$/1M tokens"),
    ("goodput", "goodput"),
)


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v != 0 and abs(v) < 10**-digits:
        return f"{v:.2e}"
    return f"{v:,.{digits}f}" if isinstance(v, float) else str(v)


def _cell(stats: dict[str, Any], with_p90: bool) -> str:
    if not stats or stats.get("p50") is None:
        return "-"
    text = _num(stats["p50"])
    if with_p90 and stats["n"] > 1:
        text += f" / {_num(stats['p90'])}"
    return text


def markdown(result: dict[str, Any], lead: dict[str, str | None], be: dict[str, Any] | None) -> str:
    summary = result["summary"]
    priced = next((r["tags"] for r in result["runs"] if r["status"] == "succeeded"), result["runs"][0]["tags"])
    lines = [
        f"# llmpack comparison — run group `{result['run_group']}`",
        "",
        _headline(lead),
        "",
        f"Cells are p50 / p90 over n runs ({result['percentile_method']}); p99 needs n >= 10 and is "
        "reported in report.json only when estimated.",
        "",
        "| orchestrator | n | " + " | ".join(h for _, h in TABLE_COLUMNS) + " |",
        "|---|---|" + "---|" * len(TABLE_COLUMNS),
    ]
    for orch, stats in summary.items():
        n = stats["total_s"]["n"]
        lines.append(f"| {orch} | {n} | " + " | ".join(_cell(stats.get(k, {}), True) for k, _ in TABLE_COLUMNS) + " |")
    failed = [r for r in result["runs"] if r["status"] != "succeeded"]
    if failed:
        lines += ["", "## Failed runs", ""]
        lines += [f"- **{r['orchestrator']}** `{r['pipeline_run']}`: {r.get('error') or r['status']}" for r in failed]
    lines += ["", "## Break-even", "", be["sentence"] if be else "No control-plane costs given (use --control-plane-cost kfp=USD ...)."]
    lines += [
        "",
        "## Charts",
        "",
        "![timeline](timeline.png)",
        "",
        "![spin-up and time to first step](spinup_boxplot.png)",
        "",
        "![cost per run](cost_per_run.png)",
        "",
        "Cost: GPU count x billed seconds (container start, or process start locally, to finish) x price per GPU-hour / 3600; "
        f"price {priced.get('llmpack.price_per_gpu_hour')} USD/GPU-hour from {priced.get('llmpack.price_source')}.",
    ]
    return "\n".join(lines) + "\n"


def _headline(lead: dict[str, str | None]) -> str:
    parts = []
    if lead["first_to_training"]:
        parts.append(f"**{lead['first_to_training']}** reached the first training step first")
    if lead["cheapest"]:
        parts.append(f"**{lead['cheapest']}** cost least")
    return (" and ".join(parts) + " (medians).") if parts else "No succeeded runs."


def html_page(md_result: dict[str, Any], lead: dict[str, str | None], be: dict[str, Any] | None, charts: dict[str, Path]) -> str:
    summary = md_result["summary"]

    def img(name: str) -> str:
        data = base64.b64encode(charts[name].read_bytes()).decode()
        return f'<img alt="{name}" src="data:image/png;base64,{data}">'

    def badge(orch: str | None) -> str:
        if not orch:
            return "—"
        return f'<span class="badge" style="background:{_colour(orch)}">{html.escape(orch)}</span>'

    rows = []
    for orch, stats in summary.items():
        cells = "".join(f"<td>{html.escape(_cell(stats.get(k, {}), True))}</td>" for k, _ in TABLE_COLUMNS)
        rows.append(f"<tr><th>{badge(orch)}</th><td>{stats['total_s']['n']}</td>{cells}</tr>")
    failed = "".join(
        f"<li>{badge(r['orchestrator'])} <code>{html.escape(r['pipeline_run'])}</code>: {html.escape(str(r.get('error')))}</li>"
        for r in md_result["runs"]
        if r["status"] != "succeeded"
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>llmpack comparison {html.escape(md_result['run_group'])}</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;color:#222}}
.hero{{display:flex;gap:1.5em;margin:1em 0}} .card{{flex:1;border:1px solid #ddd;border-radius:8px;padding:1em;text-align:center}}
.card .label{{color:#666;font-size:.9em}} .badge{{color:#fff;border-radius:4px;padding:.15em .5em;font-weight:600}}
.card .badge{{font-size:1.6em}} table{{border-collapse:collapse;width:100%;font-size:.9em}}
td,th{{border-bottom:1px solid #eee;padding:.35em .5em;text-align:right}} th:first-child{{text-align:left}}
img{{max-width:100%;margin:1em 0}} .note{{color:#666;font-size:.85em}}
</style></head><body>
<h1>llmpack comparison</h1>
<p class="note">run group <code>{html.escape(md_result['run_group'])}</code></p>
<div class="hero">
<div class="card"><div class="label">first to reach training</div>{badge(lead['first_to_training'])}</div>
<div class="card"><div class="label">cheapest</div>{badge(lead['cheapest'])}</div>
<div class="card"><div class="label">least pipeline overhead</div>{badge(lead['least_overhead'])}</div>
</div>
{img('timeline')}
{img('spinup_boxplot')}
{img('cost_per_run')}
<h2>Numbers</h2>
<p class="note">p50 / p90 ({html.escape(md_result['percentile_method'])}); p99 only with n &ge; 10 (see report.json).</p>
<table><tr><th>orchestrator</th><th>n</th>{''.join(f'<th>{html.escape(h)}</th>' for _, h in TABLE_COLUMNS)}</tr>
{''.join(rows)}</table>
{('<h2>Failed runs</h2><ul>' + failed + '</ul>') if failed else ''}
<h2>Break-even</h2><p>{html.escape(be['sentence']) if be else 'No control-plane costs given.'}</p>
</body></html>
"""


def write_report(result: dict[str, Any], out_dir: Path, control_plane: dict[str, float] | None = None) -> Path:
    """Write the whole report into ``out_dir`` atomically (a temp dir renamed at the end)."""
    out_dir = Path(out_dir).resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"report directory {out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "report.json").exists():
        raise InputError(f"report directory {out_dir}: not empty and not an llmpack report; choose another")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        runs = result["runs"]
        lead = leaders(result["summary"])
        be = break_even(runs, control_plane) if control_plane else None
        charts = {"timeline": tmp / "timeline.png", "spinup_boxplot": tmp / "spinup_boxplot.png", "cost_per_run": tmp / "cost_per_run.png"}
        chart_timeline(runs, charts["timeline"])
        chart_boxes(runs, charts["spinup_boxplot"])
        chart_cost(runs, charts["cost_per_run"])
        full = {**result, "leaders": lead, "break_even": be}
        (tmp / "report.json").write_text(json.dumps(full, indent=2, sort_keys=True, default=str) + "\n")
        (tmp / "report.md").write_text(markdown(result, lead, be))
        (tmp / "report.html").write_text(html_page(result, lead, be, charts))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
