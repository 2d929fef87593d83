"""One option's estimate: spin-up, time to first step and total, p50 and p90 with 95% intervals, and its
cost per run (:mod:`.costs`).

Times (:mod:`.quantiles`): spin-up (submit -> the last node's container started) is the run overhead
plus the max over N nodes of per-node ready (provision + pull), its intervals the wider of a lognormal
and a generalized Pareto tail's posterior; time to first step adds the load; total adds the training
at the planned size (the measured GPU-seconds over the GPUs planned, :func:`training_of`) and the
post-training time (and, on spot, the expected preemption delay). Cost parts are the gang model's
(:func:`llmpack.cluster.plan.project.model.project_path`) at that training time. Too few samples for a
p90 (:func:`llmpack.cluster.plan.project.tail.samples_needed`) give no estimate and say how many more
runs would, never a number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmpack.cluster.plan.phases import OptionSamples
from llmpack.cluster.plan.prices import PriceRow
from llmpack.cluster.plan.project.model import Estimate

QUANTILES = (0.5, 0.9)
HEADLINES = ("spin_up_s", "first_step_s", "total_s")


@dataclass(frozen=True, kw_only=True)
class OptionEstimate:
    """One row of the plan. ``times``: headline -> {"p50", "p90"} -> Estimate (empty: no estimate);
    ``cost``: part -> Estimate (empty: no price or no rate)."""

    samples: OptionSamples
    nodes: int
    gpus: int
    times: dict[str, dict[str, Estimate]] = field(default_factory=dict)
    cost: dict[str, Estimate] = field(default_factory=dict)
    price: PriceRow | None = None
    preemption: dict[str, Any] = field(default_factory=dict)   # rate per node-hour, its source, expected count
    note: str = ""                                             # why there is no estimate or no cost
    train_s: float | None = None                               # training time at the planned size (median)
    training: str = ""                                         # how it was had: the assumption, printed

    @property
    def estimated(self) -> bool:
        return bool(self.times)


def too_few(s: OptionSamples, nodes: int) -> str:
    """Why the samples cannot give a p90, or ""."""
    from llmpack.cluster.plan.project import tail
    from llmpack.cluster.plan.project.fit import MIN_GANGS

    need = tail.samples_needed(max(QUANTILES))
    if len(s.ready_s) < need:
        runs = -(-(need - len(s.ready_s)) // max(1, nodes))
        return f"{len(s.ready_s)} node samples, a p90 needs {need}: measure about {runs} more runs"
    if len(s.overhead_s) < MIN_GANGS:
        return f"{len(s.overhead_s)} run(s) of this path, need {MIN_GANGS}"
    return ""


def hint(s: OptionSamples, nodes: int) -> str:
    """What would give a measurement: the compare command for this path and GPU type."""
    o = s.option
    backend = o.path.split("+")[0]
    fuse = f" --variants {o.path.split('+fuse-')[1]}" if "+fuse-" in o.path else ""
    return (f"llmpack cluster compare --backends {backend}{fuse} --gpu-type {o.gpu_type} "
            f"--nodes {nodes} --repeats 10")


def training_of(s: OptionSamples, *, nodes: int, train_s: float | None, max_steps: int | None) -> Any:
    """The training time at ``nodes`` x the option's GPUs per node (:class:`.quantiles.Training`):
    ``--train-time`` as given; ``--max-steps`` x the measured GPU-seconds per step; else the measured
    runs' GPU-seconds; each over the GPUs planned (throughput per GPU constant: the stated prior)."""
    from llmpack.cluster.plan import quantiles

    gpus = nodes * s.gpus_per_node
    at = "at " + ", ".join(map(str, s.train_nodes)) + " nodes" if s.train_nodes else "measured"
    if train_s is not None:
        return quantiles.fixed_training(train_s, f"training {train_s:,.0f} s as given (--train-time)")
    if max_steps is not None and s.step_gpu_s is not None:
        t = max_steps * s.step_gpu_s / gpus
        return quantiles.fixed_training(t, f"training {t:,.0f} s = {max_steps} steps x {s.step_gpu_s:,.1f} GPU-s per "
                                           f"step ({at}) / {gpus} GPUs: throughput per GPU taken as constant "
                                           "(perfect scaling, a prior, not measured)")
    return quantiles.training(s.train_gpu_s, gpus, measured_at=f"{len(s.train_gpu_s)} runs {at}")


def estimate(s: OptionSamples, *, nodes: int, price: PriceRow | None, spot_rate: tuple[float, str] | None,
             checkpoint_interval_s: float | None, train_s: float | None = None,
             max_steps: int | None = None) -> OptionEstimate:
    """The option's row: times with intervals and cost per run; or a note saying what is missing."""
    from llmpack.cluster.plan import costs, quantiles
    from llmpack.cluster.plan.project import tail
    from llmpack.cluster.plan.project.fit import PathFit
    from llmpack.cluster.plan.project.model import project_path

    gpus = nodes * s.gpus_per_node
    if not s.measured:
        return OptionEstimate(samples=s, nodes=nodes, gpus=gpus,
                              note=f"no measurement of {', '.join(s.missing)}: {hint(s, nodes)}")
    short = too_few(s, nodes)
    if short:
        return OptionEstimate(samples=s, nodes=nodes, gpus=gpus, note=f"too few: {short}")
    training = training_of(s, nodes=nodes, train_s=train_s, max_steps=max_steps)
    train = training.median_s
    fit = PathFit(path=s.option.path, runs=len(s.overhead_s), gang_sizes=(nodes,), ready_s=s.ready_s,
                  billed_s=s.pull_s, overhead_s=s.overhead_s, first_step_s=s.load_s, train_s=train,
                  gpus_per_node=s.gpus_per_node, price_per_gpu_hour=None if price is None else price.per_gpu_hour,
                  phases={})
    row = project_path(fit, [nodes], list(QUANTILES))[0]
    preempt = costs.preemption(s, nodes=nodes, row=row, train_s=train, rate=spot_rate,
                               checkpoint_interval_s=checkpoint_interval_s)
    times = quantiles.gang_times(s.ready_s, s.overhead_s, s.load_s, nodes=nodes, qs=QUANTILES, train=training,
                                 after_s=s.post_s + preempt.get("delay_s", 0.0),
                                 extrapolated=[tail.is_extrapolated(len(s.ready_s), nodes, q) for q in QUANTILES])
    cost, note = costs.cost_per_run(row, s, price=price, preempt=preempt, gpus=gpus)
    return OptionEstimate(samples=s, nodes=nodes, gpus=gpus, times=times, cost=cost, price=price,
                          preemption=preempt, note=note, train_s=train, training=training.assumption)
