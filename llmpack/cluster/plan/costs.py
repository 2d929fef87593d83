"""Cost per run of an option, and on spot the expected preemption waste.

Compute, straggler waste and overhead are :func:`llmpack.cluster.plan.project.model.project_path`'s (N x G GPUs
x training time; x the expected wait for the slowest node; x billed spin-up, first step and the
scale-down delay), with their 95% intervals; other GPU is the median of the runs' billed GPU node-hours
outside the finetune gang (the evaluate step's node, the MLflow Job's own pod), with a bootstrap
interval. On spot, preemptions arrive at ``rate`` per node-hour
while the gang holds its nodes (load + training): the expected count is ``rate x N x hours``, and
each costs the whole gang the work since the last checkpoint (half the checkpoint interval on
average; half the training without one) plus a re-spin-up (a node's provision + pull, then the
load) — the preemption waste, added to the cost and, as a delay, to the total time. The rate is
measured (preempted attempts / spot node-hours of the GPU type's history) or given
(``--spot-interruptions-per-hour``); with neither, a spot option gets no cost rather than a guess.
"""

from __future__ import annotations

import statistics
from typing import Any

from llmpack.cluster.plan.history import SPOT
from llmpack.cluster.plan.phases import OptionSamples
from llmpack.cluster.plan.prices import PriceRow
from llmpack.cluster.plan.project.model import Estimate

PARTS = ("compute", "straggler_waste", "overhead", "other_gpu", "preemption_waste")


def measured_rate(s: OptionSamples) -> tuple[float, str] | None:
    """Preempted attempts per node-hour on this GPU type's spot runs, or None without any spot runs."""
    if s.spot_gang_hours <= 0:
        return None
    return s.preemptions / s.spot_gang_hours, f"measured: {s.preemptions} in {s.spot_gang_hours:.2f} node-h"


def preemption(s: OptionSamples, *, nodes: int, row: Any, train_s: float, rate: tuple[float, str] | None,
               checkpoint_interval_s: float | None) -> dict[str, Any]:
    """Expected preemptions of one spot run, the seconds each loses and the total delay ({} on demand)."""
    if s.option.capacity != SPOT:
        return {}
    if rate is None:
        return {"unknown": True}
    per_hour, source = rate
    held_h = (statistics.median(s.load_s) + train_s) / 3600.0
    expected = per_hour * nodes * held_h
    lost_work = (train_s if checkpoint_interval_s is None else min(checkpoint_interval_s, train_s)) / 2.0
    respin = statistics.median(s.ready_s) + statistics.median(s.load_s)
    lost_s = lost_work + respin
    return {"per_node_hour": per_hour, "source": source, "expected": expected, "lost_s": lost_s,
            "delay_s": expected * lost_s}


def cost_per_run(row: Any, s: OptionSamples, *, price: PriceRow | None, preempt: dict[str, Any],
                 gpus: int) -> tuple[dict[str, Estimate], str]:
    """part -> Estimate in USD (``total`` included), and a note when there is no cost to give."""
    if price is None:
        what = "spot price" if s.option.capacity == SPOT else "price"
        return {}, f"no {what} for {s.option.gpu_type} in the catalogue (--price-file)"
    if preempt.get("unknown"):
        return {}, "no preemption rate: no spot runs measured; say --spot-interruptions-per-hour"
    out = {k: row.cost_usd[k] for k in ("compute", "straggler_waste", "overhead")}
    other = median_interval(s.other_gpu_h, price.per_gpu_hour)
    if other is not None:
        out["other_gpu"] = other
    waste = preempt.get("expected", 0.0) * gpus * preempt.get("lost_s", 0.0) * price.per_gpu_hour / 3600.0
    out["preemption_waste"] = Estimate(value=waste, low=waste, high=waste)
    t = row.cost_usd["total"]
    add = [waste, waste, waste]
    if other is not None:
        add = [waste + other.value, waste + other.low, waste + other.high]
    out["total"] = Estimate(value=t.value + add[0], low=t.low + add[1], high=t.high + add[2],
                            extrapolated=t.extrapolated)
    return out, ""


def median_interval(values: tuple[float, ...], scale: float) -> Estimate | None:
    """The median of ``values`` x ``scale`` with a 95% percentile bootstrap interval (seeded); None: no values."""
    import numpy as np

    from llmpack.cluster.plan.project.model import RESAMPLES, SEED

    if not values:
        return None
    x = np.asarray(values, dtype=float) * scale
    rng = np.random.default_rng(SEED)
    meds = np.median(x[rng.integers(0, len(x), size=(RESAMPLES, len(x)))], axis=1)
    low, high = np.percentile(meds, [2.5, 97.5])
    return Estimate(value=float(np.median(x)), low=float(low), high=float(high))
