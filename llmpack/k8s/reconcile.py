"""Our GPU-hours and cost beside the orchestrator's own and OpenCost's, and why they differ.

Three accounts of one run's GPUs, each right by its own rule: ours (node billing,
:mod:`llmpack.k8s.billing`), the orchestrator's own (a backend's ``own_metrics``, such as a pod's GPU
request times its run time), and OpenCost's allocation API aggregated by the run's labels
(:data:`AGGREGATE`). :func:`explain` splits the gap between ours and OpenCost's GPU cost exactly
in two: node time no pod held, and the price source. Each account's rule: docs/internals/pod-watcher.md.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlencode, urlsplit

from components.errors import InputError
from llmpack.backends import own_metric_notes, pod_marks, run_id_selectors

RUN_LABEL = "llmpack.io/pipeline-run"


def _aggregate() -> str:
    """OpenCost's ``aggregate``: our run label, then each backend's run-id label for pods that cannot carry ours.

    As Prometheus carries labels (kube_pod_labels): every character but ``[A-Za-z0-9_]`` becomes ``_``.
    """
    labels = (RUN_LABEL, *dict.fromkeys(label for _, label in run_id_selectors()))
    return ",".join("label:" + re.sub(r"[^A-Za-z0-9_]", "_", label) for label in labels)


AGGREGATE = _aggregate()  # "label:llmpack_io_pipeline_run,label:pipeline_runid" with the shipped backends
UNALLOCATED = "__unallocated__"
WINDOW_MARGIN_S = 120.0  # either side of the comparison: OpenCost widens pods to whole resolution steps
METRICS = ("argo_gpu_hours", "opencost_gpu_hours", "opencost_gpu_cost_usd", "opencost_cost_usd")


def check_opencost_url(url: str) -> str:
    """An http(s) URL of OpenCost's API (``http://opencost.opencost:9003``), else one line."""
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"--opencost {url!r}: expected the URL of OpenCost's API, like http://localhost:9003")
    return url.rstrip("/")


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def fetch_allocations(url: str, start: float, end: float, *, timeout_s: float = 15.0) -> dict[str, dict[str, Any]]:
    """OpenCost's allocations over ``[start, end]`` by :data:`AGGREGATE`, the sets of the answer summed per key."""
    import urllib.error
    import urllib.request

    query = urlencode({"window": f"{_rfc3339(math.floor(start))},{_rfc3339(math.ceil(end))}", "aggregate": AGGREGATE,
                       "accumulate": "true"})
    try:
        with urllib.request.urlopen(f"{url}/allocation/compute?{query}", timeout=timeout_s) as resp:  # noqa: S310
            body = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise InputError(f"OpenCost at {url}: HTTP {exc.code} {_message(exc)}") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"OpenCost at {url}: {type(exc).__name__}: {exc}") from None
    sets = body.get("data") if isinstance(body, dict) else None
    if not isinstance(sets, list):
        raise InputError(f"OpenCost at {url}: no 'data' list in the allocation answer")
    out: dict[str, dict[str, Any]] = {}
    try:
        for one in sets:
            for key, alloc in (one if isinstance(one, dict) else {}).items():
                if isinstance(alloc, dict):
                    have = out.setdefault(key, {"gpuHours": 0.0, "gpuCost": 0.0, "totalCost": 0.0})
                    for field in have:
                        have[field] += float(alloc.get(field) or 0.0)
    except (TypeError, ValueError) as exc:  # a figure that is no number: a warning on the runs, never a traceback
        raise InputError(f"OpenCost at {url}: an allocation figure is not a number ({exc})") from None
    return out


def _message(exc: Any) -> str:
    try:
        return str(json.loads(exc.read().decode("utf-8")).get("message", ""))[:200]
    except Exception:  # noqa: BLE001 - the status says enough
        return ""


def run_allocation(allocs: Mapping[str, Mapping[str, float]], pipeline_run: str,
                   run_ids: Iterable[str] = ()) -> dict[str, float] | None:
    """The run's share of :func:`fetch_allocations`: keys whose first label is the run, or whose
    others hold one of its orchestrator's own run ids (each pod is under one key: counted once)."""
    own = set(run_ids) - {"", UNALLOCATED}
    total: dict[str, float] | None = None
    for key, alloc in allocs.items():
        ours, *theirs = key.split("/")
        if ours == pipeline_run or own.intersection(theirs):
            total = total or {"gpuHours": 0.0, "gpuCost": 0.0, "totalCost": 0.0}
            for field in total:
                total[field] += float(alloc.get(field) or 0.0)
    return total


def _own_run_ids(run: Mapping[str, Any]) -> set[str]:
    """The orchestrator's own run ids on a run's pods, when its pods cannot carry our run label."""
    if not pod_marks(run.get("orchestrator")).unlabelled_selector:
        return set()
    return {p.get("orchestrator_run") or "" for p in run.get("pods") or ()}


def opencost_reconcile(url: str, runs: list[dict[str, Any]]) -> None:
    """OpenCost's figures into each run's metrics, in place; a failed read is a warning on every run.

    One window from the first submission to the last run's end, :data:`WINDOW_MARGIN_S` either side.
    """
    starts = [r["submitted_at"] for r in runs if r.get("submitted_at")]
    if not starts:
        return
    ends = [r.get("finished_at") or r["submitted_at"] for r in runs if r.get("submitted_at")]
    try:
        allocs = fetch_allocations(url, min(starts) - WINDOW_MARGIN_S, max(ends) + WINDOW_MARGIN_S)
    except InputError as exc:
        for run in runs:
            run.setdefault("warnings", []).append(str(exc))
        return
    for run in runs:
        alloc = run_allocation(allocs, run["pipeline_run"], _own_run_ids(run))
        if alloc is None:
            run.setdefault("warnings", []).append(f"OpenCost at {url}: no allocation for run {run['pipeline_run']}")
            continue
        run.setdefault("metrics", {}).update({"opencost_gpu_hours": alloc["gpuHours"],
                                              "opencost_gpu_cost_usd": alloc["gpuCost"],
                                              "opencost_cost_usd": alloc["totalCost"]})


def log_opencost(uri: str, runs: list[dict[str, Any]]) -> None:
    """OpenCost's figures into each run's MLflow record too (a rebuilt report shows them); best effort."""
    from mlflow.entities import Metric

    from components.record import tracking

    stamp = int(time.time() * 1000)
    for run in runs:
        m, run_id = run.get("metrics") or {}, (run.get("artifacts") or {}).get("mlflow_run_id")
        values = [Metric(k, float(m[k]), stamp, 0) for k in METRICS[1:] if m.get(k) is not None]
        if not values or run_id is None:
            continue
        try:
            tracking.client(uri).log_batch(run_id, metrics=values)
        except Exception as exc:  # noqa: BLE001 - the result still carries the figures
            run.setdefault("warnings", []).append(f"MLflow: OpenCost figures not logged ({type(exc).__name__})")


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
