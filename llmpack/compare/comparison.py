"""``llmpack compare``: the same pipeline through several paths, sequentially, then statistics.

Sequential on purpose: on a small machine, paths running at once would measure each other.
One failed path does not lose the others' results: it is listed as failed with its error.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any, Literal

from components.errors import InputError
from components.fusion import path_of
from llmpack.backends import BACKENDS
from llmpack.compare import plan as compare_plan
from llmpack.compare import sequential
from llmpack.compare.plan import (
    check_repeats as check_repeats,  # the CLI checks flags through llmpack.compare.comparison
)
from llmpack.compare.plan import check_warmup as check_warmup
from llmpack.ui.numbers import money

DEFAULT_BACKENDS = tuple(BACKENDS)
# A TrainJob gang's (--nodes N on a cluster): when its last node pod started, and Kueue's waits
# for it (--queue). Elsewhere not measured: n = 0 in the summary. Metric: what it measures.
GANG_LABELS = {
    "gang_ready_s": "gang ready (last TrainJob node pod started, from submit)",
    "quota_wait_s": "Kueue quota wait (Workload created -> QuotaReserved)",
    "admission_checks_s": "Kueue admission checks (QuotaReserved -> Admitted)",
}
GANG_METRICS = tuple(GANG_LABELS)
SUMMARY_METRICS = ("spinup_s", "time_to_first_step_s", "total_s", "pipeline_overhead_s", "train_s", "tokens_per_s",
                   "eval_loss", "cost_usd", "usd_per_1m_tokens", "goodput", "gpu_hours", *GANG_METRICS)
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
    """``{orchestrator: {metric: {p50, p90, p99, n}}}`` over the succeeded runs (start-up rounds' runs
    count for :data:`STARTUP_METRICS` only).

    p99 is ``None`` below ten runs (it would be the maximum wearing a costume), with
    ``p99_note`` saying so.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for orch in dict.fromkeys(path_of(r) for r in runs):
        ok = [r for r in runs if path_of(r) == orch and r["status"] == "succeeded"]
        per_metric: dict[str, dict[str, Any]] = {}
        for metric in SUMMARY_METRICS:  # a start-up round's run measures only the start-up metrics
            values = [r["metrics"][metric] for r in ok if r["metrics"].get(metric) is not None
                      and (metric in STARTUP_METRICS or not is_startup_run(r))]
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


def runs_counted(stats: dict[str, dict[str, Any]], metrics: list[str] | tuple[str, ...]) -> int:
    """The ``n`` of a path's table row (``stats``: its :func:`summarize_runs` entry): the most runs behind any of
    its figures ``metrics``, start-up rounds included (they count for spin-up and time to first step), so six
    rounds read n=6, not the one whole run behind total."""
    return max((int((stats.get(m) or {}).get("n") or 0) for m in metrics), default=0)


@dataclass(frozen=True, kw_only=True)
class Headline:
    """A headline measure: lower is better for every one of them."""

    metric: str
    label: str
    unit: Literal["s", "$"]
    lower: str  # the path's word when its difference from the baseline is decidedly below 0
    higher: str
    key: str  # its name in --margin
    startup: bool = False  # measured before finetune's first step: a start-up round measures it too


HEADLINES = (
    Headline(metric="time_to_first_step_s", label="time to first step", unit="s", lower="faster", higher="slower",
             key="ttfs", startup=True),
    Headline(metric="spinup_s", label="spin-up", unit="s", lower="faster", higher="slower", key="spinup", startup=True),
    Headline(metric="total_s", label="total", unit="s", lower="faster", higher="slower", key="total"),
    Headline(metric="cost_usd", label="cost per run", unit="$", lower="cheaper", higher="costlier", key="cost"),
)
# What a start-up round (the pipeline through finetune's first step) measures as a full run would.
STARTUP_METRICS = frozenset(h.metric for h in HEADLINES if h.startup)
# The verdict of a headline no run measured (time to first step of a pipeline without finetune): never judged.
NOT_MEASURED = "not measured"


