"""Our GPU-hours and cost beside the orchestrator's own and OpenCost's, and why they differ.

Three accounts of one run's GPUs, each right by its own rule: ours (node billing,
:mod:`llmpack.cluster.k8s.billing`), the orchestrator's own (a backend's ``own_metrics``, such as a pod's GPU
request times its run time), and OpenCost's allocation API aggregated by the run's labels
(:data:`AGGREGATE`). :func:`llmpack.report.accounts.explain` splits the gap between ours and OpenCost's GPU cost exactly
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
from components.labels import PIPELINE_RUN_LABEL
from llmpack.backends import pod_marks, run_id_selectors
from llmpack.report.accounts import METRICS

RUN_LABEL = PIPELINE_RUN_LABEL


def _aggregate() -> str:
    """OpenCost's ``aggregate``: our run label, then each backend's run-id label for pods that cannot carry ours.

    As Prometheus carries labels (kube_pod_labels): every character but ``[A-Za-z0-9_]`` becomes ``_``.
    """
    labels = (RUN_LABEL, *dict.fromkeys(label for _, label in run_id_selectors()))
    return ",".join("label:" + re.sub(r"[^A-Za-z0-9_]", "_", label) for label in labels)


AGGREGATE = _aggregate()  # "label:llmpack_io_pipeline_run,label:pipeline_runid" with the shipped backends
UNALLOCATED = "__unallocated__"
WINDOW_MARGIN_S = 120.0  # either side of the comparison: OpenCost widens pods to whole resolution steps


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
