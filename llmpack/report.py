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
import statistics
import tempfile
from pathlib import Path
from typing import Any

from components import yamltext
from components.errors import InputError
from components.fusion import path_of
from components.record.telemetry import ALL_EVENTS, group_by_step

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
    """A path's colour; a fused variant (``argo+fuse-gpu``) takes its backend's."""
    return PALETTE.get(orch, PALETTE.get(orch.split("+", 1)[0], "#444444"))


# --------------------------------------------------------------------------- loading


def runs_from_mlflow(mc: Any, run_group: str) -> list[dict[str, Any]]:
    """Rebuild the run records of a run group from MLflow alone."""
    from components.record import tracking

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
        events, retried = _attempts_from_metrics(r.data.metrics, tags)
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
                "retried_attempts": retried,
                "artifacts": {"mlflow_run_id": r.info.run_id},
            }
        )
    if not runs:
        raise InputError(f"run group {run_group!r}: no llmpack runs in MLflow at {tracking.redact_uri(str(mc.tracking_uri))}")
    return runs


def _attempts_from_metrics(metrics: dict[str, float], tags: dict[str, str]) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """From a pipeline record's ``event.*`` / ``metric.*`` values: each step's events (its last
    attempt's) and the retried attempts, priced at the record's price tag (a GPU step's GPUs from
    the pipeline spec)."""
    from components.record import close as record
    from components.record import cost, tracking
    from components.record.telemetry import RunContext

    ctx = RunContext(run_group=tags.get("llmpack.run_group", ""), pipeline_run=tags.get("llmpack.pipeline_run", ""),
                     orchestrator=tags.get("llmpack.orchestrator", ""), mode=tags.get("llmpack.mode", ""), submitted_at=0.0)
    records = tracking.records_from_run(metrics, ctx)
    steps = group_by_step(records)
    events = {step: {n: v for n, v in st.events.items() if n in ALL_EVENTS} for step, st in steps.items()}
    events = {step: ev for step, ev in events.items() if ev}
    try:
        per_hour = float(tags.get("llmpack.price_per_gpu_hour", ""))
        price: cost.Price | None = cost.Price(gpu_type=tags.get("llmpack.gpu_type", ""), per_gpu_hour=per_hour,
                                              source=tags.get("llmpack.price_source", ""))
    except ValueError:
        price = None
    uses = [cost.GpuUse(step=step, gpus=gpus) for step, gpus in gpu_steps().items()]
    return events, record.retried_attempts(records, uses, price)