def untrained(runs: list[dict[str, Any]]) -> bool:
    """Runs of a pipeline without finetune: they measured their total, and none a first training step. A
    compare of such a pipeline ran it whole every round (a report rebuilt from MLflow sees the same)."""
    metrics = [r.get("metrics") or {} for r in runs]
    return (any(m.get("total_s") is not None for m in metrics)
            and not any(m.get("time_to_first_step_s") is not None for m in metrics))


def measured(per_path: dict[str, dict[str, Any]]) -> bool:
    """Did any run measure this headline (its verdicts by path, as :func:`verdicts` gives them)?"""
    return any(e.get("verdict") != NOT_MEASURED for e in per_path.values())


def quantity(value: float | None, unit: str, *, signed: bool = False) -> str:
    """The one number format of the terminal, the JSON texts and the report: ``12.3 s``, ``$0.00412``."""
    if value is None:
        return "-"
    sign = "+" if signed and value > 0 else "-" if value < 0 else ""
    v = abs(value)
    if unit == "$":
        return money(value, signed=signed)
    return f"{sign}{v:.2f} {unit}" if v < 100 else f"{sign}{v:,.0f} {unit}"


def confidence_text(confidence: float) -> str:
    """``95%``, ``99.9%``, ``99.996%``: enough digits that a level below 1 never reads ``100%``."""
    for digits in range(3, 8):
        text = f"{confidence * 100:.{digits}g}"
        if float(text) < 100:
            return f"{text}%"
    return f"{confidence * 100:.7g}%"


# ``--margin``: how close two paths must be to be called practically equivalent.
MARGIN_FLOOR_S = 0.5


@dataclass(frozen=True, kw_only=True)
class Margin:
    """``value`` seconds or dollars, or (``relative``) that fraction of the baseline's median, at least ``floor``."""

    value: float
    relative: bool = False
    floor: float = 0.0

    def of(self, baseline_median: float | None) -> float:
        amount = self.value * abs(baseline_median or 0.0) if self.relative else self.value
        return max(amount, self.floor)

    def describe(self, unit: str) -> str:
        if not self.relative:
            return quantity(self.value, unit)
        floor = f", at least {quantity(self.floor, unit)}" if self.floor else ""
        return f"{self.value:.0%} of the baseline's median{floor}"


# A quarter of the baseline's median (times: at least half a second). Chosen as the smallest
# difference that would change which orchestrator a platform team picks for start-up, not from
# the noise; docs/internals/decisions.md says why, and what a narrower margin costs in rounds.
DEFAULT_MARGINS = {h.key: Margin(value=0.25, relative=True, floor=MARGIN_FLOOR_S if h.unit == "s" else 0.0)
                   for h in HEADLINES}


def parse_margins(text: str | None) -> dict[str, Margin]:
    """``--margin``: ``25%`` (every headline; times at least 0.5 s, as the default), ``1s`` (the time headlines),
    ``$0.001`` (cost), or ``spinup=0.5s,ttfs=10%,total=2s,cost=10%``; the headlines not named keep
    :data:`DEFAULT_MARGINS`."""
    out = dict(DEFAULT_MARGINS)
    if text is None or not text.strip():
        return out
    keys = {h.key: h for h in HEADLINES}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, spec = item.rpartition("=")
        if sep and name not in keys:
            raise InputError(f"--margin {item!r}: {name!r} is not a headline (choose from {', '.join(keys)})")
        margin, unit = _parse_margin(spec.strip(), item)
        for h in ([keys[name]] if sep else HEADLINES):
            if unit is not None and unit != h.unit:
                if sep:
                    raise InputError(f"--margin {item!r}: {h.key} is in {'dollars' if h.unit == '$' else 'seconds'}")
                continue
            # a percentage keeps the default's floor (times: 0.5 s): `--margin 50%`, which `to decide:` suggests as the
            # wider margin, narrowed a 0.64 s spin-up's to 0.32 s (trial 8)
            out[h.key] = replace(margin, floor=DEFAULT_MARGINS[h.key].floor) if margin.relative else margin
    return out


