"""The user's measured history in: one :class:`RunSample` per succeeded gang run of the run groups.

The runs are the pipeline records ``llmpack report`` and ``llmpack project`` read
(:func:`llmpack.report.facts.runs_from_mlflow`, the finetune gang's per-node events by
:func:`llmpack.cluster.plan.project.data.gang_of_run`); a run keeps its phases apart so that :mod:`.phases`
can borrow the ones that do not depend on the GPU. Only gang runs (``--nodes`` 2 or more) carry
per-node events, so only they are history here (docs/plan.md says so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.errors import InputError

ON_DEMAND, SPOT = "on-demand", "spot"
CAPACITIES = (ON_DEMAND, SPOT)


@dataclass(frozen=True, kw_only=True)
class NodePhases:
    """One gang node: pod created -> its node Ready (GPU-dependent), node Ready -> container started
    (pull and start: the same image on any GPU)."""

    provision_s: float
    pull_s: float


@dataclass(frozen=True, kw_only=True)
class RunSample:
    """One measured run, as the plan uses it (None: not recorded)."""

    run: str
    path: str
    gpu_type: str
    capacity: str                       # ON_DEMAND or SPOT (the node's capacity type tag)
    nodes: tuple[NodePhases, ...]
    overhead_s: float | None            # submit -> gang pods created (the orchestrator's part)
    load_s: float | None                # gang ready -> first optimizer step (model load)
    train_s: float | None               # first step -> training finished
    post_s: float | None                # training finished -> run finished (evaluate, register)
    gpus_per_node: int
    preemptions: int                    # preempted attempts of the run
    other_gpu_h: float | None = None    # billed GPU node-hours of the run outside the finetune gang
    steps: int | None = None            # the run's max_steps parameter (training time per step)
    price_per_gpu_hour: float | None
    actual: dict[str, float | None] = field(default_factory=dict)  # the headlines, for calibration
    planned: dict[str, str] = field(default_factory=dict)          # llmpack.plan.* tags, if planned

    @property
    def gang_hours(self) -> float:
        """Node-hours the run held its gang (for a preemption rate per node-hour)."""
        span = (self.load_s or 0.0) + (self.train_s or 0.0)
        return len(self.nodes) * span / 3600.0


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def path_label(run: Mapping[str, Any]) -> str:
    """The path as ``compare`` labels it: the orchestrator, ``+fuse-<mode>`` when its steps were fused."""
    from components.fusion import FUSE_TAG

    orch = str(run.get("orchestrator") or "unknown")
    fuse = (run.get("tags") or {}).get(FUSE_TAG)
    return orch if fuse in (None, "", "none") else f"{orch}+fuse-{fuse}"


def sample_of_run(run: Mapping[str, Any]) -> RunSample | None:
    """The run's sample, or None when it holds no measured gang (failed, or one node)."""
    from llmpack.cluster.plan.project.data import gang_of_run

    gang = gang_of_run(run)
    if gang is None:
        return None
    tags = run.get("tags") or {}
    metrics = run.get("metrics") or {}
    nodes = tuple(NodePhases(provision_s=n.provision_s if n.provision_s is not None else n.ready_s,
                             pull_s=max(0.0, n.ready_s - (n.provision_s if n.provision_s is not None else n.ready_s)))
                  for n in gang.nodes)
    first = _float(metrics.get("time_to_first_step_s"))
    total = _float(metrics.get("total_s"))
    train = gang.train_s
    post = None if first is None or total is None or train is None else max(0.0, total - first - train)
    preempted = [a for a in str(tags.get("llmpack.preempted_attempts", "")).split(",") if a]
    other = other_gpu_hours(run, gang.gpus_per_node or 1)
    capacity = SPOT if tags.get("llmpack.capacity_type") == SPOT else ON_DEMAND
    return RunSample(
        run=gang.run, path=path_label(run), gpu_type=str(tags.get("llmpack.gpu_type") or "unknown"),
        capacity=capacity, nodes=nodes, overhead_s=gang.overhead_s, load_s=gang.first_step_s, train_s=train,
        post_s=post, gpus_per_node=gang.gpus_per_node or 1, preemptions=len(preempted), other_gpu_h=other,
        price_per_gpu_hour=gang.price_per_gpu_hour,
        actual={"spin_up_s": _float(metrics.get("gang_ready_s")), "first_step_s": first, "total_s": total,
                "cost_usd": _float(metrics.get("cost_usd"))},
        planned={k: str(v) for k, v in tags.items() if k.startswith("llmpack.plan.")},
        steps=_steps((run.get("params") or {}).get("max_steps")))


def _steps(value: Any) -> int | None:
    try:
        steps = int(str(value))
    except (TypeError, ValueError):
        return None
    return steps if steps > 0 else None


def other_gpu_hours(run: Mapping[str, Any], gpus_per_node: int) -> float | None:
    """The run's billed GPU node-hours (``node_gpu_hours``) less its finetune gang's, as the gang model bills
    them (each node from Ready to finetune finished, plus the scale-down delay): the GPU time of the
    pipeline's other GPU pods (evaluate's node, the MLflow Job's pod). None without a node bill."""
    billed = _float((run.get("metrics") or {}).get("node_gpu_hours"))
    ev = (run.get("events") or {}).get("finetune") or {}
    finished = _float(ev.get("finished"))
    if billed is None or finished is None:
        return None
    delay = _float((run.get("tags") or {}).get("llmpack.scale_down_delay_s"))
    if delay is None:
        from components.record.cost import DEFAULT_SCALE_DOWN_DELAY_S

        delay = DEFAULT_SCALE_DOWN_DELAY_S
    readies = [float(v) for k, v in ev.items() if k.startswith("node_ready.node")]
    gang = sum(gpus_per_node * (finished - r + delay) for r in readies) / 3600.0
    return max(0.0, billed - gang)


