"""The phase model: which measured samples an option (path x GPU type x capacity) is estimated from,
and which of them it borrows.

A run's start-up is split into phases by what they depend on: overhead (the path), provision (the
GPU type and capacity), pull and load (neither), train (the GPU type), post and other (the path);
their spans and the order of sources each borrows from: docs/plan.md, 'The model'.

Each phase takes the option's own runs first (same path and GPU type; for ``provision`` the same
capacity too), then the sources :data:`BORROW` lists, in order; a phase taken from anything but the
option's own runs is *borrowed* and the option says from where. Per-node ``provision`` and ``pull``
stay one node's pair when both are the option's own; borrowed, they are paired by a seeded shuffle
(independent phases). An option whose GPU-dependent phases have no run of that GPU type, or whose
path was never measured, has no estimate: :attr:`OptionSamples.missing` says which.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llmpack.cluster.plan.history import ON_DEMAND, SPOT, RunSample

PHASES = ("overhead", "provision", "pull", "load", "train", "post", "other")
SEED = 20261205


@dataclass(frozen=True, kw_only=True)
class Option:
    """One row of the plan: a path on a GPU type at a capacity."""

    path: str
    gpu_type: str
    capacity: str

    @property
    def label(self) -> str:
        return f"{self.path} {self.gpu_type} {self.capacity}"


Match = Callable[[RunSample, Option], bool]


def _own(s: RunSample, o: Option) -> bool:
    return s.path == o.path and s.gpu_type == o.gpu_type


def _own_capacity(s: RunSample, o: Option) -> bool:
    return _own(s, o) and s.capacity == o.capacity


def _gpu_capacity(s: RunSample, o: Option) -> bool:
    return s.gpu_type == o.gpu_type and s.capacity == o.capacity


def _gpu(s: RunSample, o: Option) -> bool:
    return s.gpu_type == o.gpu_type


def _path(s: RunSample, o: Option) -> bool:
    return s.path == o.path


def _any(_s: RunSample, _o: Option) -> bool:
    return True


# Per phase: (own, then the borrowed sources in order). GPU-dependent phases never leave the GPU type.
BORROW: dict[str, tuple[Match, ...]] = {
    "overhead": (_own, _path),
    "provision": (_own_capacity, _gpu_capacity, _own, _gpu),
    "pull": (_own, _path, _any),
    "load": (_own, _path, _any),
    "train": (_own, _gpu),
    "post": (_own, _path),
    "other": (_own, _path),
}


@dataclass(frozen=True, kw_only=True)
class OptionSamples:
    """What one option's estimate resamples; ``borrowed``: phase -> where it came from."""

    option: Option
    ready_s: tuple[float, ...] = ()      # per node: provision + pull
    pull_s: tuple[float, ...] = ()       # per node: node Ready -> started (billed spin-up)
    overhead_s: tuple[float, ...] = ()
    load_s: tuple[float, ...] = ()
    train_s: float = 0.0                 # median
    post_s: float = 0.0                  # median
    step_s: float | None = None          # median training seconds per optimizer step (runs with max_steps)
    other_gpu_h: tuple[float, ...] = ()  # per run: billed GPU-hours outside the gang (none: not measured)
    gpus_per_node: int = 1
    runs: int = 0                        # the option's own runs
    borrowed: dict[str, str] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    assumed: tuple[str, ...] = ()        # phases measured nowhere, taken as 0 s (load, from kubectl dumps)
    preemptions: int = 0                 # on this GPU type's spot runs
    spot_gang_hours: float = 0.0

    @property
    def measured(self) -> bool:
        return not self.missing


def _describe(found: Sequence[RunSample], o: Option, phase: str) -> str:
    """"argo, nvidia-h200 (12 runs)": the paths, GPU types (and for provision capacities) a borrowed
    phase came from, where they differ from the option's."""
    parts = []
    for have, mine in ((sorted({s.path for s in found}), o.path), (sorted({s.gpu_type for s in found}), o.gpu_type),
                       (sorted({s.capacity for s in found}) if phase == "provision" else [o.capacity], o.capacity)):
        if have != [mine]:
            parts.append("+".join(have))
    return f"{', '.join(parts) or 'own'} ({len(found)} runs)"