def _parse_margin(spec: str, item: str) -> tuple[Margin, str | None]:
    """``25%`` -> relative; ``1.5s`` / ``1.5`` -> seconds; ``$0.01`` -> dollars (the unit, None for a percentage)."""
    relative, unit, number = spec.endswith("%"), None, spec
    if relative:
        number = spec[:-1]
    elif spec.startswith("$"):
        unit, number = "$", spec[1:]
    else:
        unit, number = "s", spec.removesuffix("s")
    try:
        value = float(number)
    except ValueError:
        raise InputError(f"--margin {item!r}: expected a percentage (25%), seconds (1s) or dollars ($0.01)") from None
    if not (value > 0 and math.isfinite(value)) or (relative and value >= 100):
        raise InputError(f"--margin {item!r}: must be above 0{' and below 100%' if relative else ''}")
    return Margin(value=value / 100 if relative else value, relative=relative), None if relative else unit


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


def is_startup_run(run: dict[str, Any]) -> bool:
    """A start-up round's run (the pipeline through finetune's first step): it measures only :data:`STARTUP_METRICS`."""
    return bool(run.get("startup")) or run.get("tags", {}).get(STARTUP_TAG) == "startup"


STARTUP_TAG = "llmpack.round_kind"
# a start-up run's design (its last round): a report rebuilt from MLflow judges alike
DESIGN_TAG = "llmpack.design_rounds"
# a start-up run's record of what warm-up and round 1 took: the compare and a rebuilt report plan alike
BEFORE_ROUNDS_TAG = "llmpack.before_rounds_s"
BUDGET_TAG, MAX_STEPS_TAG = "llmpack.budget_s", "llmpack.max_steps"  # and its budget and --max-steps


def design_of(runs: list[dict[str, Any]]) -> sequential.Design | None:
    """The sequential design the runs were judged under, from their tags (None: fixed rounds)."""
    rounds = {r.get("tags", {}).get(DESIGN_TAG) for r in runs} - {None}
    return sequential.Design(max_rounds=max(int(x) for x in rounds)) if rounds else None


def by_round(runs: list[dict[str, Any]], orch: str, metric: str) -> dict[int, float]:
    """``{round: value}`` of ``orch``'s succeeded runs that measure ``metric``.

    A run's round is its ``round`` (local compares record it), else its place among the path's
    runs (the interleaved order every compare keeps; MLflow gives them back by start time).
    """
    out: dict[int, float] = {}
    for k, r in enumerate((r for r in runs if path_of(r) == orch), start=1):
        if metric not in STARTUP_METRICS and is_startup_run(r):
            continue
        value = r["metrics"].get(metric) if r["status"] == "succeeded" else None
        if value is not None:
            out[int(r.get("round") or k)] = float(value)
    return out