def samples_of_runs(runs: Iterable[Mapping[str, Any]]) -> list[RunSample]:
    return [s for s in (sample_of_run(r) for r in runs) if s is not None]


Progress = Callable[[str], None]


def from_mlflow(run_groups: Sequence[str], tracking_uri: str | None, progress: Progress | None = None,
                *, strict: bool = True) -> list[RunSample]:
    """Every measured gang run of the run groups, a progress line per group (and every 20 runs);
    ``strict``: a group without one is refused (one line) rather than skipped."""
    from components.record import tracking
    from llmpack.report.facts import runs_from_mlflow

    say = progress or (lambda _text: None)
    mc = tracking.client(tracking_uri)
    out: list[RunSample] = []
    for group in run_groups:
        say(f"reading run group {group}")
        runs = runs_from_mlflow(mc, group)
        found = []
        for i, run in enumerate(runs, 1):
            sample = sample_of_run(with_run_details(mc, run) if run.get("status") == "succeeded" else run)
            if sample is not None:
                found.append(sample)
            if i % 20 == 0:
                say(f"  {group}: {i} of {len(runs)} runs read")
        say(f"  {group}: {len(found)} measured gang runs of {len(runs)}")
        if not found and strict:
            raise InputError(f"run group {group!r}: no measured finetune gang (runs with --nodes 2 or more "
                             "that succeeded); measure some with llmpack compare --cluster --nodes 2")
        out += found
    return out


def with_run_details(mc: Any, run: dict[str, Any]) -> dict[str, Any]:
    """The run with finetune's every event (``<event>.node<R>`` included: the report's rebuilt events keep
    the step's own) and its parameters, from one read of its MLflow record (as
    :func:`llmpack.cluster.plan.project.data._with_node_events`, plus the parameters)."""
    from components.record import tracking
    from components.record.telemetry import RunContext, group_by_step

    data = mc.get_run(run["artifacts"]["mlflow_run_id"]).data
    ctx = RunContext(run_group=run["run_group"], pipeline_run=run["pipeline_run"], orchestrator=run["orchestrator"],
                     mode=run["mode"], submitted_at=run["submitted_at"])
    step = group_by_step(tracking.records_from_run(data.metrics, ctx)).get("finetune")
    return {**run, "events": {**run["events"], "finetune": dict(step.events) if step else {}},
            "params": dict(data.params)}


def all_groups(tracking_uri: str | None) -> list[str]:
    """Every run group with a pipeline record in the store, oldest first (the whole history)."""
    from components.record import tracking

    mc = tracking.client(tracking_uri)
    found = mc.search_runs([tracking.experiment_id(mc)], filter_string=f"tags.`{tracking.RECORD_TAG}` = 'pipeline'",
                           max_results=5000, order_by=["attributes.start_time ASC"])
    return list(dict.fromkeys(g for g in (r.data.tags.get("llmpack.run_group") for r in found) if g))


def from_dumps(pods: str, nodes: str | None, events: str | None, progress: Progress | None = None) -> list[RunSample]:
    """Every succeeded gang of kubectl dumps (as ``llmpack project --pods`` reads them). Dumps hold no
    in-container events: no load (first step) and no post-training time, which the plan then borrows
    or marks; the GPU type and capacity are the first gang node's (its labels)."""
    from llmpack.cluster.k8s.timeline import timeline_from_files
    from llmpack.cluster.plan.project.data import gangs_from_rows
    from llmpack.gpu_catalogue import node_gpu

    say = progress or (lambda _text: None)
    say(f"reading kubectl dumps {pods}")
    rows = timeline_from_files(pods, nodes=nodes, events=events)
    gang_rows = [r for r in rows if r.get("gang")]
    if not gang_rows:
        raise InputError(f"{pods}: no TrainJob node pods (label jobset.sigs.k8s.io/jobset-name): no gang to plan from")
    gpu = node_gpu(gang_rows[0], None)
    capacity = SPOT if gang_rows[0].get("capacity_type") == SPOT else ON_DEMAND
    out = []
    for g in gangs_from_rows(rows):
        pairs = tuple(NodePhases(provision_s=n.provision_s if n.provision_s is not None else n.ready_s,
                                 pull_s=max(0.0, n.ready_s - (n.provision_s if n.provision_s is not None
                                                              else n.ready_s)))
                      for n in g.nodes)
        out.append(RunSample(run=g.run, path=g.path, gpu_type=gpu.gpu_type or "unknown", capacity=capacity, nodes=pairs,
                             overhead_s=g.overhead_s, load_s=None, train_s=g.train_s, post_s=None,
                             gpus_per_node=g.gpus_per_node or 1, preemptions=0, price_per_gpu_hour=None))
    say(f"  {len(out)} measured gangs on {gpu.gpu_type or 'an unknown GPU'}")
    return out
