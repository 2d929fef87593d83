"""``llmpack compare``: the same pipeline through several paths, sequentially, then statistics.

Sequential on purpose: on a small machine, paths running at once would measure each other.
One failed path does not lose the others' results: it is listed as failed with its error.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from components import settings
from components.errors import InputError
from components.fusion import path_of
from components.servers.submission import new_id
from llmpack import compare_plan, stats
from llmpack.backends import BACKENDS
from llmpack.compare_plan import ComparePlan, PlannedRun, run_all
from llmpack.compare_plan import check_repeats as check_repeats  # the CLI checks flags through llmpack.compare
from llmpack.compare_plan import check_warmup as check_warmup
from llmpack.runs import RunOptions, prepare

DEFAULT_BACKENDS = tuple(BACKENDS)
# A TrainJob gang's (--nodes N on a cluster): when its last node pod started, and Kueue's waits
# for it (--queue). Elsewhere not measured: n = 0 in the summary. Metric: what it measures.
GANG_LABELS = {
    "gang_ready_s": "gang ready (last TrainJob node pod started, from submit)",
    "quota_wait_s": "Kueue quota wait (Workload created -> QuotaReserved)",
    "admission_checks_s": "Kueue admission checks (QuotaReserved -> Admitted)",
}
GANG_METRICS = tuple(GANG_LABELS)
SUMMARY_METRICS = (
    "spinup_s",
    "time_to_first_step_s",
    "total_s",
    "pipeline_overhead_s",
    "train_s",
    "tokens_per_s",
    "eval_loss",
    "cost_usd",
    "usd_per_1m_tokens",
    "goodput",
    "gpu_hours",
    *GANG_METRICS,
)
PERCENTILE_METHOD = "linear interpolation between closest ranks (numpy 'linear', Hyndman-Fan type 7)"
MIN_N_FOR_P99 = 10


# ``--variants``: how the steps are packaged (components.fusion), compared side by side per path.
VARIANTS = {"default": "none", "fuse-gpu": "gpu", "fuse-all": "all"}


def parse_variants(text: str | None) -> list[str]:
    """``default,fuse-gpu,fuse-all`` -> the fusion modes, in order (None: the default packaging only)."""
    if text is None:
        return []
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise InputError(f"--variants: give at least one of {', '.join(VARIANTS)}")
    for name in names:
        if name not in VARIANTS:
            hint = f"; did you mean {name.lower()!r}?" if name.lower() in VARIANTS else ""
            raise InputError(f"--variants: unknown variant {name!r} (choose from {', '.join(VARIANTS)}){hint}")
    return [VARIANTS[n] for n in dict.fromkeys(names)]


def parse_backends(text: str) -> list[str]:
    """``--backends`` of a local compare: any of :data:`~llmpack.backends.BACKENDS`."""
    return compare_plan.parse_backends(text, BACKENDS, "unknown backend {name!r}")


def percentile(values: list[float], q: float) -> float:
    """Type-7 percentile (what numpy.percentile does by default)."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{orchestrator: {metric: {p50, p90, p99, n}}}`` over the succeeded runs.

    p99 is ``None`` below ten runs (it would be the maximum wearing a costume), with
    ``p99_note`` saying so.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for orch in dict.fromkeys(path_of(r) for r in runs):
        ok = [r for r in runs if path_of(r) == orch and r["status"] == "succeeded"]
        per_metric: dict[str, dict[str, Any]] = {}
        for metric in SUMMARY_METRICS:
            values = [r["metrics"][metric] for r in ok if r["metrics"].get(metric) is not None]
            n = len(values)
            entry: dict[str, Any] = {
                "n": n,
                "p50": percentile(values, 50) if n else None,
                "p90": percentile(values, 90) if n else None,
                "p99": percentile(values, 99) if n >= MIN_N_FOR_P99 else None,
            }
            if n < MIN_N_FOR_P99:
                entry["p99_note"] = f"n={n} < {MIN_N_FOR_P99}: p99 not estimated"
            per_metric[metric] = entry
        out[orch] = per_metric
    return out


@dataclass(frozen=True, kw_only=True)
class Headline:
    """A headline measure: lower is better for every one of them."""

    metric: str
    label: str
    unit: Literal["s", "$"]
    lower: str  # the path's word when its median is significantly below the baseline's
    higher: str


HEADLINES = (
    Headline(metric="time_to_first_step_s", label="time to first step", unit="s", lower="faster", higher="slower"),
    Headline(metric="spinup_s", label="spin-up", unit="s", lower="faster", higher="slower"),
    Headline(metric="total_s", label="total", unit="s", lower="faster", higher="slower"),
    Headline(metric="cost_usd", label="cost per run", unit="$", lower="cheaper", higher="costlier"),
)