def verdicts(runs: list[dict[str, Any]], backends: list[str], baseline: str | None, *,
             design: sequential.Design | None = None, margins: dict[str, Margin] | None = None,
             ) -> dict[str, dict[str, dict[str, Any]]]:
    """``{metric: {path: {value, n, delta, ci, confidence, margin, verdict, text...}}}`` for the headline measures.

    Each path is judged on its per-round differences from the baseline (:mod:`llmpack.compare.sequential`):
    ``faster``/``slower`` (``cheaper``/``costlier``) when the interval excludes 0, ``equivalent``
    when it lies inside the margin, else ``undecided``. ``design``: the sequential design a
    compare-until-decided ran its start-up headlines under; without it (``--repeats N``, and the
    headlines measured by full runs only) one look at the rounds there are; when every round ran the whole
    pipeline (one without finetune), every headline was looked at after each round, so each is judged under
    the design. A headline no run measured is ``not measured``, never undecided.
    """
    margins = {**DEFAULT_MARGINS, **(margins or {})}
    whole = design is not None and untrained(runs)  # every round ran the whole pipeline: all judged each round
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for h in HEADLINES:
        per_path: dict[str, dict[str, Any]] = {}
        base = by_round(runs, baseline, h.metric) if baseline else {}
        base_median = statistics.median(base.values()) if base else None
        any_run = any(by_round(runs, orch, h.metric) for orch in backends)
        for orch in backends:
            rounds = by_round(runs, orch, h.metric)
            value = statistics.median(rounds.values()) if rounds else None
            entry: dict[str, Any] = {"value": value, "n": len(rounds), "baseline": baseline, "delta": None, "ci": None,
                                     "confidence": None, "margin": None, "n_baseline": len(base)}
            if not any_run:  # no run has it (a pipeline without finetune has no first step): not a headline
                entry["verdict"], entry["text"] = NOT_MEASURED, f"{orch}: {h.label} not measured (no run has it)"
            elif baseline is None:
                entry["verdict"], entry["text"] = ("no baseline",
                                                   f"{orch}: {h.label} {quantity(value, h.unit)} (n={len(rounds)})")
            elif orch == baseline:
                entry["verdict"], entry["text"] = ("baseline", f"{orch} is the baseline: {h.label} "
                                                               f"{quantity(value, h.unit)} (n={len(rounds)})")
            else:
                paired = [rounds[k] - base[k] for k in sorted(rounds.keys() & base.keys())]
                seq = design is not None and (h.startup or whole)
                d = sequential.decide(paired, margin=margins[h.key].of(base_median),
                                      design=design if seq and design is not None
                                      else sequential.Design.fixed(len(paired)))
                word = {"higher": h.higher, "lower": h.lower}.get(d.verdict, d.verdict)
                entry.update(delta=d.delta, ci=None if d.ci_low is None else [d.ci_low, d.ci_high],
                             confidence=d.confidence, margin=d.margin, verdict=word, rounds=d.n,
                             rounds_to_decide=d.rounds_to_decide, text=_verdict_text(h, orch, baseline, d, word, seq))
            per_path[orch] = entry
        out[h.metric] = per_path
    return out


def _verdict_text(h: Headline, orch: str, baseline: str, d: sequential.Decision, word: str, seq: bool) -> str:
    def q(v: float | None) -> str:
        return quantity(v, h.unit, signed=True)

    rounds = f"{d.n} round{'' if d.n == 1 else 's'}"
    margin = f"±{quantity(d.margin, h.unit)}"
    ci = ("" if d.ci_low is None or d.confidence is None
          else f"{confidence_text(d.confidence)} CI {q(d.ci_low)} to {q(d.ci_high)}")
    if word in (h.lower, h.higher) and d.delta is not None:
        inside = f"; inside the {margin} margin" if d.within_margin else ""
        return (f"{orch} is {word} than {baseline} on {h.label} by {quantity(abs(d.delta), h.unit)} "
                f"({ci}; {rounds}{inside})")
    if word == "equivalent":
        return f"{orch} ≈ {baseline} on {h.label}: Δ {q(d.delta)} ({ci}), inside the {margin} margin ({rounds})"
    if d.delta is None:
        return f"{orch} vs {baseline} on {h.label}: undecided, no round where both succeeded"
    if d.n <= 1:  # one run each: no interval can exist, so no verdict was attempted (the report says the same)
        how = f"a verdict needs {d.rounds_to_decide} rounds" if seq else "--repeats 5 judges it"
        return f"{orch} vs {baseline} on {h.label}: not judged, Δ {q(d.delta)} from one run each ({how})"
    if d.ci_low is None:
        return (f"{orch} vs {baseline} on {h.label}: undecided, Δ {q(d.delta)} from {rounds} "
                f"(a verdict needs {d.rounds_to_decide} rounds)")
    more = (f"~{d.rounds_to_decide} rounds would likely decide it" if d.rounds_to_decide
            else "far more rounds, or a wider --margin, would decide it")
    return (f"{orch} vs {baseline} on {h.label}: undecided after {rounds}, Δ {q(d.delta)} ({ci}) neither clear of 0 "
            f"nor inside {margin}; {more}")