def _pick(samples: Sequence[RunSample], o: Option, phase: str,
          has: Callable[[RunSample], bool]) -> tuple[list[RunSample], str | None]:
    """The runs a phase is taken from and None (own), or a description (borrowed); ([], None): none."""
    for k, match in enumerate(BORROW[phase]):
        found = [s for s in samples if match(s, o) and has(s)]
        if found:
            return found, None if k == 0 else _describe(found, o, phase)
    return [], None


def _values(found: Sequence[RunSample], get: Callable[[RunSample], float | None]) -> tuple[float, ...]:
    return tuple(v for v in (get(s) for s in found) if v is not None)


def _median_or_none(values: tuple[float, ...]) -> float | None:
    return statistics.median(values) if values else None


def option_samples(samples: Sequence[RunSample], option: Option) -> OptionSamples:
    """The option's samples, each phase its own or borrowed (:data:`BORROW`), or what is missing."""
    picked: dict[str, list[RunSample]] = {}
    borrowed: dict[str, str] = {}
    has = {"overhead": lambda s: s.overhead_s is not None, "provision": lambda s: bool(s.nodes),
           "pull": lambda s: bool(s.nodes), "load": lambda s: s.load_s is not None,
           "train": lambda s: s.train_s is not None, "post": lambda s: s.post_s is not None,
           "other": lambda s: s.other_gpu_h is not None}
    for phase in PHASES:
        found, source = _pick(samples, option, phase, has[phase])
        picked[phase] = found
        if source is not None:
            borrowed[phase] = source
    missing = tuple(p for p in ("overhead", "provision", "train") if not picked[p])
    own_runs = sum(1 for s in samples if _own_capacity(s, option))
    spot = [s for s in samples if s.gpu_type == option.gpu_type and s.capacity == SPOT]
    if missing:
        return OptionSamples(option=option, missing=missing, runs=own_runs, borrowed=borrowed)
    prov_nodes = [n for s in picked["provision"] for n in s.nodes]
    pull_nodes = [n for s in picked["pull"] for n in s.nodes]
    if "provision" not in borrowed and "pull" not in borrowed:
        ready = tuple(n.provision_s + n.pull_s for n in prov_nodes)  # each node's own pair, as measured
        pulls = tuple(n.pull_s for n in prov_nodes)
    else:
        rng = random.Random(SEED)
        pulls = tuple(rng.choice(pull_nodes).pull_s for _ in prov_nodes)
        ready = tuple(n.provision_s + p for n, p in zip(prov_nodes, pulls, strict=True))
    assumed = () if picked["load"] else ("load",)  # kubectl dumps hold no first step: taken as 0 s, and said
    per_node = {s.gpus_per_node for s in picked["provision"]}
    overhead = _values(picked["overhead"], lambda s: s.overhead_s)
    load = _values(picked["load"], lambda s: s.load_s) or (0.0,)
    if len(load) != len(overhead):  # the gang model resamples them as one run's pair: a seeded draw per run
        rng = random.Random(SEED + 1)
        load = tuple(rng.choice(load) for _ in overhead)
    return OptionSamples(
        option=option, ready_s=ready, pull_s=pulls, overhead_s=overhead, load_s=load,
        train_s=statistics.median(_values(picked["train"], lambda s: s.train_s)),
        post_s=statistics.median(_values(picked["post"], lambda s: s.post_s)) if picked["post"] else 0.0,
        other_gpu_h=_values(picked["other"], lambda s: s.other_gpu_h),
        step_s=_median_or_none(_values(picked["train"],
                                       lambda s: s.train_s / s.steps if s.train_s and s.steps else None)),
        gpus_per_node=max(per_node) if per_node else 1, runs=own_runs, borrowed=borrowed, assumed=assumed,
        preemptions=sum(s.preemptions for s in spot), spot_gang_hours=sum(s.gang_hours for s in spot))


def options(samples: Sequence[RunSample], paths: Sequence[str] | None, gpu_types: Sequence[str] | None,
            capacities: Sequence[str] = (ON_DEMAND, SPOT)) -> list[Option]:
    """Every path x GPU type x capacity asked (default: those in the history), in a stable order."""
    seen_paths = list(dict.fromkeys(s.path for s in samples))
    seen_gpus = list(dict.fromkeys(s.gpu_type for s in samples))
    return [Option(path=p, gpu_type=g, capacity=c) for p in (paths or seen_paths) for g in (gpu_types or seen_gpus)
            for c in capacities]
