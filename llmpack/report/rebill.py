"""``llmpack report --scale-down-delay-s``: node-billed runs re-billed from their record with another delay.

Read from the runs' metrics and tags alone (no cluster); how a node is billed in the first place is
:mod:`llmpack.cluster.k8s.billing` (docs/telemetry-and-cost.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from components.errors import InputError


def recorded_price(tags: Mapping[str, str]) -> float | None:
    try:
        return float(tags.get("llmpack.price_per_gpu_hour", ""))
    except ValueError:
        return None


def rebill(runs: list[dict[str, Any]], scale_down_delay_s: float) -> list[dict[str, Any]]:
    """``llmpack report --scale-down-delay-s``: node-billed runs re-billed with another delay, in place.

    Billed seconds are linear in the delay (it is added once per node whose removal was not
    seen), so ``node_gpu_hours`` moves by ``node_tail_gpus x (new - old delay)``; the compute
    part stays, the overhead takes the difference.
    """
    check_scale_down_delay(scale_down_delay_s, "--scale-down-delay-s")
    for run in runs:
        m, tags = run["metrics"], run["tags"]
        if tags.get("llmpack.cost_basis") != "node" or m.get("node_gpu_hours") is None:
            continue
        try:
            old = float(tags.get("llmpack.scale_down_delay_s", ""))
        except ValueError:
            continue
        node_h = m["node_gpu_hours"] + (m.get("node_tail_gpus") or 0.0) * (scale_down_delay_s - old) / 3600.0
        price = recorded_price(tags)
        usd = None if price is None else node_h * price
        if usd is not None and m.get("cost_usd"):
            if m.get("usd_per_1m_tokens") is not None:
                m["usd_per_1m_tokens"] = m["usd_per_1m_tokens"] * usd / m["cost_usd"]
        if m.get("goodput") is not None and node_h > 0:
            m["goodput"] = m["goodput"] * m["node_gpu_hours"] / node_h
        m["node_gpu_hours"] = node_h
        if usd is not None:
            m["cost_usd"] = usd
            if m.get("cost_compute_usd") is not None:
                m["cost_compute_usd"] = min(usd, m["cost_compute_usd"])
                m["cost_overhead_usd"] = usd - m["cost_compute_usd"]
        tags["llmpack.scale_down_delay_s"] = f"{scale_down_delay_s:g}"
    return runs


def check_scale_down_delay(value: Any, flag: str) -> float:
    """Seconds >= 0, finite; else a one-line error naming the flag."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{flag} {value!r}: not a number of seconds") from None
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InputError(f"{flag} {value!r}: must be a finite number of seconds >= 0")
    return seconds
