"""The flip: the GPU count at which two paths' monthly costs cross, with its bootstrap interval.

Monthly cost of a path at G GPUs = runs per month x projected cost per run at G + its control-plane
cost per month. Between two projected gang sizes the difference is taken as linear. Each bootstrap
resample of both paths' projections (:mod:`.model`, paired by resample index; the two paths were
resampled independently) gives its own crossing, or none in range; the interval is the central
95% of those, open ("beyond the range") where more than the tail of resamples do not cross.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from components.errors import InputError
from llmpack.cluster.plan.project.model import Projection
from llmpack.compare import stats


def _crossing(xs: Sequence[float], diff: Sequence[float]) -> float | None:
    """The first x where ``diff`` changes sign (linear between points); None when it never does."""
    for j in range(1, len(xs)):
        a, b = diff[j - 1], diff[j]
        if a == 0:
            return xs[j - 1]
        if (a < 0) != (b < 0) or b == 0:
            return xs[j - 1] + (xs[j] - xs[j - 1]) * a / (a - b)
    return None


def flip(projections: Mapping[str, Sequence[Projection]], paths: tuple[str, str], *, runs_per_month: float,
         control_plane: Mapping[str, float]) -> dict[str, Any]:
    """Where ``paths``' monthly costs cross over the projected GPU counts (JSON-ready)."""
    import numpy as np

    a, b = paths
    for p in paths:
        if p not in projections:
            raise InputError(f"--paths: no measured gangs of path {p!r} (measured: {', '.join(projections)})")
        if not all(pr.total_usd for pr in projections[p]):
            raise InputError(f"--paths: path {p} has no price per GPU-hour (give --price-per-gpu-hour)")
    by_gpus = [{pr.gpus: pr for pr in projections[p]} for p in paths]
    xs = sorted(set(by_gpus[0]) & set(by_gpus[1]))
    if len(xs) < 2:
        raise InputError("--paths: the two paths share fewer than 2 projected GPU counts (same --gpus-per-node?)")

    def monthly(i: int, p: str) -> Any:
        return np.array([by_gpus[i][x].total_usd for x in xs]) * runs_per_month + control_plane.get(p, 0.0)

    month_a, month_b = monthly(0, a), monthly(1, b)
    diff = month_a - month_b  # (len(xs), resamples + 1)
    point = _crossing(xs, list(diff[:, 0]))
    crossings = [_crossing(xs, list(diff[:, k])) for k in range(1, diff.shape[1])]
    tail = (1.0 - stats.CONFIDENCE) / 2
    ordered = sorted(np.inf if c is None else c for c in crossings)
    low, high = (ordered[int(tail * (len(ordered) - 1))], ordered[int((1 - tail) * (len(ordered) - 1))]) \
        if ordered else (np.inf, np.inf)
    below = a if diff[0, 0] < 0 else b
    above = b if below == a else a
    result: dict[str, Any] = {
        "paths": [a, b], "runs_per_month": runs_per_month,
        "control_plane_usd_month": {p: control_plane.get(p, 0.0) for p in paths},
        "gpus": xs, "monthly_usd": {a: [round(float(v), 2) for v in month_a[:, 0]],
                                    b: [round(float(v), 2) for v in month_b[:, 0]]},
        "flip_gpus": None if point is None else round(float(point), 1),
        "ci": [None if not np.isfinite(v) else round(float(v), 1) for v in (low, high)],
        "share_crossing": round(sum(c is not None for c in crossings) / max(1, len(crossings)), 3),
    }
    if point is None:
        result["sentence"] = f"no flip in range ({xs[0]}-{xs[-1]} GPUs): {below} is cheaper per month throughout"
    else:
        ci = "-".join("beyond" if v is None else f"{v:,.0f}" for v in result["ci"])
        result["sentence"] = (f"{below} is cheaper per month below ~{point:,.0f} GPUs and {above} above "
                              f"(95% interval {ci} GPUs)")
    return result
