"""Quantiles of a max over N nodes from n per-node samples, and when that is an extrapolation.

P(max of N <= x) = F(x)^N, so the q-quantile of the max is the per-node quantile at level
``q ** (1/N)``: no inner simulation is needed, only the per-node quantile function. Inside the
sample that is the empirical quantile (what was measured, resampled). Past it, the level
``q ** (1/N)`` lies beyond the largest of n samples and the empirical quantile would stop at that
largest value, under-stating the tail; there an exponential tail is fitted to the top
:func:`tail_size` samples (mean excess over the threshold, the peaks-over-threshold estimate) and
the projection says "extrapolated". Heavier-than-exponential tails are then under-stated; the
bootstrap of the fit widens the interval but cannot see what was never measured.
"""

from __future__ import annotations

import math
from typing import Any


def samples_needed(q: float) -> int:
    """Samples for an empirical q-quantile to be inside the sample: ceil(1 / (1 - q)) (p99: 100)."""
    return math.ceil(1.0 / (1.0 - q) - 1e-9)


def is_extrapolated(n_samples: int, nodes: int, q: float) -> bool:
    """The max-of-``nodes`` q-quantile needs ``nodes * samples_needed(q)`` per-node samples."""
    return nodes * samples_needed(q) > n_samples


def tail_size(n: int) -> int:
    """How many of the largest samples the exponential tail is fitted to: about sqrt(n) (at most a
    quarter, at least 3): enough to estimate a scale, few enough to stay in the tail."""
    return max(3, min(n // 4, round(math.sqrt(n))))


def quantiles(samples: Any, levels: Any, tail_scale: Any = None) -> Any:
    """Per-node quantiles at ``levels`` for each row of ``samples``: (B, n) and (L,) or (B, L) -> (B, L).

    Levels up to ``1 - 1/n`` are empirical (linear interpolation between order statistics);
    above, past the sample, the larger of that and ``u + beta * ln((k/n) / (1 - level))``, with
    k = :func:`tail_size`, ``u`` the (k+1)-th largest sample and ``beta`` the mean excess of the k
    largest over it. ``tail_scale`` (one factor per row) multiplies ``beta``: the bootstrap passes
    draws of its uncertainty (:func:`tail_scale_draws`).
    """
    import numpy as np

    x = np.sort(np.atleast_2d(np.asarray(samples, dtype=float)), axis=1)
    b, n = x.shape
    lv = np.broadcast_to(np.clip(np.asarray(levels, dtype=float), 0.0, 1.0), (b, np.shape(levels)[-1]))
    pos = lv * (n - 1)
    lo = np.minimum(np.floor(pos).astype(int), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    empirical = (np.take_along_axis(x, lo, 1)
                 + (pos - lo) * (np.take_along_axis(x, hi, 1) - np.take_along_axis(x, lo, 1)))
    k = min(tail_size(n), n - 1)
    if k < 1:
        return empirical
    u = x[:, n - k - 1]
    beta = np.mean(x[:, n - k:] - u[:, None], axis=1) * (1.0 if tail_scale is None else np.asarray(tail_scale))
    tail = u[:, None] + beta[:, None] * np.log((k / n) / np.maximum(1.0 - lv, 1e-12))
    return np.where(lv > 1.0 - 1.0 / n, np.maximum(tail, empirical), empirical)


def tail_scale_draws(n: int, resamples: int, rng: Any) -> Any:
    """Row 0: 1; then ``resamples`` draws of k / Gamma(k): the spread of an exponential scale
    estimated from k exceedances (its inverse-gamma posterior, relative to the estimate).

    Resampling nodes alone under-states it: a resample cannot hold a value larger than the
    largest measured, so its tail is never heavier than the sample's."""
    import numpy as np

    k = max(1, min(tail_size(n), n - 1))
    return np.concatenate([[1.0], k / rng.gamma(k, size=resamples)])


def max_quantiles(samples: Any, nodes: int, qs: Any, tail_scale: Any = None) -> Any:
    """q-quantiles of the max over ``nodes`` draws, per row of ``samples``: (B, len(qs))."""
    import numpy as np

    return quantiles(samples, np.asarray(qs, dtype=float) ** (1.0 / nodes), tail_scale)


GRID = 128  # midpoints of the quantile integral for E[max]


def expected_max(samples: Any, nodes: int, tail_scale: Any = None) -> Any:
    """E[max over ``nodes`` draws] per row: the integral over u in (0, 1) of Q(u ** (1/nodes)).

    Q is :func:`quantiles` (empirical, exponential past the sample), on a midpoint grid.
    """
    import numpy as np

    grid = (np.arange(GRID) + 0.5) / GRID
    return np.mean(max_quantiles(samples, nodes, grid, tail_scale), axis=1)


def sampled_maxes(samples: Any, nodes: int, runs: int, rng: Any, tail_scale: Any = None) -> Any:
    """``runs`` gang maxima of ``nodes`` draws per row, drawn as Q(U ** (1/nodes)): (B, runs)."""
    import numpy as np

    b = np.shape(samples)[0] if np.ndim(samples) > 1 else 1
    return quantiles(samples, rng.uniform(size=(b, runs)) ** (1.0 / nodes), tail_scale)
