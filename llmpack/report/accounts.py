"""The three accounts of a run's GPUs side by side, from its record: ours, the orchestrator's own, OpenCost's.

Read from the run's metrics and tags alone (no cluster): the report's and the terminal's "beside ours"
rows and the sentences that say why they differ. :mod:`llmpack.cluster.k8s.reconcile` reads OpenCost
into those metrics during a cluster compare; each account's rule: docs/internals/pod-watcher.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from llmpack.backends import own_metric_notes

METRICS = ("argo_gpu_hours", "opencost_gpu_hours", "opencost_gpu_cost_usd", "opencost_cost_usd")


def ours(run: Mapping[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(GPU-hours, cost, price per GPU-hour) as we bill the run: node-billed where it was, else container."""
    m, tags = run.get("metrics") or {}, run.get("tags") or {}
    hours = m.get("node_gpu_hours") if tags.get("llmpack.cost_basis") == "node" else None
    hours = m.get("gpu_hours") if hours is None else hours
    try:
        price = float(tags.get("llmpack.price_per_gpu_hour", ""))
    except ValueError:
        price = None
    return hours, m.get("cost_usd"), price


def has_reconcile(runs: Iterable[Mapping[str, Any]]) -> bool:
    return any((r.get("metrics") or {}).get(k) is not None for r in runs for k in METRICS)


def explain(run: Mapping[str, Any]) -> list[str]:
    """Why our figures and Argo's / OpenCost's differ, one sentence each (empty when neither was read)."""
    m, tags = run.get("metrics") or {}, run.get("tags") or {}
    hours, usd, price = ours(run)
    out = []
    capacity = tags.get("llmpack.capacity_type")
    if capacity:
        column = tags.get("llmpack.price_column", "")
        note = " (no spot price in the table: priced on-demand)" if capacity == "spot" and column == "on-demand" else ""
        if column == "flag":  # --price-per-gpu-hour: the price whatever the node
            out.append(f"our price {_usd(price)}/GPU-h: given by --price-per-gpu-hour ({capacity} node)")
        else:
            out.append(f"our price {_usd(price)}/GPU-h: {capacity} node, {column} price of "
                       f"{tags.get('llmpack.price_source', '?')}{note}")
    container_h = m.get("gpu_hours")
    out += own_metric_notes(m)  # each backend's own account beside ours (Argo's GPU-hours)
    their_h, their_usd = m.get("opencost_gpu_hours"), m.get("opencost_gpu_cost_usd")
    opencost = their_h is not None and their_usd is not None
    if (not opencost and tags.get("llmpack.cost_basis") == "node" and hours is not None and container_h is not None
            and hours > container_h):  # OpenCost's sentence says this where it was read
        out.append(f"our {hours:.3f} GPU-h bills the GPU nodes (every GPU from the node's start to its removal or "
                   f"the scale-down delay), not only the {container_h:.3f} GPU-h our pods' containers held")
    if opencost and hours is not None and usd is not None and price is not None:
        their_price = their_usd / their_h if their_h > 0 else None
        node_part = (hours - their_h) * price
        price_part = their_h * (price - their_price) if their_price is not None else 0.0
        out.append(f"OpenCost bills pods ({their_h:.3f} GPU-h at {_usd(their_price)}/GPU-h = {_usd(their_usd)}); "
                   f"we bill nodes ({hours:.3f} GPU-h = {_usd(usd)}): {_usd(usd - their_usd, sign=True)} = "
                   f"{_usd(node_part, sign=True)} node time no pod held (provisioning, idle GPUs, scale-down tail) "
                   f"{_usd(price_part, sign=True)} price (ours {_usd(price)} vs OpenCost's {_usd(their_price)}/GPU-h)")
        if m.get("opencost_cost_usd") is not None and m["opencost_cost_usd"] > their_usd:
            out.append(f"OpenCost's total {_usd(m['opencost_cost_usd'])} adds CPU and memory, which we do not bill")
    return out


def _usd(value: float | None, *, sign: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "?"
    return f"{'-' if value < 0 else '+' if sign else ''}${abs(value):,.2f}"


def rows(runs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per run that has Argo's or OpenCost's figures: label, ours, Argo's, OpenCost's."""
    from components.fusion import path_label

    out = []
    for run in runs:
        m = run.get("metrics") or {}
        if not any(m.get(k) is not None for k in METRICS):
            continue
        hours, usd, _ = ours(run)
        label = path_label(str(run.get("orchestrator") or "?"), str(run.get("fuse") or "none"))
        out.append({"label": label, "pipeline_run": run.get("pipeline_run"), "ours_gpu_hours": hours, "ours_usd": usd,
                    "basis": (run.get("tags") or {}).get("llmpack.cost_basis", "container"),
                    "argo_gpu_hours": m.get("argo_gpu_hours"), "opencost_gpu_hours": m.get("opencost_gpu_hours"),
                    "opencost_gpu_cost_usd": m.get("opencost_gpu_cost_usd"),
                    "opencost_cost_usd": m.get("opencost_cost_usd"),
                    "why": explain(run)})
    return out
