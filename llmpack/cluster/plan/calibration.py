"""``llmpack cluster plan --calibration``: would the plan have held on the history itself, and did it hold on
the runs submitted with ``--plan``.

**Held out** (:mod:`.holdout`): every measured run planned from the other runs of its option
(leave-one-out) and from the runs before it (time split), at its own gang size; where its spin-up
falls in that plan's predictive distribution. A p50 right lands half the runs at or below it, a p90
nine in ten: the counts with a Wilson 95% interval, and a warning when the interval lies below the
stated level (the tail too light, or the cluster changed) or, for the p50, above it.

**Planned runs**: per headline, a quantile *held* for a run when the run's actual value is at most
that quantile's 95% interval upper end; also how often the actual fell below the p50's lower end and
how often the cost fell inside its interval. That check is lenient (an upper end holds more often
than its quantile): the held-out one is the one that can fail. Counts, not rates alone: "held 17 of
20" says how much evidence there is.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from llmpack.cluster.plan.history import RunSample
from llmpack.report.estimate import PREFIX, parse_triple

HEADLINES = {"spin_up_s": "spin-up", "first_step_s": "first step", "total_s": "total"}
STATED = {"p50": 0.5, "p90": 0.9}


def calibration(samples: Sequence[RunSample]) -> dict[str, Any]:
    """Coverage per headline over the planned runs among ``samples``, and the held-out check."""
    from llmpack.cluster.plan import holdout

    planned = [s for s in samples if f"{PREFIX}option" in s.planned]
    out: dict[str, Any] = {"planned_runs": len(planned), "headlines": {}, "held_out": holdout.check(samples)}
    for h in HEADLINES:
        n, held = 0, {"p50": 0, "p90": 0}
        below_low = 0
        for s in planned:
            actual = s.actual.get(h)
            p50, p90 = parse_triple(s.planned.get(f"{PREFIX}{h}.p50")), parse_triple(s.planned.get(f"{PREFIX}{h}.p90"))
            if actual is None or p50 is None or p90 is None:
                continue
            n += 1
            held["p50"] += actual <= p50[2]
            held["p90"] += actual <= p90[2]
            below_low += actual < p50[1]
        out["headlines"][h] = {"runs": n, "held": held, "below_p50_low": below_low,
                               "ok": n > 0 and all(held[q] >= STATED[q] * n for q in STATED)}
    costs = [(s.actual.get("cost_usd"), parse_triple(s.planned.get(f"{PREFIX}cost_usd"))) for s in planned]
    costs = [(a, c) for a, c in costs if a is not None and c is not None]
    out["cost"] = {"runs": len(costs), "inside": sum(c[1] <= a <= c[2] for a, c in costs)}
    return out


def text(report: dict[str, Any]) -> str:
    """The coverage as lines (80 columns)."""
    from llmpack.cluster.plan import holdout

    lines = holdout.text(report["held_out"])
    if not report["planned_runs"]:
        return "\n".join([*lines, *textwrap.wrap(
            "no planned runs in the history: submit with --plan FILE (llmpack cluster submit, or llmpack cluster "
            "compare) to record an estimate, then run this again", 80)])
    lines.append(f"calibration over {report['planned_runs']} planned runs (held: actual <= the quantile's upper end)")
    for h, name in HEADLINES.items():
        c = report["headlines"][h]
        if not c["runs"]:
            continue
        lines += textwrap.wrap(f"{name}: p50 held {c['held']['p50']} of {c['runs']} (stated 50%), p90 held "
                     f"{c['held']['p90']} of {c['runs']} (stated 90%); {c['below_p50_low']} below p50's low end", 80,
                               initial_indent="  ", subsequent_indent="    ")
    cost = report["cost"]
    if cost["runs"]:
        lines.append(f"  cost: inside its 95% interval {cost['inside']} of {cost['runs']}")
    return "\n".join(lines)
