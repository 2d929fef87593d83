"""A spread, not a point: the mean of a figure over seeds and its 95% interval, and the quality gate on it.

One run's exact match is one draw: the same pipeline at another seed (another vocabulary split,
another LoRA initialisation, another batch order) can score quite differently. ``llmpack run
--seeds N`` runs it N times and states the mean with a 95% confidence interval (Student's t on
the seeds' values: ``mean ± t(0.975, N-1) · s / √N``). Where several seeds exist the quality gate
compares distributions: the improvement passes only when the **lower end** of its interval is
above ``min_improvement`` (:func:`spread_gate`), so a gain that one lucky seed made does not pass.

The register step applies it (:func:`gate_passed`) on the last seed's run, which
``llmpack run --seeds`` gives the earlier seeds' improvements (:data:`components.settings.SEED_IMPROVEMENTS`);
the earlier seeds register challengers only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components import settings
from components.errors import InputError

# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom; above 30, t(30) = 2.042, which is
# at least t(df) for every df >= 30: a little wide for more seeds, never narrow (2.0 was narrow for df 31-59).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom {df}: need at least 1")
    return T975[df - 1] if df <= len(T975) else T975[-1]


@dataclass(frozen=True, kw_only=True)
class Interval:
    """A figure over ``n`` seeds: its mean and 95% interval (one seed: the value itself, no spread)."""

    n: int
    mean: float
    low: float
    high: float

    def text(self, scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
        """``17.0% (95% interval 9.4%..24.6%, 3 seeds)``."""
        def f(v: float) -> str:
            return f"{scale * v:.{digits}f}{unit}"

        if self.n < 2:
            return f"{f(self.mean)} (1 seed: no interval)"
        return f"{f(self.mean)} (95% interval {f(self.low)}..{f(self.high)}, {self.n} seeds)"


def interval(values: Sequence[float]) -> Interval:
    """The mean of ``values`` and its 95% t-interval."""
    if not values:
        raise ValueError("no values")
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return Interval(n=n, mean=mean, low=mean, high=mean)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return Interval(n=n, mean=mean, low=mean - half, high=mean + half)


def spread_gate(improvements: Sequence[float], min_improvement: float) -> tuple[bool, str]:
    """(passed, one line): the improvement's interval must lie above ``min_improvement``; one seed is a point."""
    iv = interval(improvements)
    if iv.n < 2:
        passed = iv.mean >= min_improvement  # one seed: the single run's gate
        return passed, (f"quality gate (1 seed): improvement {iv.mean:+.4f} "
                        f"{'>=' if passed else '<'} min_improvement {min_improvement:g}")
    passed = iv.low > min_improvement
    return passed, (f"quality gate over {iv.n} seeds: {'passed' if passed else 'failed'}: improvement "
                    f"{iv.mean:+.4f} (95% interval {iv.low:+.4f}..{iv.high:+.4f}), lower end "
                    f"{'above' if passed else 'not above'} min_improvement {min_improvement:g}")


def parse_improvements(text: str) -> list[float]:
    """:data:`~components.settings.SEED_IMPROVEMENTS`'s comma list; one line naming a bad item."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise InputError(f"{settings.SEED_IMPROVEMENTS.name}: {item!r} is not a finite number")
        out.append(value)
    return out


def gate_passed(evaluation: Mapping[str, Any], env: Mapping[str, str] | None = None, *,
                own: bool | None = None) -> bool:
    """Whether the version passed the quality gate: this run's own (``own``, as register recomputed it; else the
    evaluation's ``passed``), and where earlier seeds' improvements are given, the interval over them and this one
    (:func:`spread_gate`)."""
    own = bool(evaluation.get("passed", True)) if own is None else own
    raw = settings.SEED_IMPROVEMENTS.raw(env)
    if not raw:
        return own
    from components.training.generation import gate_improvement

    try:  # this seed's improvement recomputed from its figures, as the single run's gate is
        mine = float(gate_improvement(str(evaluation.get("gate_metric")), dict(evaluation)))
        floor = float(evaluation.get("min_improvement", 0.0))
    except (KeyError, TypeError, ValueError):
        return False
    return own and spread_gate([*parse_improvements(raw), mine], floor)[0]
