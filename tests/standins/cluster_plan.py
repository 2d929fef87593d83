"""What the fake cluster plays for a submitted run: its tasks in dependency order, which pods are
GPU pods and which steps a fused pod runs (from a KFP ``pipeline_spec`` or an Argo Workflow), and
the virtual times it lays them out with (:class:`Timings`); :class:`RunScript` keeps a run's
timestamps for the tests. Split from :mod:`standins.fake_cluster`, which re-exports these names.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STEPS = ("prepare-data", "tokenize", "finetune", "evaluate", "register")
GPU_STEPS = ("finetune", "evaluate")
IMAGE = "ghcr.io/llmpack/llmpack:0.1.0"
KFP_LAUNCHER = "ghcr.io/kubeflow/kfp-launcher:2.5.0"
KFP_DRIVER = "ghcr.io/kubeflow/kfp-driver:2.5.0"
_PARAM_REF = re.compile(r"\{\{\s*workflow\.parameters\.([A-Za-z0-9_.-]+)\s*\}\}")
_FUSED_REF = re.compile(r"[\w.]+:([A-Za-z0-9]\w*?__\w+)")  # components.finetune_pipeline:finetune__evaluate
_DEFAULT_COMPUTE_S = 1.0  # a step Timings.compute_s does not name (a custom step)


@dataclass
class Timings:
    """Virtual durations, in seconds (compressed: a real GPU node takes minutes, not seconds)."""

    first_pod_s: int = 2          # submit -> the first pod object
    step_gap_s: int = 1           # a pod's end -> the controller creates the next pod
    kfp_driver_s: int = 2         # a KFP driver pod's run time
    schedule_s: int = 1           # created -> scheduled, on a node that is there
    node_create_s: int = 1        # GPU pod created -> the autoscaler's node object
    node_ready_s: int = 6         # node object -> Ready
    bind_s: int = 1               # node Ready -> pod scheduled on it
    init_s: int = 1               # scheduled -> init containers done
    pull_s: int = 4               # image pull on the new GPU node
    start_s: int = 1              # image there -> container started
    process_s: float = 0.35       # container started -> the step's process started
    load_s: Mapping[str, float] = field(default_factory=lambda: {"finetune": 1.3, "evaluate": 0.9})
    first_step_s: float = 0.8     # model loaded -> first optimizer step
    compute_s: Mapping[str, float] = field(default_factory=lambda: {
        "prepare-data": 1.15, "tokenize": 1.65, "finetune": 5.6, "evaluate": 2.2, "register": 0.85})
    mlflow_child_s: float = 0.55  # MLflow main: one step's end -> the next step's process start
    # A TrainJob gang (nnodes > 1). Per node i (cycled): each node pod gets its own new GPU node,
    # which the cloud brings up at its own pace, and pulls the image at its own pace.
    trainjob_s: float = 0.6       # launcher process start -> TrainJob created (tokens staged into the PVC)
    gang_pods_s: int = 1          # TrainJob created -> JobSet's Job pods created
    gang_node_create_s: tuple[int, ...] = (1, 2, 1, 3)   # pod created -> node object, per node
    gang_node_ready_s: tuple[int, ...] = (6, 9, 7, 8)    # node object -> Ready, per node
    gang_pull_s: tuple[int, ...] = (4, 7, 5, 6)          # image pull on node i
    gang_start_s: tuple[int, ...] = (1, 2, 1, 1)         # image there -> container started, per node
    rank_load_s: float = 0.02     # rank R loads the model R x this later than rank 0 (the last rank is last)
    launcher_poll_s: int = 1      # TrainJob Complete -> the launcher sees it
    # Kueue (a gang with a queue): the TrainJob waits suspended until its Workload is admitted.
    kueue_quota_s: int = 12       # Workload created -> QuotaReserved (other jobs ahead in the ClusterQueue)
    kueue_admit_s: int = 3        # QuotaReserved -> Admitted (admission checks)
    copy_back_s: float = 0.4      # the launcher copies the model back and merges the ranks' events


@dataclass
class RunScript:
    """What the fake cluster did for one run (times are epoch seconds)."""

    orchestrator: str
    pipeline_run: str
    run_group: str
    submitted_at: float
    namespace: str
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)      # task (MLflow: "main") -> times
    tasks: dict[str, tuple[str, ...]] = field(default_factory=dict)    # task (MLflow: "main") -> its steps
    drivers: list[dict[str, Any]] = field(default_factory=list)
    node: dict[str, Any] = field(default_factory=dict)                 # the GPU node brought up
    events: dict[str, dict[str, float]] = field(default_factory=dict)  # step -> in-container events
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    gang: dict[str, Any] = field(default_factory=dict)                 # the finetune TrainJob (nnodes > 1)
    failed_step: str | None = None   # the step that failed (a member, for a fused task)
    failed_task: str | None = None   # the task (pod) it failed in
    artifact: Any = None             # what was submitted (KFP run, Workflow, Job): standins.real_pods reads its env
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def gang_ready(self) -> float | None:
        """The last gang pod's container start (what ``gang_ready_s`` counts from ``submitted_at``)."""
        pods = self.gang.get("pods") or []
        return max(p["started"] for p in pods) if pods else None


