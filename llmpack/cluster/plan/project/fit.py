"""Per path, what is resampled: every measured node's ready time, and every run's fixed overheads.

No shape is fitted here: the node samples are kept as measured (pooled over the path's gangs of
any size: a node's own ready time does not depend on how many others it waits for), and the
per-run overheads likewise; :mod:`.model` resamples them. Gangs of one path must agree on GPUs
per node unless ``--gpus-per-node`` says what to project.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from components.errors import InputError
from llmpack.cluster.plan.project.data import MeasuredGang

MIN_GANGS = 2  # fewer runs give no spread of the per-run overhead to resample


@dataclass(frozen=True, kw_only=True)
class PathFit:
    """The samples one path's projection resamples, and the medians it reports."""

    path: str
    runs: int
    gang_sizes: tuple[int, ...]
    ready_s: tuple[float, ...]          # per node: pod created -> container started
    billed_s: tuple[float, ...]         # per node: node Ready -> container started (billed spin-up)
    overhead_s: tuple[float, ...]       # per run: submit -> gang pods created
    first_step_s: tuple[float, ...]     # per run: gang ready -> first optimizer step
    train_s: float                      # median per run: first step -> finished
    gpus_per_node: int
    price_per_gpu_hour: float | None
    phases: dict[str, float | None]     # medians of queue / provision / pull / ready, for the table

    @property
    def node_samples(self) -> int:
        return len(self.ready_s)


def _median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def fit_path(path: str, gangs: Sequence[MeasuredGang], *, gpus_per_node: int | None = None,
             price_per_gpu_hour: float | None = None) -> PathFit:
    """The path's samples; one-line :class:`InputError` when there are too few runs to resample."""
    if len(gangs) < MIN_GANGS:
        raise InputError(f"path {path}: {len(gangs)} measured gang run(s), need at least {MIN_GANGS} to resample")
    per_node = {g.gpus_per_node for g in gangs if g.gpus_per_node}
    if gpus_per_node is None:
        if len(per_node) > 1:
            raise InputError(f"path {path}: gangs with {sorted(per_node)} GPUs per node; say --gpus-per-node")
        gpus_per_node = per_node.pop() if per_node else 1
    nodes = [n for g in gangs for n in g.nodes]
    prices = {g.price_per_gpu_hour for g in gangs if g.price_per_gpu_hour is not None}
    price = price_per_gpu_hour if price_per_gpu_hour is not None else (max(prices) if prices else None)
    return PathFit(
        path=path, runs=len(gangs), gang_sizes=tuple(sorted({len(g.nodes) for g in gangs})),
        ready_s=tuple(n.ready_s for n in nodes), billed_s=tuple(n.billed_s for n in nodes),
        overhead_s=tuple(g.overhead_s if g.overhead_s is not None else 0.0 for g in gangs),
        first_step_s=tuple(g.first_step_s if g.first_step_s is not None else 0.0 for g in gangs),
        train_s=_median(g.train_s for g in gangs) or 0.0, gpus_per_node=gpus_per_node, price_per_gpu_hour=price,
        phases={"queue": _median(n.queue_s for n in nodes), "provision": _median(n.provision_s for n in nodes),
                "pull": _median(n.pull_s for n in nodes), "ready": _median(n.ready_s for n in nodes)})


def fit_paths(gangs: Sequence[MeasuredGang], *, gpus_per_node: int | None = None,
              price_per_gpu_hour: float | None = None) -> dict[str, PathFit]:
    """One :class:`PathFit` per path, in the order paths were first seen."""
    by_path: dict[str, list[MeasuredGang]] = {}
    for g in gangs:
        by_path.setdefault(g.path, []).append(g)
    return {p: fit_path(p, mine, gpus_per_node=gpus_per_node, price_per_gpu_hour=price_per_gpu_hour)
            for p, mine in by_path.items()}
