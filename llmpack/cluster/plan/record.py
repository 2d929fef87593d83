"""The estimate on the run: ``submit --plan FILE`` and ``compare --cluster --plan FILE`` read the plan
``llmpack plan --out`` (or ``--json``) wrote, take the row of the path and GPU type being run, refuse
(one line, exit 2, nothing submitted) when ``--max-cost`` is below the row's cost upper bound, and
after submitting put the row on the run's record as ``llmpack.plan.*`` tags: the report compares them
with what the run measured (:mod:`llmpack.report.estimate`), ``llmpack plan --calibration`` counts them.

A tag holds ``value,low,high`` (seconds or USD); the headline keys are
:data:`llmpack.cluster.plan.estimate.HEADLINES` and ``cost_usd``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from components.errors import InputError
from llmpack.report.estimate import PREFIX, parse_triple  # noqa: F401 - the tag format, read back by the report

HEADLINES = ("spin_up_s", "first_step_s", "total_s")
QUANTILES = ("p50", "p90")


def load(path: str) -> dict[str, Any]:
    """The plan JSON at ``path``; one line when it is unreadable or not a plan."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"--plan {path}: cannot read it ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(f"--plan {path}: not JSON; write one with llmpack plan --out DIR (its plan.json)") from None
    if not isinstance(data, dict) or not isinstance(data.get("options"), list):
        raise InputError(f"--plan {path}: not a plan (no 'options' list); write one with llmpack plan --out DIR")
    return data


def row_for(plan: Mapping[str, Any], path: str, gpu_type: str | None, where: str = "--plan") -> dict[str, Any]:
    """The estimated row of ``path`` (and ``gpu_type`` when given): the plan's chosen one among them,
    else the first on-demand, else the first; one line when the plan has none."""
    rows = [r for r in plan["options"] if isinstance(r, dict) and r.get("path") == path and r.get("estimated")
            and (gpu_type is None or r.get("gpu_type") == gpu_type)]
    if not rows:
        gpu = f" on {gpu_type}" if gpu_type else ""
        raise InputError(f"{where}: the plan has no estimate for {path}{gpu}; plan it first (llmpack plan --paths "
                         f"{path}{' --gpu-type ' + gpu_type if gpu_type else ''} --out DIR)")
    return next((r for r in rows if r.get("chosen")), None) or next(
        (r for r in rows if r.get("capacity") == "on-demand"), rows[0])


def check_max_cost(row: Mapping[str, Any], max_cost: float | None) -> None:
    """Refuse, in one line, a run whose estimated cost may exceed ``max_cost``."""
    if max_cost is None:
        return
    cost = (row.get("cost_usd") or {}).get("total")
    label = f"{row['path']} {row['gpu_type']} {row['capacity']}"
    if not cost:
        raise InputError(f"--max-cost {max_cost:g}: the plan has no cost for {label} (no price); not submitted")
    high = float(cost["ci"][1])
    if high > max_cost:
        raise InputError(f"--max-cost {max_cost:g}: the estimate for {label} is up to ${high:.2f} a run "
                         f"(${float(cost['value']):.2f}, 95% interval upper bound); not submitted")


def _triple(e: Mapping[str, Any]) -> str:
    return f"{float(e['value']):.4g},{float(e['ci'][0]):.4g},{float(e['ci'][1]):.4g}"


def tags_of_row(row: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, str]:
    """The row as ``llmpack.plan.*`` tags."""
    tags = {f"{PREFIX}option": f"{row['path']} {row['gpu_type']} {row['capacity']}",
            f"{PREFIX}nodes": str(row.get("nodes")), f"{PREFIX}history_runs": str(plan.get("history_runs", "")),
            f"{PREFIX}chosen": str(bool(row.get("chosen"))).lower()}
    for h in HEADLINES:
        for q in QUANTILES:
            e = (row.get("times_s") or {}).get(h, {}).get(q)
            if e:
                tags[f"{PREFIX}{h}.{q}"] = _triple(e)
    total = (row.get("cost_usd") or {}).get("total")
    if total:
        tags[f"{PREFIX}cost_usd"] = _triple(total)
    if row.get("borrowed"):
        tags[f"{PREFIX}borrowed"] = ",".join(sorted(row["borrowed"]))
    return tags


def set_on_record(tracking_uri: str | None, run_id: str, tags: Mapping[str, str]) -> None:
    """The tags on the run's MLflow record."""
    from components.record import tracking

    tracking.set_tags(tracking.client(tracking_uri), run_id, dict(tags))


def options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--plan FILE`` and ``--max-cost USD`` (submit, compare --cluster)."""
    func = click.option("--max-cost", type=click.FloatRange(min=0, min_open=True), default=None, metavar="USD",
                        help="With --plan: refuse to submit when the estimate's cost upper bound exceeds this.")(func)
    return click.option("--plan", "plan_file", default=None, metavar="FILE",
                        help="A plan.json of `llmpack plan --out`: record its estimate on the run (and "
                             "check --max-cost).")(func)


def before_submit(plan_file: str | None, max_cost: float | None, path: str,
                  gpu_type: str | None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(plan, row) for the run about to be submitted, refused here by --max-cost; None without --plan."""
    if plan_file is None:
        if max_cost is not None:
            raise InputError("--max-cost: only with --plan FILE (the estimate it is checked against)")
        return None
    plan = load(plan_file)
    row = row_for(plan, path, gpu_type)
    check_max_cost(row, max_cost)
    return plan, row


def after_submit(planned: tuple[dict[str, Any], dict[str, Any]] | None, summary: Mapping[str, Any]) -> None:
    """The estimate on the submitted run's record (when it has one: a tracking store was given)."""
    if planned is None or not summary.get("mlflow_run_id"):
        return
    set_on_record(summary.get("tracking_uri"), str(summary["mlflow_run_id"]), tags_of_row(planned[1], planned[0]))


def before_compare(plan_file: str | None, max_cost: float | None, *, labels: list[str], gpu_type: str | None,
                   cluster: bool) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """compare --cluster --plan: each path label's (plan, row), every one checked against --max-cost
    before the first run is submitted; {} without --plan."""
    if plan_file is None:
        if max_cost is not None:
            raise InputError("--max-cost: only with --plan FILE (the estimate it is checked against)")
        return {}
    if not cluster:
        raise InputError("--plan: only with --cluster (a local run has no cluster estimate)")
    plan = load(plan_file)
    planned = {}
    for label in labels:
        row = row_for(plan, label, gpu_type)
        check_max_cost(row, max_cost)
        planned[label] = (plan, row)
    return planned


def after_compare(planned: Mapping[str, tuple[dict[str, Any], dict[str, Any]]], result: dict[str, Any]) -> None:
    """Each run's estimate on its record, in MLflow and in ``result`` (the report written next reads it)."""
    from components.fusion import path_label

    for run in result.get("runs", []):
        label = path_label(str(run.get("orchestrator")), str(run.get("fuse") or "none"))
        if label not in planned:
            continue
        tags = tags_of_row(planned[label][1], planned[label][0])
        run.setdefault("tags", {}).update(tags)
        artifacts = run.get("artifacts") or {}
        if artifacts.get("mlflow_run_id"):
            set_on_record(artifacts.get("tracking_uri"), str(artifacts["mlflow_run_id"]), tags)