def retried_attempts(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run's retried attempts (``{step, attempt, billed_s, gpu_hours, cost_usd}``), from its summary."""
    return list(run.get("retried_attempts") or [])


def retry_lines(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Per run with retries, ``(path, text)``: each retried attempt, its seconds and what its GPUs cost.

    Those seconds are in the run's ``gpu_hours``, ``cost_usd`` and goodput (every attempt is billed);
    this says how much of the bill the retries were.
    """
    from llmpack.compare import quantity

    out = []
    for r in runs:
        retried = retried_attempts(r)
        if not retried:
            continue
        parts = []
        for a in retried:
            held = quantity(a.get("billed_s"), "s") if a.get("billed_s") is not None else "no finish recorded"
            what = f", {a['gpu_hours']:.4g} GPU-h" if a.get("gpu_hours") else ""
            priced = f", {quantity(a['cost_usd'], '$')}" if a.get("cost_usd") else ""
            parts.append(f"{a['step']} attempt {int(a['attempt']) + 1} failed after {held}{what}{priced}")
        total = r["metrics"].get("retry_cost_usd")
        share = ""
        if total is not None and r["metrics"].get("cost_usd"):
            share = f" ({quantity(total, '$')} of {quantity(r['metrics']['cost_usd'], '$')} billed, in the cost)"
        out.append((path_of(r), f"{r['pipeline_run']} [{r['status']}]: {len(retried)} retried attempt"
                                f"{'s' if len(retried) != 1 else ''}: " + "; ".join(parts) + share))
    return out


# --------------------------------------------------------------------------- analysis


def _unit_costs(runs: list[dict[str, Any]], orch: str) -> list[float]:
    """USD per training GPU-hour of each succeeded run of ``orch``: cost_usd / (train_s x GPUs / 3600)."""
    out = []
    for r in runs:
        if path_of(r) != orch or r["status"] != "succeeded":
            continue
        cost = r["metrics"].get("cost_usd") or 0.0
        train_h = (r["metrics"].get("train_s") or 0.0) * float(r["tags"].get("llmpack.gpu_count", 0) or 0) / 3600
        if cost > 0 and train_h > 0:
            out.append(cost / train_h)
    return out


def break_even(
    runs: list[dict[str, Any]], control_plane_usd_month: dict[str, float]
) -> dict[str, Any] | None:
    """Where the cheapest orchestrator flips as training GPU-hours per month grow, when it is beyond noise.

    Monthly cost of orchestrator o at H training GPU-hours: ``C_o + H * u_o``, where ``C_o`` is
    its control-plane cost per month (given; an orchestrator compared but not priced counts $0,
    and the sentence says so) and ``u_o`` its measured USD per training GPU-hour (median over
    its succeeded runs). The statement is made only when every pair's ``u`` differs beyond noise
    (:mod:`llmpack.stats`); otherwise the sentence says which pair does not, and why no
    break-even is claimed. Every sentence ends saying what ``u_o`` is made of (the cost basis
    the runs were billed on: GPU nodes on a cluster, containers locally), since that is where
    the volume at which the cheapest path flips comes from.
    """
    from llmpack import stats
    from llmpack.compare import quantity

    if not control_plane_usd_month:
        return None
    compared = {path_of(r) for r in runs if r["status"] == "succeeded" and r["orchestrator"] != "direct"}
    per_run = {o: _unit_costs(runs, o) for o in sorted(compared | set(control_plane_usd_month))}
    per_run = {o: v for o, v in per_run.items() if v}
    unit = {o: statistics.median(v) for o, v in per_run.items()}

    def monthly(o: str) -> float | None:  # a fused variant runs on its backend's control plane
        return control_plane_usd_month.get(o, control_plane_usd_month.get(o.split("+", 1)[0]))

    fixed = {o: monthly(o) or 0.0 for o in unit}
    assumed = sorted(o for o in unit if monthly(o) is None)
    inputs = ", ".join(f"{o} ${fixed[o]:,.0f}/month{' (not given: $0)' if o in assumed else ''} + "
                       f"{quantity(unit[o], '$')}/training GPU-hour (n={len(per_run[o])})" for o in sorted(unit))
    billed = [r for r in runs if r["status"] == "succeeded" and path_of(r) in unit]
    delays = sorted({r["tags"].get("llmpack.scale_down_delay_s", "?") for r in billed
                     if r["tags"].get("llmpack.cost_basis") == "node"})
    if delays:
        basis = (" Cost per training GPU-hour is each run's cost_usd / (train_s × GPUs): GPU nodes billed as clouds bill "
                 "them, from node Ready (or the first pod's scheduling on a node already up) to the node's removal, or "
                 f"to the last pod's finish + the autoscaler's scale-down delay ({', '.join(delays)} s) when the removal "
                 "was not seen, × the node's GPUs; a node's idle GPUs and that delay weigh most on short runs.")
    else:
        basis = (" Cost per training GPU-hour is each run's cost_usd / (train_s × GPUs): GPU time from container "
                 "start to finish (plus node provisioning) at the listed price.")
    base = {"unit_usd_per_train_gpu_hour": unit, "control_plane_usd_month": fixed, "assumed_zero": assumed,
            "segments": [], "significant": False, "cost_basis": basis.strip()}
    if len(unit) < 2:
        given = ", ".join(f"{o} ${c:,.0f}/month" for o, c in sorted(control_plane_usd_month.items()))
        return {**base, "sentence": f"Control-plane costs {given}: a break-even needs measured runs of at least two "
                                    f"orchestrators (have: {', '.join(sorted(unit)) or 'none'})." + basis}
    unclear = []
    for a in sorted(unit):
        for b in sorted(unit):
            if a < b:
                d = stats.bootstrap_median_diff(per_run[a], per_run[b])
                if d.verdict not in ("lower", "higher"):
                    unclear.append((a, b, d))
    if unclear:
        a, b, d = unclear[0]
        why = ("too few runs" if d.verdict == "too few runs" else "no clear difference")
        ci = "" if d.ci_low is None else f", 95% CI {quantity(d.ci_low, '$', signed=True)} to {quantity(d.ci_high, '$', signed=True)}"
        sentence = (f"No break-even claimed: {a} and {b} cost the same per training GPU-hour within noise ({why}: "
                    f"Δ {quantity(d.delta, '$', signed=True)}{ci}, n={d.n} vs {d.n_baseline}")
        if len(unclear) > 1:
            sentence += f"; {len(unclear) - 1} more pair(s) likewise"
        if len(unclear) == len(unit) * (len(unit) - 1) // 2:
            low = min(fixed, key=lambda o: (fixed[o], o))
            sentence += f"), so the control-plane cost decides: {low} (${fixed[low]:,.0f}/month) is cheapest"
        else:
            sentence += ")"
        return {**base, "sentence": sentence + f". Inputs: {inputs}." + basis}

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
    if len(segments) == 1:
        sentence = f"{segments[0]['cheapest']} is cheapest at every volume (inputs: {inputs})."
    else:
        parts = [f"{s['cheapest']} is cheapest up to {s['to_gpu_hours']:,.0f} training GPU-hours/month" for s in segments[:-1]]
        sentence = "; ".join(parts) + f", then {segments[-1]['cheapest']} (inputs: {inputs})."
    return {**base, "segments": segments, "significant": True, "sentence": sentence + basis}


def gpu_steps() -> dict[str, int]:
    """The pipeline's GPU steps and their GPU counts (from the one pipeline object)."""
    from components.finetune_pipeline import build

    return {t.name: t.step.execution.resources.gpus for t in build().task_order() if t.step.execution.resources.gpus > 0}


def cost_split(run: dict[str, Any], steps: dict[str, int]) -> dict[str, float] | None:
    """``{compute_usd, overhead_usd}`` of one run: what the GPU cost while it trained or evaluated, and while it did not.

    Compute is each GPU step's ``model_loaded`` to ``finished`` (training or evaluating);
    overhead is the rest of the billed GPU time: container start, imports, model load,
    node provisioning, hand-overs, and every retried attempt whole. The two add up to ``cost_usd``.
    """
    from components.record.cost import billed_seconds
    from components.record.telemetry import StepTimes

    cost = run["metrics"].get("cost_usd")
    if cost is None or run["status"] != "succeeded":
        return None
    measured = run["metrics"].get("cost_compute_usd"), run["metrics"].get("cost_overhead_usd")
    if None not in measured:  # a cluster run billed by node (components.record.cost.bill_nodes) carries its own split
        return {"compute_usd": float(measured[0]), "overhead_usd": float(measured[1])}
    billed = compute = 0.0
    for step, gpus in steps.items():
        ev = run.get("events", {}).get(step, {})
        b = billed_seconds(StepTimes(step=step, events=ev, metrics={})) if ev else None
        if b is None:
            continue
        billed += gpus * b
        if "model_loaded" in ev and "finished" in ev:
            compute += gpus * max(0.0, ev["finished"] - ev["model_loaded"])
    billed += 3600.0 * sum(a.get("gpu_hours") or 0.0 for a in retried_attempts(run))  # GPUs held by failed attempts
    if billed <= 0:
        return None
    share = min(1.0, compute / billed)
    return {"compute_usd": cost * share, "overhead_usd": cost * (1 - share)}


def report_facts(result: dict[str, Any]) -> dict[str, str]:
    """Price, its source, GPU type and mode: what every cost figure in the report rests on."""
    ok = [r for r in result["runs"] if r["status"] == "succeeded"] or result["runs"]
    tags = ok[0]["tags"] if ok else {}
    modes = sorted({r.get("mode", "unknown") for r in result["runs"]}) or ["unknown"]
    mode = "/".join(modes)
    price = tags.get("llmpack.price_per_gpu_hour", "unknown")
    return {
        "mode": mode,
        "gpu_type": str(tags.get("llmpack.gpu_type", "unknown")),
        "gpu_count": str(tags.get("llmpack.gpu_count", "?")),
        "price_per_gpu_hour": str(price),
        "price_source": str(tags.get("llmpack.price_source", "unknown")),
        "cost_note": ("local run: cost is a projection (these step durations priced as if on the GPU type above; "
                      "no GPU was billed)") if mode == "local" else "cluster run: billed GPU time at the price above",
    }


def summary_sentence(result: dict[str, Any], be: dict[str, Any] | None) -> str:
    """The plain-language answer on top of the report: only differences beyond noise, with their CI."""
    from llmpack.compare import HEADLINES

    baseline = result.get("baseline")
    verdicts = result.get("verdicts", {})
    where = "On this cluster" if result.get("mode") == "cluster" or any(r.get("mode") == "cluster" for r in result["runs"]) \
        else "On this machine"
    if not [r for r in result["runs"] if r["status"] == "succeeded"]:
        return "No run succeeded; nothing to compare."
    if baseline is None:
        return (f"{where}: no baseline, so no path is named faster or cheaper (name one with --baseline PATH); "
                "the medians are below.")
    parts = []
    for h in (HEADLINES[0], HEADLINES[3]):
        per_path = verdicts.get(h.metric, {})
        named = [e["text"] for o, e in per_path.items() if e["verdict"] in (h.lower, h.higher)]
        rest = [o for o, e in per_path.items() if o != baseline and e["verdict"] not in (h.lower, h.higher)]
        if named:
            parts.append("; ".join(named))
        if rest:
            ns = sorted({per_path[o]["n"] for o in rest})
            n_text = f"n={'/'.join(map(str, ns))} vs {per_path[baseline]['n'] if baseline in per_path else 0}"
            reason = ("too few runs for a verdict" if all(per_path[o]["verdict"] == "too few runs" for o in rest)
                      else "no clear difference")
            parts.append(f"{', '.join(rest)}: {reason} from {baseline} on {h.label} ({n_text})")
    # Spin-up and total are named too, but only where they stand out of the noise.
    also = [e["text"] for h in (HEADLINES[1], HEADLINES[2]) for e in verdicts.get(h.metric, {}).values()
            if e["verdict"] in (h.lower, h.higher)]
    if also:
        parts.append("Beyond noise: " + "; ".join(also))
    text = f"{where}, against {baseline}: " + ". ".join(parts) + "."
    if be and be.get("significant"):
        text += " At your volumes: " + be["sentence"]
    return text


def parse_control_plane(items: tuple[str, ...] | list[str], path: str | None = None) -> dict[str, float]:
    """``--control-plane-cost kfp=450`` flags and/or a YAML ``{kfp: 450, argo: 120}`` (flags win).

    Names must be orchestrators exactly as ``--backends`` spells them (``direct`` has no control
    plane); amounts must be finite and >= 0. Anything else is one line, before any run starts.
    """
    out: dict[str, float] = {}
    if path:
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except OSError as exc:
            raise InputError(f"{path}: cannot read control-plane costs ({exc.strerror or type(exc).__name__})") from None
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text; expected control-plane costs like 'kfp: 450'") from None
        data = yamltext.safe_load(text, path)
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a mapping like 'kfp: 450'")
        for key, value in data.items():
            shown = str(key) if str(key).isprintable() else repr(key)  # a key with a newline must not break the line
            out[_orchestrator(str(key), f"{path}: {shown}")] = _usd(value, f"{path}: {shown}")
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--control-plane-cost {item!r}: expected ORCHESTRATOR=USD_PER_MONTH, e.g. kfp=450")
        out[_orchestrator(key.strip(), f"--control-plane-cost {item}")] = _usd(value.strip(), f"--control-plane-cost {item}")
    return out


def check_control_plane(costs: dict[str, float], backends: list[str], where: str = "--control-plane-cost") -> None:
    """Every priced orchestrator must be one that is compared (a typo would otherwise price nothing)."""
    for orch in costs:
        if orch not in backends:
            raise InputError(f"{where} {orch}: {orch} is not among the compared paths ({', '.join(backends)})")


def _orchestrator(name: str, where: str) -> str:
    from llmpack.backends import ORCHESTRATORS

    if name in ORCHESTRATORS:
        return name
    if name == "direct":
        raise InputError(f"{where}: direct has no control plane (give one of {', '.join(ORCHESTRATORS)})")
    hint = next((f"; did you mean {o!r}?" for o in ORCHESTRATORS if o == name.lower()), "")
    raise InputError(f"{where}: unknown orchestrator {name!r} (choose from {', '.join(ORCHESTRATORS)}){hint}")


def _usd(value: Any, where: str) -> float:
    if isinstance(value, bool):  # YAML's yes/true would otherwise be 1 USD
        raise InputError(f"{where}: {value!r} is not a number of USD per month")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {value!r} is not a number of USD per month") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise InputError(f"{where}: {value!r} is not a number of USD per month")
    if v < 0:
        raise InputError(f"{where}: must be >= 0 USD per month")
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
        tick.set_color(_colour(path_of(run)))
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
                patch.set_facecolor(_colour(o))
                patch.set_alpha(0.6)
            for i, (values, o) in enumerate(zip(data, orchs, strict=False), start=1):
                xs = [i + 0.12 * ((j % 5) - 2) / 2 for j in range(len(values))]
                ax.scatter(xs, values, color=_colour(o), edgecolor="black", linewidth=0.5, s=28, zorder=3)
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
            ax.barh(y, split["compute_usd"], color=_colour(path_of(r)), alpha=0.9,
                    label="compute (training, evaluating)" if y == 0 else None)
            ax.barh(y, split["overhead_usd"], left=split["compute_usd"], color=_colour(path_of(r)), alpha=0.35,
                    hatch="//", edgecolor="white", label="overhead (start-up, model load, hand-overs)" if y == 0 else None)
        else:
            ax.barh(y, total, color=_colour(path_of(r)), alpha=0.85)
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
        return f"{v:.3g}"
    return f"{v:,.{digits}f}" if isinstance(v, float) else str(v)


def _cell(stats: dict[str, Any], with_p90: bool) -> str:
    if not stats or stats.get("p50") is None:
        return "-"
    text = _num(stats["p50"])
    if with_p90 and stats["n"] > 1:
        text += f" / {_num(stats['p90'])}"
    return text


def _cost_lines(result: dict[str, Any], splits: dict[str, dict[str, float] | None]) -> list[tuple[str, str]]:
    """Per path: median compute and overhead cost per run, and the overhead share."""
    from llmpack.compare import quantity

    out = []
    for orch in result.get("backends") or dict.fromkeys(path_of(r) for r in result["runs"]):
        mine = [splits[r["pipeline_run"]] for r in result["runs"] if path_of(r) == orch and splits.get(r["pipeline_run"])]
        if not mine:
            continue
        compute = statistics.median(s["compute_usd"] for s in mine)
        overhead = statistics.median(s["overhead_usd"] for s in mine)
        share = overhead / (compute + overhead) if compute + overhead else 0.0
        out.append((orch, f"compute {quantity(compute, '$')} + overhead {quantity(overhead, '$')} per run "
                          f"({share:.0%} overhead; medians, n={len(mine)})"))
    return out


def markdown(result: dict[str, Any], facts: dict[str, str], sentence: str, be: dict[str, Any] | None,
             splits: dict[str, dict[str, float] | None]) -> str:
    from llmpack.compare import gang_rows

    summary = result["summary"]
    lines = [
        f"# llmpack comparison — run group `{result['run_group']}`",
        "",
        sentence,
        "",
        f"Mode: {facts['mode']} · GPU: {facts['gpu_count']}x {facts['gpu_type']} · price: ${facts['price_per_gpu_hour']}/GPU-hour "
        f"({facts['price_source']}) · {facts['cost_note']}.",
        "",
        "## Verdicts against the baseline" + (f" ({result.get('baseline')})" if result.get("baseline") else ""),
        "",
    ]
    for per_path in result.get("verdicts", {}).values():
        lines += [f"- {e['text']}" for e in per_path.values()]
    lines += [
        "",
        f"Method: {result.get('verdict_method', '')}.",
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
    gangs = gang_rows(result)
    if gangs:
        lines += ["", "## Gang and queue", "", "Multi-node finetune (a TrainJob gang) on a cluster; p50 / p90 seconds.", "",
                  "| measure | " + " | ".join(f"{orch} (n)" for orch in summary) + " |", "|---|" + "---|" * len(summary)]
        for label, per_path in gangs:
            cells = [f"{_cell(per_path[o], True)} ({per_path[o]['n']})" if o in per_path else "-" for o in summary]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    failed = [r for r in result["runs"] if r["status"] != "succeeded"]
    if failed:
        lines += ["", "## Failed runs", ""]
        lines += [f"- **{r['orchestrator']}** `{r['pipeline_run']}`: {r.get('error') or r['status']}" for r in failed]
    lines += ["", "## What the money went on", ""]
    lines += [f"- **{o}**: {text}" for o, text in _cost_lines(result, splits)] or ["- no priced runs"]
    retries = retry_lines(result["runs"])
    if retries:
        lines += ["", "## Retried attempts", "", "Every attempt is billed: these are in the runs' cost, GPU-hours and goodput.", ""]
        lines += [f"- **{o}** {text}" for o, text in retries]
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
        "compute = each GPU step's model loaded to finished, overhead = the rest of the billed time.",
    ]
    return "\n".join(lines) + "\n"


def _card(label: str, unit: str, per_path: dict[str, dict[str, Any]]) -> str:
    """One headline card: per path, its median, Δ vs baseline with the CI, n, and the verdict."""
    from llmpack.compare import quantity

    rows = []
    for orch, e in per_path.items():
        if e["verdict"] in ("baseline", "no baseline"):
            delta = "baseline" if e["verdict"] == "baseline" else ""
        elif e["delta"] is None:
            delta = "—"
        else:
            ci = f" <span class=ci>95% CI [{quantity(e['ci95'][0], unit, signed=True)}, {quantity(e['ci95'][1], unit, signed=True)}]</span>" \
                if e["ci95"] else ""
            delta = f"Δ {quantity(e['delta'], unit, signed=True)}{ci}"
        verdict = e["verdict"] if e["verdict"] not in ("baseline", "no baseline") else ""
        strong = " strong" if verdict in ("faster", "slower", "cheaper", "costlier") else ""
        rows.append(
            f"<tr><th>{_badge(orch)}</th><td class=v>{html.escape(quantity(e['value'], unit))}</td>"
            f"<td class=d>{delta}</td><td class=n>n={e['n']}</td><td class='w{strong}'>{html.escape(verdict)}</td></tr>")
    return f'<div class="card"><div class="label">{html.escape(label)}</div><table class="ct">{"".join(rows)}</table></div>'


def _badge(orch: str | None) -> str:
    if not orch:
        return "—"
    return f'<span class="badge" style="background:{_colour(orch)}">{html.escape(orch)}</span>'


def html_page(result: dict[str, Any], facts: dict[str, str], sentence: str, be: dict[str, Any] | None,
              charts: dict[str, Path], splits: dict[str, dict[str, float] | None]) -> str:
    from llmpack.compare import HEADLINES, gang_rows

    summary = result["summary"]

    def img(name: str) -> str:
        data = base64.b64encode(charts[name].read_bytes()).decode()
        return f'<img alt="{name}" src="data:image/png;base64,{data}">'

    rows = []
    for orch, stats in summary.items():
        cells = "".join(f"<td>{html.escape(_cell(stats.get(k, {}), True))}</td>" for k, _ in TABLE_COLUMNS)
        rows.append(f"<tr><th>{_badge(orch)}</th><td>{stats['total_s']['n']}</td>{cells}</tr>")
    failed = "".join(
        f"<li>{_badge(r['orchestrator'])} <code>{html.escape(r['pipeline_run'])}</code>: {html.escape(str(r.get('error')))}</li>"
        for r in result["runs"]
        if r["status"] != "succeeded"
    )
    verdicts = result.get("verdicts", {})
    cards = "".join(_card(h.label, h.unit, verdicts[h.metric]) for h in HEADLINES if h.metric in verdicts)
    costs = "".join(f"<li>{_badge(o)} {html.escape(text)}</li>" for o, text in _cost_lines(result, splits))
    retries = "".join(f"<li>{_badge(o)} {html.escape(text)}</li>" for o, text in retry_lines(result["runs"]))
    if retries:
        retries = ("<h2>Retried attempts</h2><p class=note>Every attempt is billed: these are in the runs' cost, "
                   f"GPU-hours and goodput.</p><ul>{retries}</ul>")
    gangs = "".join(
        f"<tr><th>{html.escape(label)}</th>"
        + "".join(f"<td>{html.escape(_cell(per_path[o], True))} <span class=note>n={per_path[o]['n']}</span></td>"
                  if o in per_path else "<td>-</td>" for o in summary) + "</tr>"
        for label, per_path in gang_rows(result))
    if gangs:
        gangs = ("<h2>Gang and queue</h2><p class=note>Multi-node finetune (a TrainJob gang) on a cluster; "
                 "p50 / p90 seconds.</p><table class=num><tr><th>measure</th>"
                 + "".join(f"<th>{_badge(o)}</th>" for o in summary) + f"</tr>{gangs}</table>")
    baseline = result.get("baseline")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>llmpack comparison {html.escape(result['run_group'])}</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}}
