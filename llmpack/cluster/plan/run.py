"""The plan end to end, without click: history read, options built, estimated, priced, chosen."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from llmpack.cluster.plan import choice, costs, estimate, history, phases, prices, render
from llmpack.cluster.plan.history import RunSample

DEFAULT_GPU_TYPE = "nvidia-h100-80gb"  # the pipeline spec's GPU when nothing else names one


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    """What the plan was asked (every flag, parsed)."""

    paths: tuple[str, ...] | None = None
    gpu_types: tuple[str, ...] | None = None
    capacities: tuple[str, ...] = history.CAPACITIES
    nodes: int = 2
    gpus_per_node: int | None = None
    objective: choice.Objective = "cost"
    deadline_s: float | None = None
    max_cost: float | None = None
    spot_interruptions_per_hour: float | None = None
    checkpoint_interval_s: float | None = None
    price_file: str | None = None
    price_flag: Any = None
    provider: str | None = None
    stale_days: int = prices.STALE_DAYS
    train_s: float | None = None
    max_steps: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True, kw_only=True)
class Plan:
    rows: list[estimate.OptionEstimate]
    choice: choice.Choice
    inputs: PlanInputs
    runs: int

    def as_json(self) -> dict[str, Any]:
        return {**render.as_json(self.rows, self.choice, self.inputs.as_json()), "history_runs": self.runs}

    def text(self) -> str:
        context = [f"history: {self.runs} measured gang runs" if self.runs else
                   "history: none (no measured gang run in the tracking store)"]
        return render.table(self.rows, self.choice, context)


def plan(samples: Sequence[RunSample], inputs: PlanInputs, *, today: dt.date | None = None) -> Plan:
    """Every option asked, estimated from ``samples``; the chosen one."""
    today = today or dt.datetime.now(dt.timezone.utc).date()
    from llmpack.backends import ORCHESTRATORS

    paths = inputs.paths or (None if samples else ORCHESTRATORS)  # no history: every cluster path
    gpus = inputs.gpu_types or (None if samples else (DEFAULT_GPU_TYPE,))
    rows = []
    for option in phases.options(samples, paths, gpus, inputs.capacities):
        s = phases.option_samples(samples, option)
        if inputs.gpus_per_node is not None:
            s = replace(s, gpus_per_node=inputs.gpus_per_node)
        price = prices.price_of(option.gpu_type, option.capacity, flag=inputs.price_flag, price_file=inputs.price_file,
                                provider=inputs.provider, today=today, stale_days=inputs.stale_days)
        rate = ((inputs.spot_interruptions_per_hour, "--spot-interruptions-per-hour")
                if inputs.spot_interruptions_per_hour is not None else costs.measured_rate(s))
        train_s = inputs.train_s
        if train_s is None and inputs.max_steps is not None and s.step_s is not None:
            train_s = s.step_s * inputs.max_steps  # the step count x the measured time per step
        row = estimate.estimate(s, nodes=inputs.nodes, price=price, spot_rate=rate,
                                checkpoint_interval_s=inputs.checkpoint_interval_s, train_s=train_s)
        if inputs.max_steps is not None and s.step_s is None and row.estimated:
            row = replace(row, note="; ".join(n for n in (row.note, "--max-steps: the runs record no max_steps, "
                                                          "training time as measured") if n))
        rows.append(row)
    chosen = choice.choose(rows, objective=inputs.objective, deadline_s=inputs.deadline_s, max_cost=inputs.max_cost)
    return Plan(rows=rows, choice=chosen, inputs=inputs, runs=len(samples))


def read_history(run_groups: Sequence[str], tracking_uri: str | None, progress: history.Progress | None,
                 dumps: tuple[str | None, str | None, str | None] = (None, None, None)) -> list[RunSample]:
    """kubectl dumps (``dumps``: pods, nodes, events), or the named run groups, or every group in the
    store when neither is named."""
    pods, nodes, events = dumps
    if (nodes or events) and not pods:
        from components.errors import InputError

        raise InputError("--nodes-dump/--events: only with --pods")
    if pods:
        if run_groups:
            from components.errors import InputError

            raise InputError("--pods: not with --run-group (one history: dumps or MLflow)")
        return history.from_dumps(pods, nodes, events, progress)
    if run_groups:
        return history.from_mlflow(run_groups, tracking_uri, progress)
    groups = history.all_groups(tracking_uri)
    if progress:
        progress(f"reading the whole history: {len(groups)} run groups")
    return history.from_mlflow(groups, tracking_uri, progress, strict=False)
