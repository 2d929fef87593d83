"""The plan as words: the terminal table (80 columns, a block of lines per option) and the JSON.

Every figure is printed with its 95% interval; a figure resting on a borrowed phase says so on the
option's ``borrowed:`` line, a figure past the measured range carries ``*`` (extrapolated), a
stale price ``!``. An option without an estimate prints its note (what is missing and the command
that would measure it), never a number.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from llmpack.cluster.plan.choice import Choice
from llmpack.cluster.plan.estimate import HEADLINES, OptionEstimate
from llmpack.cluster.plan.project.model import Estimate
from llmpack.cluster.plan.project.render import seconds

WIDTH = 80
NAMES = {"spin_up_s": "spin-up", "first_step_s": "first step", "total_s": "total"}


def _interval(e: Estimate) -> str:
    """``95 s (88-102)`` in the value's unit."""
    unit = seconds(e.value).split()[1]
    div = {"s": 1, "min": 60, "h": 3600}[unit]
    fmt = "{:.0f}" if unit == "s" else "{:.1f}"
    return (f"{seconds(e.value)} ({fmt.format(e.low / div)}-{fmt.format(e.high / div)})"
            f"{'*' if e.extrapolated else ''}")


def usd(value: float) -> str:
    return f"${value:,.2f}" if value < 100 else f"${value:,.0f}"


def short_gpu(gpu_type: str) -> str:
    return gpu_type.removeprefix("nvidia-")


def _wrap(text: str, indent: str = "    ") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")


def block(e: OptionEstimate, chosen: bool) -> list[str]:
    """One option's lines."""
    o = e.samples.option
    head = (f"{'*' if chosen else ' '} {o.path} {short_gpu(o.gpu_type)} {o.capacity}, "
            f"{e.nodes}x{e.samples.gpus_per_node} GPUs")
    if not e.estimated:
        return [head, *_wrap(e.note)]
    if e.cost:
        t = e.cost["total"]
        stale = "!" if e.price and e.price.stale else ""
        head += f": {usd(t.value)}{stale} a run ({usd(t.low)}-{usd(t.high)})"
    lines = [head]
    for q in ("p50", "p90"):
        lines += _wrap(f"{q}: " + ", ".join(f"{NAMES[h]} {_interval(e.times[h][q])}" for h in HEADLINES))
    if e.cost:
        parts = ", ".join(f"{k.replace('_', ' ')} {usd(e.cost[k].value)}" for k in
                          ("compute", "straggler_waste", "overhead", "other_gpu", "preemption_waste")
                          if k in e.cost and (k != "preemption_waste" or e.preemption))
        price = e.price
        lines += _wrap(f"cost: {parts}; at {usd(price.per_gpu_hour)}/GPU-h ({price.source})" if price else parts)
    if e.preemption and not e.preemption.get("unknown"):
        p = e.preemption
        lines += _wrap(f"spot: {p['expected']:.2f} preemptions expected ({p['per_node_hour']:.3g}/node-h, "
                       f"{p['source']}), {seconds(p['lost_s'])} lost each")
    if e.note:
        lines += _wrap(e.note)
    if e.samples.assumed:
        lines += _wrap("not measured, taken as 0 s: " + ", ".join(e.samples.assumed))
    if e.samples.borrowed:
        lines += _wrap("borrowed: " + "; ".join(f"{k} from {v}" for k, v in e.samples.borrowed.items()))
    return lines


def table(rows: Sequence[OptionEstimate], choice: Choice, context: Sequence[str] = ()) -> str:
    """The whole plan: context lines, each option's block, the legend and the chosen line."""
    lines = [ln for c in context for ln in textwrap.wrap(c, WIDTH, subsequent_indent="  ")]
    for r in rows:
        lines += block(r, r is choice.chosen)
    lines.append("")
    lines += textwrap.wrap("p50/p90 with 95% intervals; * extrapolated past the measured range; ! stale price; "
                           "borrowed: a phase measured on another GPU type, path or capacity", WIDTH)
    lines += textwrap.wrap(choice.why, WIDTH, subsequent_indent="  ")
    return "\n".join(lines)


def row_json(e: OptionEstimate, chosen: bool) -> dict[str, Any]:
    o = e.samples.option
    price = e.price
    return {
        "path": o.path, "gpu_type": o.gpu_type, "capacity": o.capacity, "nodes": e.nodes, "gpus": e.gpus,
        "chosen": chosen, "estimated": e.estimated, "own_runs": e.samples.runs, "note": e.note or None,
        "times_s": {h: {q: v.as_json() for q, v in e.times[h].items()} for h in e.times},
        "cost_usd": {k: v.as_json() for k, v in e.cost.items()},
        "price": None if price is None else {"per_gpu_hour": price.per_gpu_hour, "source": price.source,
                                             "url": price.url, "as_of": price.as_of, "stale": price.stale},
        "preemption": {k: v for k, v in e.preemption.items()} or None,
        "borrowed": dict(e.samples.borrowed), "missing": list(e.samples.missing),
        "assumed_zero": list(e.samples.assumed),
    }


def as_json(rows: Sequence[OptionEstimate], choice: Choice, inputs: dict[str, Any]) -> dict[str, Any]:
    from llmpack.cluster.plan.project.model import METHOD

    return {"inputs": inputs, "method": METHOD, "options": [row_json(r, r is choice.chosen) for r in rows],
            "chosen": None if choice.chosen is None else choice.chosen.samples.option.label, "why": choice.why}