def quantity(value: float | None, unit: str, *, signed: bool = False) -> str:
    """The one number format of the terminal, the JSON texts and the report: ``12.3 s``, ``$0.00412``."""
    if value is None:
        return "-"
    sign = "+" if signed and value > 0 else "-" if value < 0 else ""
    v = abs(value)
    if unit == "$":
        return f"{sign}${v:.3g}" if v < 1 else f"{sign}${v:,.2f}"
    return f"{sign}{v:.2f} {unit}" if v < 100 else f"{sign}{v:,.0f} {unit}"


def default_baseline(backends: list[str]) -> str | None:
    """``direct`` when it is compared (locally); otherwise no baseline unless the user names one.

    Comparing variants of one backend only (``--backends argo --variants ...``), its default
    packaging is the baseline.
    """
    if "direct" in backends:
        return "direct"
    bases = {b.split("+", 1)[0] for b in backends}
    if len(bases) == 1 and len(backends) > 1 and next(iter(bases)) in backends:
        return next(iter(bases))
    return None


def check_baseline(baseline: str | None, backends: list[str]) -> None:
    if baseline is not None and baseline not in backends:
        raise InputError(f"--baseline {baseline!r}: not among the compared paths ({', '.join(backends)})")


def _values(runs: list[dict[str, Any]], orch: str, metric: str) -> list[float]:
    return [float(r["metrics"][metric]) for r in runs if path_of(r) == orch and r["status"] == "succeeded"
            and r["metrics"].get(metric) is not None]