@dataclass(frozen=True)
class PlannedTask:
    """One task of a submitted workflow: one pod that runs ``members`` (authored steps) in order."""

    name: str
    members: tuple[str, ...]
    source: str                          # the Argo template / the KFP executor label of the task
    command: tuple[str, ...] = ()        # its container's command + args (as compiled)

    @property
    def fused(self) -> bool:
        return self.members != (self.name,)

    @property
    def gpu(self) -> bool:
        return any(m in GPU_STEPS for m in self.members)


def _floor(t: float) -> int:
    return int(math.floor(t))


def fused_members(command: list[Any] | tuple[Any, ...], task: str) -> tuple[str, ...]:
    """The steps a task's container runs: a fused step's members, else the task itself.

    ``components.finetune_pipeline:finetune__evaluate`` -> ``("finetune", "evaluate")`` (the attribute split
    on ``__``, ``_`` as ``-``: :func:`components.fusion.fused_attr` reversed).
    """
    m = _FUSED_REF.search(" ".join(str(c) for c in command))
    if m is None:
        return (task,)
    return tuple(p.replace("_", "-") for p in m.group(1).split("__") if p)


def _in_order(names: list[str], deps: Mapping[str, set[str]], members: Mapping[str, tuple[str, ...]]) -> list[str]:
    """``names`` in dependency order; ties (and a cycle, which a compiled pipeline has not) by the
    authored order of their first member step, then as listed."""
    rank = {s: i for i, s in enumerate(STEPS)}

    def key(n: str) -> tuple[int, int]:
        return (rank.get((members.get(n) or (n,))[0], len(rank)), names.index(n))

    known, done, out = set(names), set(), []
    pending = list(names)
    while pending:
        ready = [n for n in pending if (deps.get(n, set()) & known) <= done] or pending
        first = min(ready, key=key)
        out.append(first)
        done.add(first)
        pending.remove(first)
    return out


def gang_of(values: Mapping[str, Any]) -> tuple[int, Any] | None:
    """(nodes, :class:`components.trainjob.gang.GangSpec`) when the run's finetune is a TrainJob gang, else None."""
    from components.trainjob.gang import NNODES_PARAM, TRAINJOB_PARAM, GangSpec

    try:
        nodes = int(float(str(values.get(NNODES_PARAM) or 1)))
    except ValueError:
        return None
    if nodes <= 1 or not values.get(TRAINJOB_PARAM):
        return None
    return nodes, GangSpec.from_json(str(values[TRAINJOB_PARAM]), "fake cluster")


