"""The chosen row: the cheapest (``--objective cost``) or fastest (``time``) option that keeps within
``--deadline`` (its total time's p90 at most that) and ``--max-cost`` (its cost interval's upper
bound at most that), and one line that says why — or why nothing was chosen.

Upper ends, not medians, are held to the limits: a limit is what the user cannot exceed, so an
option is in only when the estimate's pessimistic side fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from llmpack.cluster.plan.estimate import OptionEstimate

Objective = Literal["cost", "time"]


@dataclass(frozen=True, kw_only=True)
class Choice:
    chosen: OptionEstimate | None
    why: str


def _s(value: float) -> str:
    return f"{value:.0f} s" if value < 600 else f"{value / 60:.1f} min" if value < 36_000 else f"{value / 3600:.1f} h"


def score(e: OptionEstimate, objective: Objective) -> float:
    return e.cost["total"].value if objective == "cost" else e.times["total_s"]["p50"].value


def choose(rows: Sequence[OptionEstimate], *, objective: Objective, deadline_s: float | None = None,
           max_cost: float | None = None) -> Choice:
    """The chosen row and the sentence for it."""
    estimated = [r for r in rows if r.estimated and (objective == "time" or r.cost)]
    if not estimated:
        need = "an estimate with a price" if objective == "cost" else "an estimate"
        return Choice(chosen=None, why=f"nothing chosen: no option has {need} (see each row's note)")
    fits, out = [], []
    for r in estimated:
        if deadline_s is not None and r.times["total_s"]["p90"].value > deadline_s:
            out.append(f"{r.samples.option.label} (p90 {_s(r.times['total_s']['p90'].value)})")
        elif max_cost is not None and (not r.cost or r.cost["total"].high > max_cost):
            out.append(f"{r.samples.option.label} (up to ${r.cost['total'].high:.2f})" if r.cost
                       else f"{r.samples.option.label} (no cost)")
        else:
            fits.append(r)
    limits = " and ".join(x for x in (f"a {_s(deadline_s)} deadline (total p90)" if deadline_s is not None else "",
                                      f"${max_cost:.2f} (cost upper bound)" if max_cost is not None else "") if x)
    if not fits:
        return Choice(chosen=None, why=f"nothing chosen: no option keeps within {limits}; over it: "
                      + ", ".join(out[:3]) + (" ..." if len(out) > 3 else ""))
    ranked = sorted(fits, key=lambda r: score(r, objective))
    best = ranked[0]
    what = (f"cheapest at ${best.cost['total'].value:.2f} a run" if objective == "cost"
            else f"fastest at {_s(best.times['total_s']['p50'].value)} total (p50)")
    why = f"chosen: {best.samples.option.label}: {what}"
    if len(ranked) > 1:
        nxt = ranked[1]
        other = (f"${nxt.cost['total'].value:.2f}" if objective == "cost"
                 else _s(nxt.times["total_s"]["p50"].value))
        why += f"; next {nxt.samples.option.label} at {other}"
    if limits:
        why += f"; within {limits}" + (f", {len(out)} over it" if out else "")
    return Choice(chosen=best, why=why)