def comparison(run_group: str, backends: list[str], runs: list[dict[str, Any]], *, baseline: Any = "default",
               design: sequential.Design | None = None, margins: dict[str, Margin] | None = None,
               **extra: Any) -> dict[str, Any]:
    """The result of a comparison: its runs, the failed ones with their errors, the statistics and verdicts.

    ``design``: the sequential design of a compare-until-decided (its start-up headlines were
    judged after every round); ``margins``: ``--margin``.
    """
    from llmpack.report.screen import screen

    base = default_baseline(backends) if baseline == "default" else baseline
    check_baseline(base, backends)
    runs, excluded = screen(runs)  # impossible values (a future time, NaN, a negative duration): apart, not judged
    design = design or design_of(runs)
    return {
        "run_group": run_group,
        "backends": backends,
        **extra,
        **({"excluded": excluded} if excluded else {}),
        "percentile_method": PERCENTILE_METHOD,
        "runs": runs,
        "failed": [
            {"pipeline_run": r["pipeline_run"], "orchestrator": path_of(r), "error": r["error"]}
            for r in runs
            if r["status"] != "succeeded"
        ],
        "summary": summarize_runs(runs),
        "baseline": base,
        "verdict_method": sequential.METHOD,
        "design": None if design is None else {"max_rounds": design.max_rounds, "first_look": design.first_look,
                                               "alpha": design.alpha, "rho": design.rho},
        "margins": {h.key: {"margin": (margins or DEFAULT_MARGINS)[h.key].describe(h.unit)} for h in HEADLINES},
        "verdicts": verdicts(runs, backends, base, design=design, margins=margins),
    }


def with_baseline(result: dict[str, Any], baseline: str | None,
                  margins: dict[str, Margin] | None = None) -> dict[str, Any]:
    """The same comparison judged against another baseline (``--baseline`` on a cluster)."""
    check_baseline(baseline, result["backends"])
    d = result.get("design")
    design = None if d is None else sequential.Design(max_rounds=d["max_rounds"], first_look=d["first_look"],
                                                        alpha=d["alpha"], rho=d["rho"])
    return {**result, "baseline": baseline,
            "verdicts": verdicts(result["runs"], result["backends"], baseline, design=design, margins=margins)}


# GPU utilisation sampled on GPU steps (components.record.gpu_metrics): only runs on a GPU have it.
GPU_LABELS = {
    "gpu_idle_before_first_step_s": "GPU idle before the first step (s)",
    "gpu_util_mean_pct": "GPU utilisation during finetune (mean %)",
}


def gpu_rows(result: dict[str, Any]) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """The GPU metrics some path's succeeded runs have: (label, {path: {n, p50, p90}}); [] on CPU runs."""
    rows = []
    for name, label in GPU_LABELS.items():
        per_path = {}
        for path in dict.fromkeys(path_of(r) for r in result["runs"]):
            values = [r["metrics"][name] for r in result["runs"]
                      if path_of(r) == path and r["status"] == "succeeded" and r["metrics"].get(name) is not None]
            if values:
                per_path[path] = {"n": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90)}
        if per_path:
            rows.append((label, per_path))
    return rows


def gang_rows(result: dict[str, Any]) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """The gang and Kueue metrics some path measured: (label, {path: its summary entry, n > 0})."""
    rows = []
    for name, label in GANG_LABELS.items():
        per_path = {path: m[name] for path, m in result["summary"].items() if (m.get(name) or {}).get("n")}
        if per_path:
            rows.append((label, per_path))
    return rows
