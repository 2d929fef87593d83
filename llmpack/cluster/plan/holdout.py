"""The plan checked on its own history: each run planned from the others, and where it landed.

Per option (path x GPU type x capacity, own runs only) and run: the spin-up it measured (overhead +
its slowest node's provision + pull) against the plan made without it, at its own gang size --
from every other run (*leave-one-out*), and from the runs before it only (*time split*: a cluster
that changed shows here). Where the run falls is its level in that plan's posterior predictive
distribution (:func:`llmpack.cluster.plan.quantiles.predictive_cdf`: both fits, their parameters
drawn). Right, the levels are uniform: half the runs at or below the p50, nine in ten at or below
the p90. Per quantile: held k of n, a Wilson 95% interval on the rate, and a warning when that
interval lies below the stated level (the plan's tail too light for this history, or the cluster
changed since) -- and, for the p50, when it lies above (the plan too slow).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

from llmpack.cluster.plan.history import RunSample

STATED = {"p50": 0.5, "p90": 0.9}
MIN_BEFORE = 5      # runs a time split plans from before it checks one
MIN_NODES = 10      # node samples a plan needs for a p90 (tail.samples_needed(0.9))
SPLITS = {"loo": "leave-one-out", "time": "time split"}


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval of a rate k / n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def spin_up(s: RunSample) -> float | None:
    """The run's spin-up as the plan defines it: overhead + the slowest node's provision + pull."""
    if s.overhead_s is None or not s.nodes:
        return None
    return s.overhead_s + max(n.provision_s + n.pull_s for n in s.nodes)


def level(others: Sequence[RunSample], run: RunSample, seed: int) -> float | None:
    """The run's level in the plan from ``others``, or None when they are too few to plan from."""
    from llmpack.cluster.plan.quantiles import predictive_cdf

    ready = [n.provision_s + n.pull_s for s in others for n in s.nodes]
    overhead = [s.overhead_s for s in others if s.overhead_s is not None]
    actual = spin_up(run)
    if actual is None or len(ready) < MIN_NODES or len(overhead) < 2:
        return None
    return predictive_cdf(ready, overhead, nodes=len(run.nodes), at=actual, seed=seed)


def _ordered(runs: Sequence[RunSample]) -> list[RunSample]:
    """In submit order when every run has a time, else as read (MLflow: oldest first)."""
    if all(s.submitted_at is not None for s in runs):
        return sorted(runs, key=lambda s: s.submitted_at or 0.0)
    return list(runs)


def counts(levels: Sequence[float]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": len(levels)}
    for q, stated in STATED.items():
        k = sum(u <= stated for u in levels)
        low, high = wilson(k, len(levels))
        out[q] = {"held": k, "wilson95": [round(low, 3), round(high, 3)],
                  "below_stated": bool(levels) and high < stated,
                  "above_stated": bool(levels) and q == "p50" and low > stated}
    return out


def check(samples: Sequence[RunSample]) -> dict[str, Any]:
    """Per option with runs enough: both splits' counts; and the warnings."""
    by_option: dict[tuple[str, str, str], list[RunSample]] = {}
    for s in samples:
        by_option.setdefault((s.path, s.gpu_type, s.capacity), []).append(s)
    options: dict[str, Any] = {}
    warnings: list[str] = []
    for (path, gpu, capacity), runs in by_option.items():
        runs = _ordered(runs)
        found: dict[str, list[float]] = {"loo": [], "time": []}
        for i, run in enumerate(runs):
            u = level(runs[:i] + runs[i + 1:], run, seed=i)
            if u is not None:
                found["loo"].append(u)
            if i >= MIN_BEFORE:
                u = level(runs[:i], run, seed=i)
                if u is not None:
                    found["time"].append(u)
        name = f"{path} {gpu} {capacity}"
        options[name] = {split: counts(levels) for split, levels in found.items()}
        for split, c in options[name].items():
            for q, stated in STATED.items():
                if c[q]["below_stated"] or c[q]["above_stated"]:
                    low, high = c[q]["wilson95"]
                    way = ("below its stated {:.0%}: the plan's tail is too light for this history, or the cluster "
                           "changed" if c[q]["below_stated"] else
                           "above its stated {:.0%}: the plan is too slow for this history (nodes not independent?)")
                    warnings.append(f"WARNING {name}, {SPLITS[split]}: {q} held {c[q]['held']} of {c['runs']} "
                                    f"(Wilson {low:.0%}-{high:.0%}), {way.format(stated)}; measure again before "
                                    "trusting it")
    return {"options": options, "warnings": warnings}


def text(report: dict[str, Any]) -> list[str]:
    """The held-out check as lines (80 columns)."""
    lines = textwrap.wrap("held out: each run planned from its option's other runs (leave-one-out) and from the "
                          "runs before it (time split), at its gang size; stated: a run at or below the p50 half "
                          "the time, the p90 nine times in ten", 80)
    if not report["options"]:
        return [*lines, "  no option with runs to check"]
    for name, splits in report["options"].items():
        lines.append(f"  {name}:")
        for split, c in splits.items():
            if not c["runs"]:
                lines.append(f"    {SPLITS[split]}: too few runs to check")
                continue
            parts = [f"{q} held {c[q]['held']} of {c['runs']} ({c[q]['wilson95'][0]:.0%}-{c[q]['wilson95'][1]:.0%})"
                     for q in STATED]
            lines += textwrap.wrap(f"{SPLITS[split]}: " + ", ".join(parts), 80, initial_indent="    ",
                                   subsequent_indent="      ")
    for w in report["warnings"]:
        lines += textwrap.wrap(w, 80, subsequent_indent="  ")
    return lines
