"""``llmpack compare``: the same pipeline through several paths, sequentially, then statistics.

Sequential on purpose: on a small machine, paths running at once would measure each other.
One failed path does not lose the others' results: it is listed as failed with its error.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from components.errors import InputError
from components.submission import new_id
from llmpack.backends import BACKENDS
from llmpack.runs import RunOptions, prepare

DEFAULT_BACKENDS = tuple(BACKENDS)
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
)
PERCENTILE_METHOD = "linear interpolation between closest ranks (numpy 'linear', Hyndman-Fan type 7)"
MIN_N_FOR_P99 = 10


def parse_backends(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    if not names:
        raise InputError("--backends: give at least one of " + ", ".join(BACKENDS))
    for name in names:
        if name not in BACKENDS:
            raise InputError(f"--backends: unknown backend {name!r} (choose from {', '.join(BACKENDS)})")
    return list(dict.fromkeys(names))


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
    for orch in dict.fromkeys(r["orchestrator"] for r in runs):
        ok = [r for r in runs if r["orchestrator"] == orch and r["status"] == "succeeded"]
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


def comparison(run_group: str, backends: list[str], runs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The result of a comparison: its runs, the failed ones with their errors, the statistics."""
    return {
        "run_group": run_group,
        "backends": backends,
        **extra,
        "percentile_method": PERCENTILE_METHOD,
        "runs": runs,
        "failed": [
            {"pipeline_run": r["pipeline_run"], "orchestrator": r["orchestrator"], "error": r["error"]}
            for r in runs
            if r["status"] != "succeeded"
        ],
        "summary": summarize_runs(runs),
    }


def compare(
    opts: RunOptions,
    backends: list[str],
    repeats: int,
    *,
    run_one: Any = None,
) -> dict[str, Any]:
    """Run every backend ``repeats`` times (interleaved: a, b, c, a, b, c...) in one run group."""
    if repeats < 1:
        raise InputError(f"--repeats {repeats}: must be at least 1")
    for backend in backends:
        prepare(replace(opts, backend=backend))  # all input checks before the first run starts
    run_group = opts.run_group or new_id("rg")
    if run_one is None:
        from llmpack.runs import run_pipeline as run_one
    runs = []
    for i in range(repeats):
        for backend in backends:
            label = f"{backend} ({i + 1}/{repeats})" if repeats > 1 else backend
            runs.append(run_one(replace(opts, backend=backend, run_group=run_group), label))
    return comparison(run_group, backends, runs, repeats=repeats)