.summary{{font-size:1.15em;line-height:1.45;background:#f6f8fa;border-left:4px solid #1f77b4;padding:.8em 1em;margin:1em 0}}
.facts{{display:flex;flex-wrap:wrap;gap:.4em 1.5em;color:#444;font-size:.95em;margin:.5em 0}} .facts b{{color:#222}}
.hero{{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:1em;margin:1em 0}}
.card{{border:1px solid #ddd;border-radius:8px;padding:.8em 1em;min-width:0}}
.card .label{{color:#555;font-size:.95em;font-weight:600;margin-bottom:.4em}}
.ct{{width:100%;border-collapse:collapse;font-size:.9em}} .ct td,.ct th{{border:0;padding:.25em .4em;text-align:left;vertical-align:top}}
.ct th,.ct td.v,.ct td.n,.ct td.w{{white-space:nowrap}} .ct td.v{{font-weight:600;text-align:right}} .ct td.n{{color:#666}}
.ct td.d{{width:100%}} .ci{{display:block;color:#666;font-size:.85em}}
.ct td.w{{color:#666}} .ct td.w.strong{{color:#111;font-weight:700}}
.badge{{color:#fff;border-radius:4px;padding:.1em .45em;font-weight:600;display:inline-block}}
table.num{{border-collapse:collapse;width:100%;font-size:.9em}}
table.num td,table.num th{{border-bottom:1px solid #eee;padding:.35em .5em;text-align:right}} table.num th:first-child{{text-align:left}}
img{{max-width:100%;margin:1em 0}} .note{{color:#666;font-size:.85em}}
</style></head><body>
<h1>llmpack comparison</h1>
<p class="summary">{html.escape(sentence)}</p>
<div class="facts"><span>mode <b>{html.escape(facts['mode'])}</b></span>
<span>GPU <b>{html.escape(facts['gpu_count'])}&times; {html.escape(facts['gpu_type'])}</b></span>
<span>price <b>${html.escape(facts['price_per_gpu_hour'])}/GPU-hour</b></span>
<span>price source <b>{html.escape(facts['price_source'])}</b></span>
<span>baseline <b>{html.escape(baseline or 'none')}</b></span>
<span>run group <code>{html.escape(result['run_group'])}</code></span></div>
<p class="note">{html.escape(facts['cost_note'])}.</p>
<div class="hero">{cards}</div>
<p class="note">Δ = median of the path − median of the baseline, [95% CI]. {html.escape(result.get('verdict_method', ''))}.</p>
{img('timeline')}
{img('spinup_boxplot')}
<h2>What the money went on</h2>
<ul>{costs or '<li>no priced runs</li>'}</ul>
{retries}
{img('cost_per_run')}
<h2>Break-even</h2><p>{html.escape(be['sentence']) if be else 'No control-plane costs given (use --control-plane-cost kfp=USD ...).'}</p>
<h2>Numbers</h2>
<p class="note">p50 / p90 ({html.escape(result['percentile_method'])}); p99 only with n &ge; 10 (see report.json).</p>
<table class="num"><tr><th>orchestrator</th><th>n</th>{''.join(f'<th>{html.escape(h)}</th>' for _, h in TABLE_COLUMNS)}</tr>
{''.join(rows)}</table>
{gangs}
{('<h2>Failed runs</h2><ul>' + failed + '</ul>') if failed else ''}
</body></html>
"""


def new_report_dir(parent: Path, run_group: str, now: float | None = None) -> Path:
    """``PARENT/<UTC yyyymmdd-HHMMSS>-<run group>``: every compare gets its own report, none is replaced."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    path = Path(parent) / f"{stamp}-{run_group}"
    i = 1
    while path.exists():
        i += 1
        path = Path(parent) / f"{stamp}-{run_group}-{i}"
    return path


def check_report_parent(parent: Path, flag: str) -> None:
    """Before any run: the report parent is a directory we can write in (or can be created)."""
    parent = Path(parent)
    if parent.exists() and not parent.is_dir():
        raise InputError(f"{flag} {parent}: exists and is not a directory")
    probe = next((p for p in [parent, *parent.resolve().parents] if p.exists()), None)
    if probe is None or not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {parent}: cannot write a report there (no write permission)")


def link_latest(parent: Path, report_dir: Path) -> None:
    """``PARENT/latest`` points at the newest report (a relative symlink, replaced atomically)."""
    link = Path(parent) / "latest"
    tmp = Path(parent) / f".latest-{os.getpid()}"
    try:
        if tmp.is_symlink():
            tmp.unlink()
        os.symlink(report_dir.name, tmp)
        os.replace(tmp, link)
    except OSError:  # a file system without symlinks: the printed path is enough
        if tmp.is_symlink():
            tmp.unlink()


def write_report(result: dict[str, Any], out_dir: Path, control_plane: dict[str, float] | None = None, *,
                 replace: bool = False) -> Path:
    """Write the whole report into ``out_dir`` atomically (a temp dir renamed at the end).

    An existing report there is replaced only with ``replace=True``; a directory that is not a
    report is never touched.
    """
    out_dir = Path(out_dir).resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"report directory {out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not (out_dir / "report.json").exists():
            raise InputError(f"report directory {out_dir}: not empty and not an llmpack report; choose another")
        if not replace:
            raise InputError(f"report directory {out_dir}: holds a report already; choose another")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        runs = result["runs"]
        be = break_even(runs, control_plane) if control_plane else None
        steps = gpu_steps()
        splits = {r["pipeline_run"]: cost_split(r, steps) for r in runs}
        facts = report_facts(result)
        sentence = summary_sentence(result, be)
        charts = {"timeline": tmp / "timeline.png", "spinup_boxplot": tmp / "spinup_boxplot.png", "cost_per_run": tmp / "cost_per_run.png"}
        chart_timeline(runs, charts["timeline"])
        chart_boxes(runs, charts["spinup_boxplot"])
        chart_cost(runs, charts["cost_per_run"], splits)
        full = {**result, "summary_sentence": sentence, "facts": facts, "cost_split": splits, "break_even": be}
        (tmp / "report.json").write_text(json.dumps(full, indent=2, sort_keys=True, default=str) + "\n")
        (tmp / "report.md").write_text(markdown(result, facts, sentence, be, splits))
        (tmp / "report.html").write_text(html_page(result, facts, sentence, be, charts, splits))
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
