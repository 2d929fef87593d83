"""The projection: per path and gang size, gang-ready quantiles and cost per run, with bootstrap intervals.

What is resampled (:data:`METHOD`): the path's measured nodes (ready time and billed spin-up
together, so a node's phases stay one node's) and its runs (fixed overhead before the gang's pods,
gang ready -> first step), :data:`RESAMPLES` times with replacement from
``numpy.random.default_rng(SEED)``. Per resample and gang size N: gang ready's q-quantile =
median overhead + the max-of-N quantile of the resampled nodes (:mod:`.tail`); straggler waste
= N x G x (E[max] - mean own ready) GPU-seconds; compute = N x G x the training time; overhead =
N x G x (billed spin-up + first step + the scale-down delay each node is billed after its pod).
The point value is that of the measured samples; the interval the central 95% of resamples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.errors import InputError
from components.record import cost
from llmpack.cluster.plan.project import tail
from llmpack.cluster.plan.project.fit import PathFit
from llmpack.compare import stats

RESAMPLES = 2000
SEED = stats.SEED
METHOD = (f"gang ready = median per-run overhead + max over N nodes of per-node ready times (empirical; an "
          f"exponential tail past the largest sample, marked extrapolated); {stats.CONFIDENCE:.0%} percentile "
          f"bootstrap over nodes and runs with the tail's scale drawn from its spread, {RESAMPLES} resamples, "
          f"numpy default_rng(seed={SEED})")
COST_PARTS = ("compute", "straggler_waste", "overhead")


@dataclass(frozen=True, kw_only=True)
class Estimate:
    value: float
    low: float
    high: float
    extrapolated: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"value": round(self.value, 4), "ci": [round(self.low, 4), round(self.high, 4)],
                "extrapolated": self.extrapolated}


@dataclass(frozen=True, kw_only=True)
class Projection:
    """One path at one gang size; ``total_usd`` keeps every resample's cost per run (for the flip)."""

    path: str
    nodes: int
    gpus: int
    gang_ready: dict[str, Estimate]
    first_step: dict[str, Estimate]
    gpu_hours: Estimate
    cost_usd: dict[str, Estimate]        # compute, straggler_waste, overhead, total (None price: empty)
    total_usd: tuple[float, ...] = field(default=(), repr=False)


def label(q: float) -> str:
    """0.99 -> "p99", 0.5 -> "p50", 0.999 -> "p99.9"."""
    return "p" + f"{q * 100:.10g}"


def check_quantiles(fit: PathFit, qs: Sequence[float]) -> None:
    """Refuse (one line) a quantile the per-node samples cannot estimate even for one node."""
    for q in qs:
        need = tail.samples_needed(q)
        if fit.node_samples < need:
            raise InputError(f"path {fit.path}: {fit.node_samples} node samples, too few for {label(q)} "
                             f"(needs {need}); measure more gang runs or leave {label(q)} out of --quantiles")


def _estimate(values: Any, extrapolated: bool = False) -> Estimate:
    import numpy as np

    tail_pct = (1.0 - stats.CONFIDENCE) / 2 * 100
    low, high = np.percentile(values[1:], [tail_pct, 100 - tail_pct]) if len(values) > 1 else (values[0],) * 2
    return Estimate(value=float(values[0]), low=float(low), high=float(high), extrapolated=extrapolated)


def _resampled(fit: PathFit, rng: Any, resamples: int) -> tuple[Any, Any, Any, Any, Any]:
    """Nodes' ready times (B+1, n), and per row: mean billed spin-up, median overhead, median first
    step, the tail scale factor (:func:`.tail.tail_scale_draws`). Row 0 is the measured samples; a
    node's ready and billed times are resampled together."""
    import numpy as np

    n, runs = fit.node_samples, fit.runs
    pick = np.vstack([np.arange(n), rng.integers(0, n, size=(resamples, n))])
    run_pick = np.vstack([np.arange(runs), rng.integers(0, runs, size=(resamples, runs))])
    return (np.asarray(fit.ready_s)[pick], np.mean(np.asarray(fit.billed_s)[pick], axis=1),
            np.median(np.asarray(fit.overhead_s)[run_pick], axis=1),
            np.median(np.asarray(fit.first_step_s)[run_pick], axis=1), tail.tail_scale_draws(n, resamples, rng))


