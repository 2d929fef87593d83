"""One run's plan and what its pods say.

Fused tasks and whose spin-up a pod is, the gang's start, the run's end, a progress line: pure
functions over the pod watcher's rows (:mod:`llmpack.cluster.k8s.watcher`) and a compiled pipeline,
shared by the session that runs a comparison's runs and the measurement of each run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components.record import telemetry


@dataclass
class Plan:
    """One run of the comparison: its path, label, pipeline-run id and packaging."""

    orchestrator: str
    label: str
    pipeline_run: str
    fuse: str = "none"  # the packaging (components.fusion) this run submits


def fused_tasks(pipe: Any) -> dict[str, tuple[str, ...]]:
    """Each fused task of a compiled pipeline (``llmpack compile --fuse``) -> the authored steps its
    one pod runs, in order: ``{"finetune-evaluate": ("finetune", "evaluate")}``."""
    from components.fusion import FusedStep

    return {t.name: tuple(m.task for m in t.step.members) for t in pipe.tasks.values() if isinstance(t.step, FusedStep)}


def pod_step_aliases(fused: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """Whose spin-up a pod's phases are (:func:`~llmpack.cluster.k8s.step_records.to_step_records`): the MLflow
    Job's ``main`` pod and a fused pod that trains count as ``finetune``'s, the way one pod that
    runs the training step starts it; a fused pod that does not train, as its first member's."""
    from llmpack.cluster.k8s.step_records import DEFAULT_STEP_ALIASES

    out = dict(DEFAULT_STEP_ALIASES)
    for task, members in fused.items():
        out[task] = telemetry.TRAIN_STEP if telemetry.TRAIN_STEP in members else members[0]
    return out


def gang_ready(rows: Iterable[Mapping[str, Any]]) -> float | None:
    """When the run's (last) TrainJob gang was all up: its last node pod's container start.

    None when the run has no gang, or a node pod of it never started. Several gangs (a retried
    launcher made another TrainJob): the last-created one's.
    """
    gangs: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("gang") and row.get("role") != "driver":
            gangs.setdefault(row["gang"], []).append(row)
    if not gangs:
        return None
    last = max(gangs.values(), key=lambda g: min((r.get("created") or 0.0) for r in g))
    starts = [r.get("container_started") for r in last]
    return None if any(s is None for s in starts) else max(starts)


def run_end(steps: Mapping[str, telemetry.StepTimes], rows: Iterable[Mapping[str, Any]],
            fallback: float | None) -> float | None:
    """The last timestamped moment of the run: a pod's container finish or a step's ``finished``."""
    ends = [s.events["finished"] for s in steps.values() if "finished" in s.events]
    ends += [r["finished"] for r in rows if r.get("finished") is not None]
    return max(ends) if ends else fallback


def mine(rows: Iterable[Mapping[str, Any]], pipeline_run: str) -> list[dict[str, Any]]:
    """The rows of one run's pods (copies), by its pipeline-run id."""
    return [dict(r) for r in rows if r.get("pipeline_run") == pipeline_run]


def describe(rows: list[dict[str, Any]]) -> str:
    """One progress line from a run's pods: the newest step pod's state and tasks done."""
    pods = [r for r in rows if r.get("role") != "driver"]
    if not pods:
        return "waiting for pods"
    done = {r["step"] for r in pods if r.get("phase") == "Succeeded"}
    latest = max(pods, key=lambda r: r.get("created") or 0.0)
    step = latest.get("step") or latest["pod"]
    if latest.get("phase") in ("Succeeded", "Failed"):
        state = "done" if latest["phase"] == "Succeeded" else "failed"
    elif latest.get("container_started") is not None:
        state = "running"
    elif latest.get("scheduled") is not None:
        state = "starting (image pull, init)"
    else:
        state = "queued (waiting for a node)"
    from llmpack.ui.progress import tasks_done

    return f"{step} · {state} · {tasks_done(len(done))}"  # pipeline tasks: finetune's optimizer steps are 23/60


def kept_train_s(metrics: Mapping[str, Any], train: telemetry.StepTimes | None) -> float | None:
    """The training a run kept (after a preemption: up to the checkpoint, plus the retry's), else its ``train_s``."""
    if metrics.get("preemptions") and metrics.get("kept_train_s") is not None:
        return metrics["kept_train_s"]
    return train.metrics.get("train_s") if train is not None else metrics.get("train_s")
