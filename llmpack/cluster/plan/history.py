"""The user's measured history in: one :class:`RunSample` per succeeded gang run of the run groups.

The runs are the pipeline records ``llmpack report`` and ``llmpack cluster plan project`` read
(:func:`llmpack.report.facts.runs_from_mlflow`, the finetune gang's per-node events by
:func:`llmpack.cluster.plan.project.data.gang_of_run`); a run keeps its phases apart so that :mod:`.phases`
can borrow the ones that do not depend on the GPU. Cluster runs are history: a gang's per-node events,
or a one-node run's finetune pod (one node). Local runs are not (one machine: no node provisioned, no
image pulled, no gang): :attr:`History.notes` says so rather than "none". Reading never writes: a
sqlite store that does not exist, or a store without the llmpack experiment, is no history.

From kubectl dumps each gang's GPU type is its nodes' (node labels, per node): a gang whose nodes
are of different types is left out, one line saying so (its straggler's time is no one type's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
    submitted_at: float | None = None                               # when the run began (the time split's order)

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

    gang = gang_of_run(run) or one_node_gang(run)
    if gang is None:
        return None
    tags = run.get("tags") or {}
    metrics = run.get("metrics") or {}
    nodes = _pairs(gang.nodes)
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
        steps=_steps((run.get("params") or {}).get("max_steps")), submitted_at=_float(run.get("submitted_at")))


def one_node_gang(run: Mapping[str, Any]) -> Any | None:
    """A succeeded one-node cluster run as a gang of one: its finetune pod's own events (pod created,
    its node Ready, container started); None for anything else."""
    from llmpack.cluster.plan.project.data import MeasuredGang, NodeTimes

    ev = (run.get("events") or {}).get("finetune") or {}
    if run.get("mode") != "cluster" or run.get("status") not in (None, "succeeded"):
        return None
    created, started = _float(ev.get("pod_created")), _float(ev.get("container_started"))
    if created is None or started is None or any(".node" in k for k in ev):
        return None
    ready = _float(ev.get("node_ready"))
    first, finished = _float(ev.get("first_step")), _float(ev.get("finished"))
    node = NodeTimes(ready_s=started - created, provision_s=None if ready is None else ready - created,
                     billed_s=max(0.0, started - ready) if ready is not None else 0.0)
    ranks = sum(1 for k in ev if k.startswith("first_step.rank"))
    try:
        price = float((run.get("tags") or {})["llmpack.price_per_gpu_hour"])
    except (KeyError, ValueError):
        price = None
    submitted = _float(run.get("submitted_at"))
    return MeasuredGang(path=str(run.get("orchestrator") or "unknown"), run=str(run.get("pipeline_run") or ""),
                        nodes=(node,), overhead_s=None if submitted is None else created - submitted,
                        first_step_s=None if first is None else first - started,
                        train_s=None if first is None or finished is None else finished - first,
                        gpus_per_node=ranks or None, price_per_gpu_hour=price)


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


class History(list[RunSample]):
    """The samples, and lines about what was read and left out (printed with the plan)."""

    def __init__(self, samples: Iterable[RunSample] = (), notes: Iterable[str] = ()) -> None:
        super().__init__(samples)
        self.notes = list(notes)


LOCAL_NOTE = ("{n} local run(s) in the store are not cluster history: one machine has no node to provision, "
              "no image to pull and no gang to wait for; measure on a cluster (llmpack cluster compare)")


def read_only_client(tracking_uri: str | None) -> Any | None:
    """An MLflow client for reading, or None when there is nothing to read: a sqlite store whose file does
    not exist is not created (a plan writes nothing), nor is the llmpack experiment."""
    from mlflow.tracking import MlflowClient

    from components.record import tracking

    uri = tracking.tracking_uri(tracking_uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):].split("?", 1)[0]).is_file():
        return None
    try:
        mc = MlflowClient(tracking_uri=uri)
        found = mc.get_experiment_by_name(tracking.experiment_name())
    except Exception as exc:  # noqa: BLE001 - MLflow's store errors (unsupported, unreachable): one line
        raise InputError(f"MLflow tracking URI {tracking.redact_uri(uri)} does not answer or cannot be opened "
                         f"({type(exc).__name__})") from None
    return mc if found is not None else None


def from_mlflow(run_groups: Sequence[str], tracking_uri: str | None, progress: Progress | None = None,
                *, strict: bool = True) -> History:
    """Every measured gang run of the run groups, a progress line per group (and every 20 runs);
    ``strict``: a group without one is refused (one line) rather than skipped."""
    from components.record import tracking
    from llmpack.report.facts import runs_from_mlflow

    say = progress or (lambda _text: None)
    mc = read_only_client(tracking_uri)
    out = History()
    if mc is None:
        if strict and run_groups:
            raise InputError(f"run group {run_groups[0]!r}: no tracking store with llmpack runs at "
                             f"{tracking.redact_uri(tracking.tracking_uri(tracking_uri))}")
        return out
    local = 0
    for group in run_groups:
        say(f"reading run group {group}")
        runs = runs_from_mlflow(mc, group)
        found = []
        for i, run in enumerate(runs, 1):
            if run.get("mode") == "local":
                local += 1
                continue
            sample = sample_of_run(with_run_details(mc, run) if run.get("status") == "succeeded" else run)
            if sample is not None:
                found.append(sample)
            if i % 20 == 0:
                say(f"  {group}: {i} of {len(runs)} runs read")
        say(f"  {group}: {len(found)} measured gang runs of {len(runs)}")
        if not found and strict:
            what = (f"its {len(runs)} runs are local (one machine: no node, pull or gang to measure)"
                    if runs and all(r.get("mode") == "local" for r in runs) else "no succeeded cluster run")
            raise InputError(f"run group {group!r}: {what}; measure some with llmpack cluster compare")
        out += found
    if local:
        out.notes.append(LOCAL_NOTE.format(n=local))
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
    """Every run group with a pipeline record in the store, oldest first (the whole history); none
    without a store (nothing created)."""
    from components.record import tracking

    mc = read_only_client(tracking_uri)
    if mc is None:
        return []
    found = mc.search_runs([tracking.experiment_id(mc)], filter_string=f"tags.`{tracking.RECORD_TAG}` = 'pipeline'",
                           max_results=5000, order_by=["attributes.start_time ASC"])
    return list(dict.fromkeys(g for g in (r.data.tags.get("llmpack.run_group") for r in found) if g))


def from_dumps(pods: str, nodes: str | None, events: str | None, progress: Progress | None = None) -> History:
    """Every succeeded gang of kubectl dumps (as ``llmpack cluster plan project --pods`` reads them), each on the GPU
    type and capacity of its nodes' labels, node by node; a gang whose nodes differ in GPU type is left
    out (a line says how many). Dumps hold no in-container events: no load (first step) and no
    post-training time, which the plan then borrows or marks."""
    from llmpack.cluster.k8s.timeline import timeline_from_files
    from llmpack.cluster.plan.project.data import gangs_from_rows
    from llmpack.gpu_catalogue import node_gpu

    say = progress or (lambda _text: None)
    say(f"reading kubectl dumps {pods}")
    rows = timeline_from_files(pods, nodes=nodes, events=events)
    gang_rows = [r for r in rows if r.get("gang")]
    if not gang_rows:
        raise InputError(f"{pods}: no TrainJob node pods (label jobset.sigs.k8s.io/jobset-name): no gang to plan from")
    kinds: dict[str, set[tuple[str, str]]] = {}
    for r in gang_rows:
        kind = (node_gpu(r, None).gpu_type or "unknown", SPOT if r.get("capacity_type") == SPOT else ON_DEMAND)
        kinds.setdefault(r["gang"], set()).add(kind)
    mixed = sorted(g for g, k in kinds.items() if len({gpu for gpu, _ in k}) > 1)
    others = [r for r in rows if not r.get("gang")]
    out = History()
    counts: dict[str, int] = {}
    began: dict[str, float] = {}  # a run's (or gang's) first pod: the time split's order
    for r in rows:
        key = r.get("pipeline_run") or r.get("gang")
        if key and r.get("created") is not None:
            began[key] = min(began.get(key, r["created"]), r["created"])
    for gpu, capacity in sorted({next(iter(k)) for g, k in kinds.items() if g not in mixed and len(k) == 1}):
        mine = [r for r in gang_rows if kinds[r["gang"]] == {(gpu, capacity)}]
        for g in gangs_from_rows([*others, *mine]):
            out.append(RunSample(run=g.run, path=g.path, gpu_type=gpu, capacity=capacity, nodes=_pairs(g.nodes),
                                 overhead_s=g.overhead_s, load_s=None, train_s=g.train_s, post_s=None,
                                 gpus_per_node=g.gpus_per_node or 1, preemptions=0, price_per_gpu_hour=None,
                                 submitted_at=began.get(g.run)))
            counts[gpu] = counts.get(gpu, 0) + 1
    say(f"  {len(out)} measured gangs, each on its nodes' GPU type: "
        + (", ".join(f"{n} on {gpu}" for gpu, n in counts.items()) or "none"))
    if mixed:
        out.notes.append(f"{len(mixed)} gang(s) left out: their nodes are of different GPU types (a gang waits for its "
                         f"slowest node, so its time is no one type's): {', '.join(mixed[:3])}"
                         + (" ..." if len(mixed) > 3 else ""))
        say("  " + out.notes[-1])
    mixed_capacity = [g for g, k in kinds.items() if g not in mixed and len(k) > 1]
    if mixed_capacity:
        out.notes.append(f"{len(mixed_capacity)} gang(s) left out: their nodes are of both on-demand and spot capacity")
    return out


def _pairs(nodes: Iterable[Any]) -> tuple[NodePhases, ...]:
    """Per node: (pod created -> node Ready, node Ready -> container started); without a node Ready, all
    of it is provisioning."""
    return tuple(NodePhases(provision_s=n.provision_s if n.provision_s is not None else n.ready_s,
                            pull_s=max(0.0, n.ready_s - (n.provision_s if n.provision_s is not None else n.ready_s)))
                 for n in nodes)