def kfp_defaults(pipeline_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The root parameters' compiled defaults of a KFP ``pipeline_spec``."""
    spec = pipeline_spec.get("pipeline_spec") if "pipeline_spec" in pipeline_spec else pipeline_spec
    params = (((spec or {}).get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {}
    return {k: v.get("defaultValue") for k, v in params.items() if isinstance(v, Mapping) and "defaultValue" in v}


def _default_tasks() -> list[PlannedTask]:
    """What the fake played before it read workflows: one task per authored step."""
    return [PlannedTask(step, (step,), step) for step in STEPS]


def argo_tasks(wf: Mapping[str, Any]) -> list[PlannedTask]:
    """The container tasks of a Workflow's entrypoint DAG, in dependency order."""
    templates = {t["name"]: t for t in wf["spec"].get("templates") or []}
    dag = (templates.get(wf["spec"].get("entrypoint")) or {}).get("dag") or {}
    deps: dict[str, set[str]] = {}
    planned: dict[str, PlannedTask] = {}
    for task in dag.get("tasks") or []:
        name, tmpl = task["name"], templates.get(task.get("template") or task["name"]) or {}
        container = tmpl.get("container") or tmpl.get("script")
        if container is None:  # a nested DAG, a suspend, a resource template: no step pod of ours
            continue
        command = tuple(str(c) for c in [*(container.get("command") or []), *(container.get("args") or [])])
        planned[name] = PlannedTask(name, fused_members(command, name), tmpl["name"], command)
        deps[name] = set(task.get("dependencies") or []) | set(re.findall(r"[A-Za-z0-9][A-Za-z0-9-]*",
                                                                          str(task.get("depends") or "")))
    if not planned:
        return _default_tasks()
    members = {n: p.members for n, p in planned.items()}
    return [planned[n] for n in _in_order(list(planned), deps, members)]


def kfp_tasks(pipeline_spec: Mapping[str, Any]) -> list[PlannedTask]:
    """The container tasks of a KFP run's ``pipeline_spec`` (bare, or ``{"pipeline_spec", "platform_spec"}``),
    DAG components (the exit handler) unwrapped, exit tasks left out, in dependency order."""
    spec = pipeline_spec.get("pipeline_spec") if "pipeline_spec" in pipeline_spec else pipeline_spec
    spec = spec or {}
    components = spec.get("components") or {}
    executors = (spec.get("deploymentSpec") or {}).get("executors") or {}
    deps: dict[str, set[str]] = {}
    planned: dict[str, PlannedTask] = {}

    def walk(dag: Mapping[str, Any]) -> None:
        for name, task in (dag.get("tasks") or {}).items():
            if (task.get("triggerPolicy") or {}).get("strategy") == "ALL_UPSTREAM_TASKS_COMPLETED":
                continue  # an exit task (close-record): not a step, not played (as before)
            comp = components.get((task.get("componentRef") or {}).get("name", "")) or {}
            if "dag" in comp:
                walk(comp["dag"])
                continue
            label = comp.get("executorLabel") or f"exec-{name}"
            container = (executors.get(label) or {}).get("container") or {}
            command = tuple(str(c) for c in [*(container.get("command") or []), *(container.get("args") or [])])
            planned[name] = PlannedTask(name, fused_members(command, name), label, command)
            deps[name] = set(task.get("dependentTasks") or [])

    walk((spec.get("root") or {}).get("dag") or {})
    if not planned:
        return [PlannedTask(step, (step,), f"exec-{step}") for step in STEPS]
    members = {n: p.members for n, p in planned.items()}
    return [planned[n] for n in _in_order(list(planned), deps, members)]


def _suffix(seed: str, n: int) -> str:
    import hashlib

    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(alphabet[b % len(alphabet)] for b in digest[:n])


def _uid(seed: str) -> str:
    import hashlib
    import uuid

    return str(uuid.UUID(hashlib.md5(seed.encode()).hexdigest()))


def _hash_digits(seed: str) -> str:
    import hashlib

    return str(int(hashlib.sha256(seed.encode()).hexdigest()[:8], 16))


def command_params(command: list[str]) -> dict[str, str]:
    """The ``--param=NAME=VALUE`` arguments of the MLflow ``main`` command (an argv, already split)."""
    out = {}
    for arg in command:
        if arg.startswith("--param="):
            key, _, value = arg[len("--param="):].partition("=")
            out[key] = value
    return out