def verdicts(runs: list[dict[str, Any]], backends: list[str], baseline: str | None) -> dict[str, dict[str, dict[str, Any]]]:
    """``{metric: {path: {value, n, delta, ci95, n_baseline, verdict, text}}}`` for the headline measures.

    A path is named faster/slower or cheaper/costlier than the baseline only when the bootstrap CI
    of the difference in medians excludes 0 (:mod:`llmpack.stats`); otherwise the verdict says
    "no clear difference" or "too few runs", with n.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for h in HEADLINES:
        per_path: dict[str, dict[str, Any]] = {}
        base = _values(runs, baseline, h.metric) if baseline else []
        for orch in backends:
            values = _values(runs, orch, h.metric)
            entry: dict[str, Any] = {"value": statistics.median(values) if values else None, "n": len(values),
                                     "baseline": baseline, "delta": None, "ci95": None, "n_baseline": len(base)}
            if baseline is None:
                entry["verdict"], entry["text"] = "no baseline", f"{orch}: {h.label} {quantity(entry['value'], h.unit)} (n={len(values)})"
            elif orch == baseline:
                entry["verdict"], entry["text"] = "baseline", f"{orch} is the baseline: {h.label} {quantity(entry['value'], h.unit)} (n={len(values)})"
            elif not values or not base:
                entry["verdict"], entry["text"] = "too few runs", f"{orch} vs {baseline}: no succeeded runs to compare {h.label}"
            else:
                d = stats.bootstrap_median_diff(values, base)
                word = {"lower": h.lower, "higher": h.higher}.get(d.verdict, d.verdict)
                entry.update(delta=d.delta, ci95=None if d.ci_low is None else [d.ci_low, d.ci_high], verdict=word)
                entry["text"] = _verdict_text(h, orch, baseline, d, word)
            per_path[orch] = entry
        out[h.metric] = per_path
    return out


def _verdict_text(h: Headline, orch: str, baseline: str, d: stats.Difference, word: str) -> str:
    n = f"n={d.n} vs {d.n_baseline}"
    ci = "" if d.ci_low is None else (f"95% CI {quantity(d.ci_low, h.unit, signed=True)} to "
                                      f"{quantity(d.ci_high, h.unit, signed=True)}")
    if word == "too few runs":
        return (f"{orch} vs {baseline}: too few runs for a verdict on {h.label} ({n}; need {stats.MIN_N} each, "
                f"--repeats {stats.MIN_N}); Δ {quantity(d.delta, h.unit, signed=True)}")
    if word == "no clear difference":
        return f"{orch} vs {baseline}: no clear difference in {h.label} ({n}; Δ {quantity(d.delta, h.unit, signed=True)}, {ci})"
    return f"{orch} is {word} than {baseline} on {h.label} by {quantity(abs(d.delta), h.unit)} ({ci}; {n})"


def comparison(run_group: str, backends: list[str], runs: list[dict[str, Any]], *, baseline: Any = "default",
               **extra: Any) -> dict[str, Any]:
    """The result of a comparison: its runs, the failed ones with their errors, the statistics and verdicts."""
    base = default_baseline(backends) if baseline == "default" else baseline
    check_baseline(base, backends)
    return {
        "run_group": run_group,
        "backends": backends,
        **extra,
        "percentile_method": PERCENTILE_METHOD,
        "runs": runs,
        "failed": [
            {"pipeline_run": r["pipeline_run"], "orchestrator": path_of(r), "error": r["error"]}
            for r in runs
            if r["status"] != "succeeded"
        ],
        "summary": summarize_runs(runs),
        "baseline": base,
        "verdict_method": stats.METHOD,
        "verdicts": verdicts(runs, backends, base),
    }


def with_baseline(result: dict[str, Any], baseline: str | None) -> dict[str, Any]:
    """The same comparison judged against another baseline (``--baseline`` on a cluster)."""
    check_baseline(baseline, result["backends"])
    return {**result, "baseline": baseline, "verdicts": verdicts(result["runs"], result["backends"], baseline)}


def compare(
    opts: RunOptions,
    backends: list[str],
    repeats: int,
    *,
    run_one: Any = None,
    baseline: Any = "default",
    on_start: Any = None,
    variants: list[str] | None = None,
    warmup: int | None = None,
) -> dict[str, Any]:
    """Run every path ``repeats`` times (interleaved: a, b, c, a, b, c...) in one run group.

    A path is a backend, or with ``variants`` (fusion modes) each backend in each packaging
    (``direct``, ``direct+fuse-gpu``...). ``on_start(run_group)`` is called once every input is
    checked, before the first run.

    ``warmup`` runs of every path come first and are not counted (default: 1 when ``repeats`` > 1,
    as hyperfine does): the first run on a machine loads torch and transformers from a cold page
    cache. Measured on a quiet 2-core machine: the first run's finetune took 9.3 s from process
    start to a loaded model, the next four 6.0-6.3 s, enough to hide a planted 3 s difference in
    a 5-run bootstrap. Warm-up runs go to their own run group (``<run group>-warmup``), so
    ``llmpack report --run-group`` never mixes them in.
    """
    plan = ComparePlan(backends=tuple(backends), variants=tuple(variants or [opts.fuse]), repeats=repeats,
                       warmup=default_warmup(repeats) if warmup is None else warmup)
    labels = plan.labels
    check_baseline(default_baseline(labels) if baseline == "default" else baseline, labels)
    for backend, fuse in plan.paths:
        prepare(replace(opts, backend=backend, fuse=fuse))  # all input checks before the first run starts
    run_group = opts.run_group or new_id("rg")
    if on_start is not None:
        on_start(run_group)
    run = run_one
    if run is None:
        from llmpack.runs import run_pipeline as run

    def in_group(group: str) -> Callable[[PlannedRun], dict[str, Any]]:
        return lambda r: run(replace(opts, backend=r.backend, fuse=r.fuse, run_group=group), r.label)

    run_all(plan.runs(warmup=True), in_group(f"{run_group[:56]}-warmup"))
    runs = run_all(plan.runs(), in_group(run_group))
    return comparison(run_group, labels, runs, baseline=baseline, repeats=repeats, warmup=plan.warmup)


def default_warmup(repeats: int) -> int:
    """Warm-up runs per path when not given: one when the runs are repeated (for verdicts), else none."""
    return 1 if repeats > 1 else 0


def parse_start_delays(text: str | None, backends: list[str]) -> dict[str, float]:
    """``--inject-start-delay``: ``2`` (every path) or ``argo=3[,kfp=1]`` (those paths) -> {path: seconds}."""
    if text is None or not text.strip():
        return {}
    out: dict[str, float] = {}
    items = [i.strip() for i in text.split(",") if i.strip()]
    for item in items:
        name, sep, value = item.rpartition("=")
        if sep and name not in backends:
            raise InputError(f"--inject-start-delay {item!r}: {name!r} is not among the compared paths ({', '.join(backends)})")
        try:
            seconds = float(value)
        except ValueError:
            raise InputError(f"--inject-start-delay {item!r}: expected SECONDS or PATH=SECONDS, e.g. argo=3") from None
        if not 0 <= seconds < 3600:
            raise InputError(f"--inject-start-delay {item!r}: seconds must be >= 0 and < 3600")
        if not sep and len(items) > 1:
            raise InputError(f"--inject-start-delay {text!r}: give either SECONDS for every path or PATH=SECONDS items")
        for path in ([name] if sep else backends):
            out[path] = seconds
    return {p: s for p, s in out.items() if s > 0}


def start_delay_env(delays: dict[str, float], backend: str) -> dict[str, str] | None:
    """The step environment that delays ``backend``'s finetune process start (None: no injection)."""


    return {settings.INJECT_START_DELAY.name: f"finetune={delays[backend]}"} if backend in delays else None


def gang_rows(result: dict[str, Any]) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """The gang and Kueue metrics some path measured: (label, {path: its summary entry, n > 0})."""
    rows = []
    for name, label in GANG_LABELS.items():
        per_path = {path: m[name] for path, m in result["summary"].items() if (m.get(name) or {}).get("n")}
        if per_path:
            rows.append((label, per_path))
    return rows
