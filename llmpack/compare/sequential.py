"""Compare until decided: a sequential test of a path against the baseline, with a stated error rate.

After each round each headline of each path is judged on the per-round differences from the
baseline, with Student's t at the level the look may spend (the error budget :data:`ALPHA` spent
across the looks by Kim and DeMets' power family), so every interval of every look holds at once
with probability at least ``1 - ALPHA``. Decided is a difference or practical equivalence within
``±margin``; anything else is undecided, with the rounds that would likely decide it.
``tests/llmpack/compare/test_sequential.py`` proves the rates by simulation. Pure: floats in, a
:class:`Decision` out. The method in full (the report cites :data:`METHOD`): docs/internals/comparison.md.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ALPHA = 0.05
RHO = 2.0
FIRST_LOOK = 3
METHOD = (f"mean of per-round differences vs the baseline; Student-t interval at the level each look may spend: "
          f"error rate {ALPHA:.0%} spent over the looks from round {FIRST_LOOK} (or the last round of a fixed "
          f"--repeats) by alpha*(look/looks)^{RHO:g}; decided = the interval excludes 0 (a difference) or lies "
          f"inside ±margin (equivalent)")

Verdict = Literal["higher", "lower", "equivalent", "undecided"]


@dataclass(frozen=True, kw_only=True)
class Design:
    """When a compare looks at its data and how much error each look may spend.

    ``first_look`` is the first round judged (fewer than three paired rounds give a t interval
    with one degree of freedom: wide enough to be useless, and its variance estimate unstable);
    ``max_rounds`` the last. A fixed ``--repeats N`` is ``Design(first_look=N, max_rounds=N)``:
    one look, the whole ``alpha``.
    """

    max_rounds: int
    first_look: int = FIRST_LOOK
    alpha: float = ALPHA
    rho: float = RHO

    def __post_init__(self) -> None:
        if not 2 <= self.first_look <= self.max_rounds:
            raise ValueError(f"looks from round {self.first_look} to {self.max_rounds}: need 2 <= first <= last")

    @property
    def looks(self) -> int:
        return self.max_rounds - self.first_look + 1

    def spent(self, n: int) -> float:
        """The two-sided error the look after round ``n`` may spend (0 when ``n`` is not a look)."""
        if not self.first_look <= n <= self.max_rounds:
            return 0.0
        j, k = n - self.first_look + 1, self.looks
        return self.alpha * ((j / k) ** self.rho - ((j - 1) / k) ** self.rho)

    @classmethod
    def fixed(cls, rounds: int) -> Design:
        """One look after ``rounds`` rounds (``--repeats``); below 2 rounds no interval is possible."""
        return cls(max_rounds=max(rounds, 2), first_look=max(rounds, 2))


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One headline of one path vs the baseline after ``n`` paired rounds."""

    delta: float | None  # mean of the per-round differences
    ci_low: float | None
    ci_high: float | None
    confidence: float | None  # 1 - the error spent at this look
    n: int
    margin: float
    verdict: Verdict
    rounds_to_decide: int | None = None  # undecided: paired rounds that would likely decide it at this noise

    @property
    def decided(self) -> bool:
        return self.verdict != "undecided"

    @property
    def within_margin(self) -> bool:
        return (self.ci_low is not None and self.ci_high is not None
                and -self.margin < self.ci_low and self.ci_high < self.margin)


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (scipy; cached: a compare asks the same few again and again)."""
    from scipy.stats import t

    return float(t.ppf(p, df))


def decide(diffs: Sequence[float], *, margin: float, design: Design) -> Decision:
    """The verdict on paired differences ``diffs`` (one per round) at the look after ``len(diffs)`` rounds.

    Before the first look (or after the last) no interval is claimed: the verdict is
    ``undecided`` and the interval is left out.
    """
    n = len(diffs)
    if n == 0:
        return Decision(delta=None, ci_low=None, ci_high=None, confidence=None, n=0, margin=margin, verdict="undecided")
    delta = statistics.fmean(diffs)
    spent = design.spent(min(n, design.max_rounds))
    if n < design.first_look or spent <= 0.0:
        return Decision(delta=delta, ci_low=None, ci_high=None, confidence=None, n=n, margin=margin,
                        verdict="undecided", rounds_to_decide=design.first_look if n < design.first_look else None)
    sd = statistics.stdev(diffs)
    half = t_quantile(1 - spent / 2, n - 1) * sd / math.sqrt(n)
    low, high = delta - half, delta + half
    verdict: Verdict
    if low > 0:
        verdict = "higher"
    elif high < 0:
        verdict = "lower"
    elif -margin < low and high < margin:
        verdict = "equivalent"
    else:
        verdict = "undecided"
    return Decision(delta=delta, ci_low=low, ci_high=high, confidence=1 - spent, n=n, margin=margin, verdict=verdict,
                    rounds_to_decide=None if verdict != "undecided"
                    else _rounds_to_decide(delta, sd, margin, design, n))


def _rounds_to_decide(delta: float, sd: float, margin: float, design: Design, n: int, limit: int = 200) -> int | None:
    """Paired rounds after which the interval would likely decide, if ``delta`` and ``sd`` held (None: over ``limit``).

    Planned as if the looks went on at the last look's level (the budget, not this design, is
    what more rounds would change).
    """
    if sd == 0.0:
        return n + 1
    target = max(abs(delta), margin - abs(delta))  # the half-width that decides one way or the other
    if target <= 0.0:
        return None
    last = design.spent(design.max_rounds) or design.alpha
    for m in range(max(n + 1, 3), limit + 1):
        if t_quantile(1 - last / 2, m - 1) * sd / math.sqrt(m) < target:
            return m
    return None
