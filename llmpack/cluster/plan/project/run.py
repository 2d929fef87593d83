"""The projection end to end, without click: inputs checked, gangs read, fitted, projected, flipped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.errors import InputError
from llmpack.cluster.plan.project import data, fit, flip, model, render


def _gangs(run_groups: Sequence[str], tracking_uri: str | None, pods: str | None, nodes_dump: str | None,
           events: str | None, price_flag: Any) -> list[data.MeasuredGang]:
    if bool(run_groups) == bool(pods):
        raise InputError("say where the measured gangs are: --run-group NAME (MLflow) or --pods FILE (dumps)")
    if (nodes_dump or events) and not pods:
        raise InputError("--nodes-dump/--events: only with --pods")
    if pods:
        return data.from_dumps(pods, nodes_dump, events, price_flag)
    return data.from_mlflow(run_groups, tracking_uri)


def _price(flag: Any) -> float | None:
    if flag is None:
        return None
    from components.record.cost import parse_price

    return parse_price(flag, "--price-per-gpu-hour")


def project(*, run_groups: Sequence[str], tracking_uri: str | None, pods: str | None, nodes_dump: str | None,
            events: str | None, sizes: Sequence[int], gpus_per_node: int | None, quantiles: Sequence[float],
            paths: str | None, runs_per_month: float, control_plane: Sequence[str], train_s: float | None,
            price_flag: Any) -> tuple[dict[str, Any], str]:
    """(the ``--json`` object plus ``_projections`` for the charts, the table and summary text)."""
    from llmpack.report.facts import parse_control_plane

    pair = None
    if paths is not None:
        pair = tuple(p.strip() for p in paths.split(",") if p.strip())
        if len(pair) != 2 or pair[0] == pair[1]:
            raise InputError(f"--paths {paths!r}: two different paths, A,B")
    costs = parse_control_plane(list(control_plane))
    gangs = _gangs(run_groups, tracking_uri, pods, nodes_dump, events, price_flag)
    fits = fit.fit_paths(gangs, gpus_per_node=gpus_per_node, price_per_gpu_hour=_price(price_flag))
    for name in (*(pair or ()), *costs):
        if name not in fits:
            raise InputError(f"path {name!r}: no measured gangs of it (measured: {', '.join(fits)})")
    projections = {name: model.project_path(f, sizes, quantiles, train_s=train_s) for name, f in fits.items()}
    flipped = None
    if pair is not None:
        flipped = flip.flip(projections, (pair[0], pair[1]), runs_per_month=runs_per_month, control_plane=costs)
    result = render.as_json(fits, projections, flipped)
    text = render.table(fits, projections) + "\n\n" + render.wrapped(result["summary"])
    result["_projections"] = projections
    return result, text
