"""Verdicts only beyond noise: a seeded bootstrap CI of the difference in medians.

Method (the report and ``--json`` cite it as :data:`METHOD`):

- the statistic is ``median(path) - median(baseline)`` over each side's succeeded runs;
- its 95% interval is a percentile bootstrap: :data:`RESAMPLES` resamples, each side resampled
  with replacement *independently* (runs of different paths are not paired: interleaving spreads
  drift over both, pairing would assume the k-th runs share conditions they do not), drawn from
  ``numpy.random.default_rng(SEED)``, so the same runs always give the same interval;
- a path is called faster/slower (cheaper/costlier) only when the interval excludes 0 *and*
  each side has at least :data:`MIN_N` runs. Below that the percentile bootstrap of a median is
  too coarse to mean anything (with 3 runs a side it excludes 0 whenever the two sets do not
  overlap, which identical paths do one time in ten), so the verdict is "too few runs".

The functions here are pure: lists of floats in, numbers and words out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Literal

RESAMPLES = 10_000
SEED = 0
CONFIDENCE = 0.95
MIN_N = 5
METHOD = (f"difference in medians vs the baseline; 95% percentile bootstrap CI, {RESAMPLES} resamples, each path "
          f"resampled independently, numpy default_rng(seed={SEED}); a verdict needs the CI to exclude 0 and "
          f"n >= {MIN_N} runs on both sides")

Verdict = Literal["lower", "higher", "no clear difference", "too few runs"]


@dataclass(frozen=True, kw_only=True)
class Difference:
    """``median(values) - median(baseline)`` with its bootstrap CI (``None`` when a side has < 2 runs)."""

    delta: float
    ci_low: float | None
    ci_high: float | None
    n: int
    n_baseline: int

    @property
    def verdict(self) -> Verdict:
        if self.n < MIN_N or self.n_baseline < MIN_N or self.ci_low is None or self.ci_high is None:
            return "too few runs"
        if self.ci_low > 0:
            return "higher"
        if self.ci_high < 0:
            return "lower"
        return "no clear difference"


def bootstrap_median_diff(
    values: list[float],
    baseline: list[float],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> Difference:
    """The difference in medians and its seeded percentile-bootstrap CI; same inputs, same interval."""
    if not values or not baseline:
        raise ValueError("both sides need at least one value")
    delta = statistics.median(values) - statistics.median(baseline)
    if len(values) < 2 or len(baseline) < 2:
        return Difference(delta=delta, ci_low=None, ci_high=None, n=len(values), n_baseline=len(baseline))
    import numpy as np

    rng = np.random.default_rng(seed)
    low, high = _interval(_resampled_medians(values, rng, resamples) - _resampled_medians(baseline, rng, resamples),
                          confidence)
    return Difference(delta=delta, ci_low=low, ci_high=high, n=len(values), n_baseline=len(baseline))


def bootstrap_median_ci(
    values: list[float],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float] | None:
    """The seeded percentile-bootstrap CI of one sample's median (e.g. of paired ratios); None below 2 values."""
    if len(values) < 2:
        return None
    import numpy as np

    return _interval(_resampled_medians(values, np.random.default_rng(seed), resamples), confidence)


def _resampled_medians(values: list[float], rng: Any, resamples: int) -> Any:
    """The medians of ``resamples`` resamples of ``values`` with replacement (a numpy array)."""
    import numpy as np

    a = np.asarray(values, dtype=float)
    return np.median(a[rng.integers(0, len(a), size=(resamples, len(a)))], axis=1)


def _interval(statistic: Any, confidence: float) -> tuple[float, float]:
    """The central ``confidence`` percentile interval of bootstrapped ``statistic`` values."""
    import numpy as np

    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(statistic, [tail, 100 - tail])
    return float(low), float(high)
