"""The plan's time quantiles with 95% intervals that hold past the slowest node measured (issue 49).

The q-quantile of spin-up is the run overhead plus the per-node ready time's quantile at level
q^(1/N) (:mod:`llmpack.cluster.plan.project.tail`); at 8 nodes the p90 is the per-node 98.7th
percentile, past the largest of 20 measured nodes, where a bootstrap of the nodes cannot reach. So the
per-node quantile comes from two fits with their parameters drawn from their posterior, and the stated
interval is the wider of the two: a **lognormal** (Jeffreys prior: exact for lognormal nodes) and a
**generalized Pareto tail** over the :func:`exceedances` largest nodes (peaks over threshold; shape
xi ~ N(0.2, 0.3^2) a priori, leaning to a moderately heavy tail the nodes must contradict to narrow
it). Per draw the overhead's bootstrap median is added; the figure is the median of both fits' draws.
Training: the runs' GPU-seconds over the GPUs planned (constant throughput per GPU, a stated prior).
:func:`predictive_cdf` is the plan's predictive distribution, for the held-out check
(:mod:`.holdout`). Why and how well: docs/plan.md, 'The intervals'. numpy inside the functions;
``default_rng(SEED)``: same input, same plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from llmpack.cluster.plan.project.model import Estimate

DRAWS = 2000
SEED = 49
CONFIDENCE = 0.95
XI_PRIOR = (0.2, 0.3)            # mean, sd of the tail shape's normal prior
XI_RANGE = (-0.4, 1.0, 57)       # the grid: bounded tails (xi < 0) to infinite variance (xi >= 0.5)
LOG_BETA_SPAN = (-2.5, 2.0, 70)  # log scale grid around log(mean excess)
MIN_EXCEEDANCES = 10
METHOD = ("per-node ready time's quantile at level q^(1/N), plus the median run overhead: the wider of two "
          f"{CONFIDENCE:.0%} posterior intervals, a lognormal (Jeffreys prior) and a generalized Pareto tail over the "
          f"largest nodes (xi ~ N({XI_PRIOR[0]}, {XI_PRIOR[1]}^2)), {DRAWS} draws each, numpy "
          f"default_rng(seed={SEED}); training = measured GPU-seconds / GPUs planned")


def exceedances(n: int, level: float) -> int:
    """How many of the ``n`` largest nodes the tail is fitted to for a per-node ``level``: at least
    :data:`MIN_EXCEEDANCES` and 2 sqrt(n) (enough to estimate a shape), and 1.5 n (1 - level), so the
    threshold lies well below the quantile asked; at most n - 1."""
    want = max(MIN_EXCEEDANCES, math.ceil(2 * math.sqrt(n)), math.ceil(1.5 * n * (1.0 - level)))
    return max(1, min(n - 1, want))


def lognormal_draws(values: Sequence[float], levels: Any, rng: Any, draws: int = DRAWS) -> Any:
    """(draws, L) quantiles at ``levels`` of a lognormal whose (mu, sigma) are drawn from their posterior."""
    import numpy as np

    y = np.log(np.maximum(np.asarray(values, dtype=float), 1e-3))
    n = len(y)
    s2 = float(np.var(y, ddof=1)) if n > 1 else 0.0
    sigma = np.sqrt((n - 1) * s2 / rng.chisquare(max(n - 1, 1), draws))
    mu = float(np.mean(y)) + sigma * rng.standard_normal(draws) / math.sqrt(n)
    z = np.array([NormalDist().inv_cdf(min(max(float(p), 1e-15), 1 - 1e-15)) for p in np.atleast_1d(levels)])
    return np.exp(mu[:, None] + sigma[:, None] * z[None, :])


@dataclass(frozen=True)
class Tail:
    """Posterior draws of a generalized Pareto tail over the ``k`` nodes above ``threshold``."""

    threshold: float
    k: int
    n: int
    xi: Any      # (draws,) shape
    beta: Any    # (draws,) scale
    zeta: Any    # (draws,) share of nodes over the threshold

    def quantile(self, level: float) -> Any:
        """(draws,) per-node quantiles at ``level`` (above the threshold's share: the fitted tail)."""
        import numpy as np

        r = np.maximum(self.zeta / max(1.0 - level, 1e-12), 1e-12)
        small = np.abs(self.xi) < 1e-6
        xi = np.where(small, 1.0, self.xi)
        return self.threshold + self.beta * np.where(small, np.log(r), (r ** xi - 1.0) / xi)


def tail_posterior(values: Sequence[float], level: float, rng: Any, draws: int = DRAWS) -> Tail:
    """The tail fitted for a per-node ``level``: k = :func:`exceedances`, (xi, beta) drawn from their
    posterior on a grid, the share over the threshold from its Beta posterior."""
    import numpy as np

    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    k = exceedances(n, level)
    u = float(x[n - k - 1])
    e = np.maximum(x[n - k:] - u, 0.5)  # whole-second stamps: a tie is half a second, not zero
    xi = np.linspace(*XI_RANGE)
    log_beta = math.log(float(np.mean(e))) + np.linspace(*LOG_BETA_SPAN)
    xg, lbg = np.meshgrid(xi, log_beta, indexing="ij")
    beta = np.exp(lbg)
    t = 1.0 + xg[..., None] * e / beta[..., None]
    inside = np.all(t > 0, axis=-1)
    logs = np.sum(np.log(np.where(t > 0, t, 1.0)), axis=-1)
    near0 = np.abs(xg) < 1e-9
    ll = -k * lbg - np.where(near0, e.sum() / beta, (1.0 / np.where(near0, 1.0, xg) + 1.0) * logs)
    ll = np.where(inside, ll - 0.5 * ((xg - XI_PRIOR[0]) / XI_PRIOR[1]) ** 2, -np.inf)
    w = np.exp(ll - ll.max()).ravel()
    pick = rng.choice(w.size, size=draws, p=w / w.sum())
    step_xi, step_lb = xi[1] - xi[0], log_beta[1] - log_beta[0]
    return Tail(threshold=u, k=k, n=n, xi=xg.ravel()[pick] + (rng.random(draws) - 0.5) * step_xi,
                beta=np.exp(lbg.ravel()[pick] + (rng.random(draws) - 0.5) * step_lb),
                zeta=rng.beta(k + 0.5, n - k + 0.5, draws))


def tail_draws(values: Sequence[float], level: float, rng: Any, draws: int = DRAWS) -> Any:
    """(draws,) per-node quantiles at ``level`` from a generalized Pareto tail over the largest nodes."""
    return tail_posterior(values, level, rng, draws).quantile(level)


def median_draws(values: Sequence[float], rng: Any, draws: int = DRAWS) -> Any:
    """(draws,) bootstrap medians of ``values`` (0 when there are none)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if not len(v):
        return np.zeros(draws)
    return np.median(v[rng.integers(0, len(v), size=(draws, len(v)))], axis=1)


def per_node(values: Sequence[float], levels: Sequence[float], rng: Any, draws: int = DRAWS) -> list[Any]:
    """Per model (lognormal, tail): (draws, L) per-node quantiles at ``levels``."""
    import numpy as np

    ln = lognormal_draws(values, levels, rng, draws)
    if len(set(values)) < 2:  # no spread to fit a tail to: every node alike
        return [ln, ln]
    tail = np.stack([tail_draws(values, lv, rng, draws) for lv in levels], axis=1)
    return [ln, tail]


def interval(models: Sequence[Any], extrapolated: bool = False) -> Estimate:
    """The wider of the models' central intervals; the figure the median of all their draws."""
    import numpy as np

    a = (1.0 - CONFIDENCE) / 2 * 100
    ends = [np.percentile(d, [a, 100 - a]) for d in models]
    return Estimate(value=float(np.median(np.concatenate(list(models)))), low=float(min(e[0] for e in ends)),
                    high=float(max(e[1] for e in ends)), extrapolated=extrapolated)


@dataclass(frozen=True, kw_only=True)
class Training:
    """The training time at the planned size, what it rests on, and how it was had (the line printed)."""

    median_s: float
    gpu_seconds: tuple[float, ...]   # per measured run (one value: given, not measured)
    gpus: int
    assumption: str

    def draws(self, levels: Sequence[float], rng: Any, draws: int = DRAWS) -> Any:
        """(draws, L) training-time quantiles at ``levels`` (constant when given, not measured)."""
        import numpy as np

        if len(self.gpu_seconds) < 2:
            return np.full((draws, len(levels)), self.median_s)
        return lognormal_draws(self.gpu_seconds, levels, rng, draws) / self.gpus


def training(gpu_seconds: Sequence[float], gpus: int, *, measured_at: str) -> Training:
    """Per-run training GPU-seconds over the ``gpus`` planned: constant throughput per GPU."""
    import statistics

    med = statistics.median(gpu_seconds)
    return Training(median_s=med / gpus, gpu_seconds=tuple(gpu_seconds), gpus=gpus,
                    assumption=(f"training {med / gpus:,.0f} s = {med:,.0f} GPU-s measured ({measured_at}) / {gpus} "
                                "GPUs: throughput per GPU taken as constant (perfect scaling, a prior, not measured)"))


def fixed_training(seconds: float, why: str) -> Training:
    return Training(median_s=seconds, gpu_seconds=(), gpus=1, assumption=why)


def gang_times(ready: Sequence[float], overhead: Sequence[float], load: Sequence[float], *, nodes: int,
               qs: Sequence[float], train: Training, after_s: float, extrapolated: Sequence[bool],
               seed: int = SEED, draws: int = DRAWS) -> dict[str, dict[str, Estimate]]:
    """Spin-up, time to first step and total: {headline: {"p50": Estimate, ...}} for ``qs``.

    Total = first step + training + ``after_s`` (post-training, preemption delay); its q-quantile per
    draw is med(S) + med(T) + sqrt((S_q - med S)^2 + (T_q - med T)^2) for the independent spin-up S and
    training T (exact for normal parts; the p50 is the sum of medians)."""
    import numpy as np

    from llmpack.cluster.plan.project.model import label

    rng = np.random.default_rng(seed)
    levels = [0.5, *qs]
    models = per_node(ready, [lv ** (1.0 / nodes) for lv in levels], rng, draws)
    over = median_draws(overhead, rng, draws)
    first = over + median_draws(load, rng, draws)
    t = train.draws(levels, rng, draws)
    out: dict[str, dict[str, Estimate]] = {"spin_up_s": {}, "first_step_s": {}, "total_s": {}}
    for i, q in enumerate(qs, 1):
        lab, flag = label(q), extrapolated[i - 1]
        out["spin_up_s"][lab] = interval([over + m[:, i] for m in models], flag)
        out["first_step_s"][lab] = interval([first + m[:, i] for m in models], flag)
        spread = [np.hypot(np.maximum(m[:, i] - m[:, 0], 0.0), np.maximum(t[:, i] - t[:, 0], 0.0)) for m in models]
        out["total_s"][lab] = interval([first + m[:, 0] + t[:, 0] + d + after_s
                                        for m, d in zip(models, spread, strict=True)], flag)
    return out


def predictive_cdf(ready: Sequence[float], overhead: Sequence[float], *, nodes: int, at: float,
                   seed: int = SEED, draws: int = 1000) -> float:
    """P(spin-up <= ``at``) under the plan's posterior predictive: both models' draws, half each (the
    lognormal's CDF; the tail's below its threshold the measured nodes' share, above it the Pareto
    tail), raised to the N-th power for the slowest of ``nodes``, the overhead a bootstrap median."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = np.sort(np.asarray(ready, dtype=float))
    over = median_draws(overhead, rng, draws)
    node_at = np.maximum(at - over, 1e-3)
    y = np.log(np.maximum(x, 1e-3))
    n = len(y)
    sigma = np.sqrt((n - 1) * float(np.var(y, ddof=1)) / rng.chisquare(max(n - 1, 1), draws))
    mu = float(np.mean(y)) + sigma * rng.standard_normal(draws) / math.sqrt(n)
    cdf = NormalDist().cdf
    z = (np.log(node_at) - mu) / np.maximum(sigma, 1e-12)
    f_ln = np.array([cdf(float(v)) for v in z])
    if len(set(ready)) < 2:
        f_tail = f_ln
    else:
        tail = tail_posterior(x, 0.5 ** (1.0 / nodes), rng, draws)
        below = np.searchsorted(x, node_at, side="right") / n * (1 - tail.zeta) / ((n - tail.k) / n)
        above = 1.0 - _survival_each(tail, node_at)
        f_tail = np.where(node_at <= tail.threshold, np.minimum(below, 1 - tail.zeta), above)
    return float(np.mean(np.concatenate([f_ln ** nodes, np.clip(f_tail, 0.0, 1.0) ** nodes])))


def _survival_each(tail: Tail, x: Any) -> Any:
    """Per draw d, P(node > x[d]) above the threshold: (draws,)."""
    import numpy as np

    z = np.maximum(x - tail.threshold, 0.0) / tail.beta
    small = np.abs(tail.xi) < 1e-6
    xi = np.where(small, 1.0, tail.xi)
    base = 1.0 + xi * z
    surv = np.where(small, np.exp(-z), np.where(base > 0, np.maximum(base, 1e-300) ** (-1.0 / xi), 0.0))
    return tail.zeta * surv