def predict_measured(fit: PathFit, nodes: int, qs: Sequence[float], runs: int, *, resamples: int = RESAMPLES,
                     seed: int = SEED) -> dict[str, Estimate]:
    """What ``runs`` real gangs of ``nodes`` will *measure*: the interval of their sample quantiles.

    :func:`project_path`'s interval is for the true quantile; a handful of runs scatters around
    it. Per resample, ``runs`` gangs are drawn (each max as Q(U^(1/N)), :func:`.tail.sampled_maxes`)
    plus the resample's overhead, and their sample quantile taken: the interval covers both the
    fit's uncertainty and the runs' own scatter (the check of
    tests/llmpack/cluster/plan/project/test_project_cluster.py).
    """
    import numpy as np

    check_quantiles(fit, qs)
    rng = np.random.default_rng(seed)
    ready, _billed, overhead, _first, scale = _resampled(fit, rng, resamples)
    gangs = overhead[:, None] + tail.sampled_maxes(ready, nodes, runs, rng, scale)
    point = overhead[0] + tail.max_quantiles(ready[:1], nodes, qs)[0]
    out = {}
    for i, q in enumerate(qs):
        est = _estimate(np.concatenate([[point[i]], np.quantile(gangs[1:], q, axis=1)]))
        out[label(q)] = Estimate(value=est.value, low=est.low, high=est.high,
                                 extrapolated=tail.is_extrapolated(fit.node_samples, nodes, q))
    return out


def project_path(fit: PathFit, nodes: Sequence[int], qs: Sequence[float], *, train_s: float | None = None,
                 scale_down_delay_s: float = cost.DEFAULT_SCALE_DOWN_DELAY_S, resamples: int = RESAMPLES,
                 seed: int = SEED) -> list[Projection]:
    """The path projected at every gang size in ``nodes`` (row 0 of every array: the measured samples)."""
    import numpy as np

    check_quantiles(fit, qs)
    n = fit.node_samples
    ready, billed, overhead, first, scale = _resampled(fit, np.random.default_rng(seed), resamples)
    own = tail.expected_max(ready, 1, scale)  # the mean by the same quadrature: no waste at N=1
    train = fit.train_s if train_s is None else train_s
    out = []
    for size in nodes:
        gpus = size * fit.gpus_per_node
        maxq = tail.max_quantiles(ready, size, qs, scale)
        flags = [tail.is_extrapolated(n, size, q) for q in qs]
        gang = {label(q): _estimate(overhead + maxq[:, i], flags[i]) for i, q in enumerate(qs)}
        step = {label(q): _estimate(overhead + maxq[:, i] + first, flags[i]) for i, q in enumerate(qs)}
        waste_extrapolated = tail.is_extrapolated(n, size, 0.5)
        parts_s = {"compute": np.full(len(ready), gpus * train),
                   "straggler_waste": gpus * np.maximum(tail.expected_max(ready, size, scale) - own, 0.0),
                   "overhead": gpus * (billed + first + scale_down_delay_s)}
        total_s = sum(parts_s.values())
        costs: dict[str, Estimate] = {}
        total_usd: tuple[float, ...] = ()
        if fit.price_per_gpu_hour is not None:
            per_s = fit.price_per_gpu_hour / 3600.0
            costs = {k: _estimate(v * per_s, waste_extrapolated and k == "straggler_waste") for k, v in parts_s.items()}
            costs["total"] = _estimate(total_s * per_s, waste_extrapolated)
            total_usd = tuple(float(v) for v in total_s * per_s)
        out.append(Projection(path=fit.path, nodes=size, gpus=gpus, gang_ready=gang, first_step=step,
                              gpu_hours=_estimate(total_s / 3600.0, waste_extrapolated), cost_usd=costs,
                              total_usd=total_usd))
    return out
