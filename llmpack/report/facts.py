"""The report as facts: what is computed from run records, before anything is drawn or written.

Run records come from ``llmpack run --json`` summaries or are rebuilt from MLflow alone
(:func:`runs_from_mlflow`); from them: retried attempts, each run's compute/overhead cost split,
the break-even between orchestrators at given control-plane costs, the price facts every cost
rests on, and the plain-language summary sentence. No matplotlib, no files written here.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from components import yamltext
from components.errors import InputError
from components.fusion import path_of
from components.names import filter_literal
from components.record.telemetry import ALL_EVENTS, group_by_step

# --------------------------------------------------------------------------- loading


def runs_from_mlflow(mc: Any, run_group: str) -> list[dict[str, Any]]:
    """Rebuild the run records of a run group from MLflow alone."""
    from components.record import tracking
    from llmpack.report import own_metrics

    found = mc.search_runs(
        [tracking.experiment_id(mc)],
        filter_string=(f"tags.`llmpack.run_group` = {filter_literal(run_group)} "
                       f"and tags.`{tracking.RECORD_TAG}` = 'pipeline'"),
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
                "submitted_at": _epoch(r.data.params.get("submitted_at"), r.info.start_time / 1000),
                "metrics": metrics,
                "tags": tags,
                "events": events,
                "step_metrics": own_metrics.from_mlflow_metrics(r.data.metrics),
                "retried_attempts": retried,
                "artifacts": {"mlflow_run_id": r.info.run_id},
            }
        )
    if not runs:
        raise InputError(f"run group {run_group!r}: no llmpack runs in MLflow at "
                         f"{tracking.redact_uri(str(mc.tracking_uri))}")
    return runs


def _epoch(text: Any, default: float) -> float:
    """A ``submitted_at`` param as epoch seconds; NaN when it is not a number (the run is then excluded,
    with its reason, by :mod:`llmpack.report.screen`, never a traceback)."""
    if text is None:
        return default
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def _attempts_from_metrics(metrics: dict[str, float],
                           tags: dict[str, str]) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """From a pipeline record's ``event.*`` / ``metric.*`` values: each step's events (its last
    attempt's) and the retried attempts, priced at the record's price tag (a GPU step's GPUs from
    the pipeline spec)."""
    from components.record import close as record
    from components.record import cost, tracking
    from components.record.telemetry import RunContext

    ctx = RunContext(run_group=tags.get("llmpack.run_group", ""), pipeline_run=tags.get("llmpack.pipeline_run", ""),
                     orchestrator=tags.get("llmpack.orchestrator", ""), mode=tags.get("llmpack.mode", ""),
                     submitted_at=0.0)
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


def retry_note(runs: list[dict[str, Any]]) -> str:
    """The note over the retried attempts: billed when one of them held a GPU, else time only (trial 7)."""
    if any(a.get("gpu_hours") for r in runs for a in retried_attempts(r)):
        return "Every attempt is billed: these are in the runs' cost, GPU-hours and goodput."
    return "These attempts held no GPU: they are in the runs' times, not in any bill."


def retry_lines(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Per run with retries, ``(path, text)``: each retried attempt, its seconds and what its GPUs cost (every
    attempt is billed: in the run's ``gpu_hours``, ``cost_usd`` and goodput; this says how much were retries)."""
    from llmpack.compare.comparison import quantity
    from llmpack.ui.numbers import figure

    out = []
    for r in runs:
        retried = retried_attempts(r)
        if not retried:
            continue
        parts = []
        for a in retried:
            held = quantity(a.get("billed_s"), "s") if a.get("billed_s") is not None else "no finish recorded"
            what = f", {figure(a['gpu_hours'])} GPU-h" if a.get("gpu_hours") else ""
            priced = f", {quantity(a['cost_usd'], '$')}" if a.get("cost_usd") else ""
            verb = "was preempted" if a.get("outcome") == "preempted" else "failed"  # llmpack.cluster.k8s.preemption
            n = int(a["attempt"])  # as the JSON and the .attempt<N> keys count them (trial 9: the text said N + 1)
            which = f"{a['step']} first attempt" if n == 0 else f"{a['step']} retry {n}"
            parts.append(f"{which} {verb} after {held}{what}{priced}")
        total = r["metrics"].get("retry_cost_usd")
        share = ""
        if total is not None and r["metrics"].get("cost_usd"):
            share = f" ({quantity(total, '$')} of {quantity(r['metrics']['cost_usd'], '$')} billed, in the cost)"
        out.append((path_of(r), f"{r['pipeline_run']} [{r['status']}]: {len(retried)} retried attempt"
                                f"{'s' if len(retried) != 1 else ''}: " + "; ".join(parts) + share))
    return out


def checkpoint_lines(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Per run whose finetune checkpointed, ``(path, text)``: its longest checkpoint write against the grace period.

    A write longer than the grace period is cut short by SIGKILL: that run resumes from the checkpoint
    before (``--checkpoint-minutes`` bounds what is lost); docs/preemption.md.
    """
    from llmpack.compare.comparison import quantity

    out = []
    for r in runs:
        save, grace = r["metrics"].get("checkpoint_save_s"), r["metrics"].get("grace_period_s")
        if save is None:
            continue
        if grace is None:
            verdict = "no grace period compiled in (Kubernetes' default: 30 s)"
        elif save <= grace:
            verdict = f"fits the {grace:.0f} s grace period"  # whole seconds, as compiled
        else:
            verdict = (f"does NOT fit the {grace:.0f} s grace period: a preempted pod loses the steps since "
                       "its last checkpoint (raise --grace-period, or bound them with --checkpoint-minutes)")
        out.append((path_of(r), f"{r['pipeline_run']}: longest checkpoint write {quantity(save, 's')}, {verdict}"))
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
    (:mod:`llmpack.compare.stats`); otherwise the sentence says which pair does not, and why no
    break-even is claimed. Every sentence ends saying what ``u_o`` is made of (the cost basis
    the runs were billed on: GPU nodes on a cluster, containers locally), since that is where
    the volume at which the cheapest path flips comes from.
    """
    from llmpack.compare import stats
    from llmpack.compare.comparison import quantity

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
        basis = (" Cost per training GPU-hour is each run's cost_usd / (train_s × GPUs): "
                 "GPU nodes billed as clouds bill "
                 "them, from node Ready (or the first pod's scheduling on a node already up) to the node's removal, or "
                 "to the last pod's finish + the autoscaler's scale-down delay "
                 f"({', '.join(delays)} s) when the removal "
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
        ci = "" if d.ci_low is None else (f", 95% CI {quantity(d.ci_low, '$', signed=True)} "
                                          f"to {quantity(d.ci_high, '$', signed=True)}")
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
        parts = [f"{s['cheapest']} is cheapest up to {s['to_gpu_hours']:,.0f} training GPU-hours/month"
                 for s in segments[:-1]]
        sentence = "; ".join(parts) + f", then {segments[-1]['cheapest']} (inputs: {inputs})."
    return {**base, "segments": segments, "significant": True, "sentence": sentence + basis}


def gpu_steps() -> dict[str, int]:
    """The pipeline's GPU steps and their GPU counts (from the one pipeline object)."""
    from components.finetune_pipeline import build

    return {t.name: t.step.execution.resources.gpus for t in build().task_order()
            if t.step.execution.resources.gpus > 0}


def cost_split(run: dict[str, Any], steps: dict[str, int]) -> dict[str, float] | None:
    """``{compute_usd, overhead_usd}`` of one run: what the GPU cost while it trained or evaluated, and while
    it did not.

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
    from components.record.cost import price_tag  # n/a without a GPU step, unknown for a GPU step unpriced

    return {
        "mode": mode,
        "gpu_type": str(tags.get("llmpack.gpu_type", "unknown")),
        "gpu_count": str(tags.get("llmpack.gpu_count", "?")),
        "price_per_gpu_hour": price_tag(tags, "llmpack.price_per_gpu_hour"),
        "price_source": price_tag(tags, "llmpack.price_source"),
        "cost_note": ("local run: cost is a projection (these step durations priced as if on the GPU type above; "
                      "no GPU was billed)") if mode == "local" else "cluster run: billed GPU time at the price above",
    }


def summary_sentence(result: dict[str, Any], be: dict[str, Any] | None) -> str:
    """The plain-language answer on top of the report: every decided verdict with its CI, then what is undecided."""
    from llmpack.compare.comparison import HEADLINES
    from llmpack.compare.recommend import verdict_word

    baseline = result.get("baseline")
    verdicts = result.get("verdicts", {})
    on_cluster = result.get("mode") == "cluster" or any(r.get("mode") == "cluster" for r in result["runs"])
    where = "On this cluster" if on_cluster else "On this machine"
    if not [r for r in result["runs"] if r["status"] == "succeeded"]:
        return "No run succeeded; nothing to compare."
    if baseline is None:
        return (f"{where}: no baseline, so no path is named faster or cheaper (name one with --baseline PATH); "
                "the medians are below.")
    if len(result.get("backends") or []) < 2:  # a run group of one path (an `llmpack run`'s): nothing beside it
        return f"{where}: only {baseline} ran in this run group; nothing to compare it with (its medians are below)."
    parts: list[str] = []
    undecided: list[str] = []
    unjudged: list[str] = []
    for h in HEADLINES:  # every decided verdict (a difference or an equivalence), with its CI
        per_path = verdicts.get(h.metric, {})
        parts += [e["text"] for o, e in per_path.items()
                  if o != baseline and e["verdict"] in (h.lower, h.higher, "equivalent")]
        words = {o: verdict_word(e) for o, e in per_path.items() if o != baseline}
        rest = [o for o, w in words.items() if w == "undecided"]
        if any(w == "not judged" for w in words.values()):
            unjudged.append(h.label)  # one run per path (a compare until decided runs the whole pipeline once)
        if rest:
            undecided.append(f"{h.label} for {', '.join(rest)}")
    if undecided:
        parts.append("Undecided (more rounds would decide): " + "; ".join(undecided))
    if unjudged:
        parts.append(f"{' and '.join(unjudged).capitalize()} from one whole run per path, not judged "
                     "(--repeats 5 judges them)")
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
            text = yamltext.read_bytes(Path(path), path).decode("utf-8")
        except OSError as exc:
            raise InputError(f"{path}: cannot read control-plane costs "
                             f"({exc.strerror or type(exc).__name__})") from None
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text; expected control-plane costs like 'kfp: 450'") from None
        data = yamltext.safe_load(text, path)
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a mapping like 'kfp: 450'")
        for key, value in data.items():
            short = str(key).isprintable() and len(str(key)) <= yamltext.EXCERPT_CHARS
            shown = str(key) if short else yamltext.excerpt(key)  # a newline or a huge key must not reach the line
            out[_orchestrator(str(key), f"{path}: {shown}")] = _usd(value, f"{path}: {shown}")
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--control-plane-cost {item!r}: expected ORCHESTRATOR=USD_PER_MONTH, e.g. kfp=450")
        flag = f"--control-plane-cost {item}"
        out[_orchestrator(key.strip(), flag)] = _usd(value.strip(), flag)
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
    raise InputError(f"{where}: unknown orchestrator {yamltext.excerpt(name)} "
                     f"(choose from {', '.join(ORCHESTRATORS)}){hint}")


def _usd(value: Any, where: str) -> float:
    if isinstance(value, bool):  # YAML's yes/true would otherwise be 1 USD
        raise InputError(f"{where}: {yamltext.excerpt(value)} is not a number of USD per month")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {yamltext.excerpt(value)} is not a number of USD per month") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise InputError(f"{where}: {yamltext.excerpt(value)} is not a number of USD per month")
    if v < 0:
        raise InputError(f"{where}: must be >= 0 USD per month")
    return v


# --------------------------------------------------------------------------- charts
