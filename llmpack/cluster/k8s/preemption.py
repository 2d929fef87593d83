"""Preemption as its own outcome: which attempts were preempted, and what each preemption cost.

A retry after a preemption is not a retry after a failure; this module makes that split in the
record from what Kubernetes and Kueue say, never from exit codes: the pod's ``DisruptionTarget``
condition, its node's termination while it ran, Kueue's ``Evicted``/``Preempted`` Workload
conditions. Every attempt is ``succeeded``, ``failed``, ``preempted`` or ``running``
(:func:`attempt_outcome`); :func:`preemption_metrics` prices each preemption's waste (GPU time since
the last checkpoint plus the retry's spin-up) and ``time_to_recover_s``; a TrainJob gang is one
attempt of all its node pods (:func:`gang_attempts`). Pure functions; stdlib only.

Each signal and each figure: docs/internals/pod-watcher.md and docs/preemption.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.errors import InputError
from llmpack.cluster.k8s.billing import pod_billed_s

DISRUPTION_CONDITION = "DisruptionTarget"
# The reasons Kubernetes sets on DisruptionTarget (k8s.io/api/core/v1 PodReasonPreemptionByScheduler...).
DISRUPTION_REASONS = ("PreemptionByScheduler", "DeletionByTaintManager", "EvictionByEvictionAPI", "DeletionByPodGC",
                      "TerminationByKubelet")
NODE_TERMINATION = "NodeTermination"  # our reason: the node went away under a running pod
KUEUE_EVICTED, KUEUE_PREEMPTED = "Evicted", "Preempted"
# Taints a node gets when it is about to go away (kept by the watcher's slim nodes).
TERMINATION_TAINTS = (
    "ToBeDeletedByClusterAutoscaler",             # cluster-autoscaler (value: unix seconds)
    "karpenter.sh/disrupted",                     # Karpenter v1
    "karpenter.sh/disruption",                    # Karpenter before v1
    "cloud.google.com/impending-node-termination",  # GKE Spot / preemptible VMs
    "aws-node-termination-handler/spot-itn",      # AWS spot interruption notice
    "node.kubernetes.io/out-of-service",          # non-graceful node shutdown
)
OUTCOMES = ("succeeded", "failed", "preempted", "running")
# What a step writes so a preemption's loss can be measured (the checkpointing step's events):
CHECKPOINT_EVENT = "checkpoint_saved"    # the time of the newest complete checkpoint of this attempt
RESUMED_METRIC = "resumed_from_step"     # the optimizer step a retry resumed from (0: from scratch)


# --------------------------------------------------------------------------- reading the objects


def _time(value: Any) -> float | None:
    from llmpack.cluster.k8s.objects import parse_time

    try:
        return parse_time(value)
    except (TypeError, ValueError):
        return None


def pod_disruption(pod: Mapping[str, Any]) -> tuple[str, float | None] | None:
    """(reason, when) of a pod's ``DisruptionTarget`` condition with status True, else None."""
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == DISRUPTION_CONDITION and str(cond.get("status")) == "True":
            return str(cond.get("reason") or DISRUPTION_CONDITION), _time(cond.get("lastTransitionTime"))
    return None


def node_terminated_at(node: Mapping[str, Any] | None) -> float | None:
    """When a node began going away: its ``deletionTimestamp``, else the earliest termination taint's time."""
    if not node:
        return None
    meta = node.get("metadata") or {}
    times = [t for t in [_time(meta.get("deletionTimestamp"))] if t is not None]
    for taint in (node.get("spec") or {}).get("taints") or ():
        if not isinstance(taint, Mapping) or taint.get("key") not in TERMINATION_TAINTS:
            continue
        t = _time(taint.get("timeAdded"))
        if t is None and re.fullmatch(r"\d+", str(taint.get("value") or "")):
            t = float(str(taint["value"]))
        if t is not None:
            times.append(t)
    return min(times) if times else None


def disruption_fields(pod: Mapping[str, Any], node: Mapping[str, Any] | None, finished: float | None,
                      started: float | None) -> dict[str, Any]:
    """The row fields ``disruption`` (reason) and ``disrupted_at`` of one pod (None, None: not disrupted).

    The pod's own ``DisruptionTarget`` first; else its node's termination, when it came while the
    pod's container ran (after its start, before its finish, or with no finish at all).
    """
    found = pod_disruption(pod)
    if found is not None:
        return {"disruption": found[0], "disrupted_at": found[1]}
    gone = node_terminated_at(node)
    if gone is not None and started is not None and gone >= started and (finished is None or gone < finished):
        return {"disruption": NODE_TERMINATION, "disrupted_at": gone}
    return {"disruption": None, "disrupted_at": None}


def workload_disruption(workload: Mapping[str, Any] | None) -> tuple[str, float | None] | None:
    """(reason, when) of a Kueue Workload's ``Evicted`` or ``Preempted`` condition (status True), else None.

    The reason is Kueue's (``Preempted``, ``InactiveWorkload``, ``PodsReadyTimeout``...), prefixed
    ``Kueue`` so a report tells it from a pod's own disruption.
    """
    for cond in ((workload or {}).get("status") or {}).get("conditions") or ():
        if cond.get("type") in (KUEUE_EVICTED, KUEUE_PREEMPTED) and str(cond.get("status")) == "True":
            return f"Kueue{cond.get('reason') or cond['type']}", _time(cond.get("lastTransitionTime"))
    return None


def attempt_outcome(row: Mapping[str, Any]) -> str:
    """``preempted`` (a disruption), ``succeeded``, ``failed`` (Failed, or deleted unfinished), or ``running``."""
    if row.get("disruption"):
        return "preempted"
    if row.get("phase") == "Succeeded":
        return "succeeded"
    if row.get("phase") == "Failed" or row.get("deleted"):
        return "failed"
    return "running"


# --------------------------------------------------------------------------- --preempt


@dataclass(frozen=True, kw_only=True)
class PreemptSpec:
    """``--preempt STEP@30s`` (once, ``at_s`` after the step's container started) or ``STEP@rate=R/h``
    (a Poisson process of ``rate_per_h`` preemptions per GPU-hour of the step, drawn with ``seed``)."""

    step: str
    at_s: float | None = None
    rate_per_h: float | None = None
    seed: int = 0

    def __str__(self) -> str:
        if self.at_s is not None:
            return f"{self.step}@{self.at_s:g}s"
        return f"{self.step}@rate={self.rate_per_h:g}/h,seed={self.seed}"

    def moments(self, run_s: float, *, limit: int = 3) -> list[float]:
        """Seconds after the step's container start at which its attempts are preempted, within ``run_s``
        of running: the one fixed moment, or the rate's draws (the same seed: the same moments on every path)."""
        if self.at_s is not None:
            return [self.at_s] if self.at_s < run_s else []
        import random

        rng, out, t = random.Random(self.seed), [], 0.0
        rate_per_s = (self.rate_per_h or 0.0) / 3600.0
        while rate_per_s > 0 and len(out) < limit:
            t += rng.expovariate(rate_per_s)
            if t >= run_s:
                break
            out.append(round(t, 3))
        return out


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)?$")
_RATE = re.compile(r"^rate=(\d+(?:\.\d+)?)/(s|m|h)(?:,seed=(\d+))?$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_preempt(text: str, steps: Sequence[str], flag: str = "--preempt") -> PreemptSpec:
    """``finetune@30s``, ``finetune@2m``, ``finetune@rate=0.5/h`` or ``finetune@rate=2/h,seed=7``; one-line
    error else."""
    step, at, rest = str(text).strip().partition("@")
    if not at or not step or not rest:
        raise InputError(f"{flag} {text!r}: expected STEP@DURATION (finetune@30s) "
                         "or STEP@rate=R/h (finetune@rate=0.5/h)")
    if step not in steps:
        raise InputError(f"{flag} {text!r}: no step {step!r} (choose among {', '.join(steps)})")
    m = _DURATION.match(rest)
    if m:
        at_s = float(m.group(1)) * _UNIT_S[m.group(2)]
        if not (at_s > 0 and math.isfinite(at_s)):
            raise InputError(f"{flag} {text!r}: the moment must be after the container starts (above 0)")
        return PreemptSpec(step=step, at_s=at_s)
    m = _RATE.match(rest)
    if m:
        per_h = float(m.group(1)) * 3600.0 / _UNIT_S[m.group(2)]
        if not (per_h > 0 and math.isfinite(per_h)):
            raise InputError(f"{flag} {text!r}: the rate must be above 0")
        return PreemptSpec(step=step, rate_per_h=per_h, seed=int(m.group(3) or 0))
    raise InputError(f"{flag} {text!r}: after '@' give a duration (30s, 2m) or a rate (rate=0.5/h[,seed=N])")


# --------------------------------------------------------------------------- what preemption cost


def _order(row: Mapping[str, Any]) -> tuple[float, str]:
    created = row.get("created")
    return (math.inf if created is None else float(created), str(row.get("pod") or ""))


def _gpu_start(row: Mapping[str, Any]) -> float | None:
    """When a pod began holding GPU time as billed: its node's Ready when brought up for it, else its container
    start."""
    created, ready = row.get("created"), row.get("node_ready")
    if created is not None and ready is not None and ready > created:
        return float(ready)
    return row.get("container_started")


def _attempt_events(steps: Mapping[str, Any], step: str, attempt: int) -> Mapping[str, float]:
    st = steps.get(step)
    if st is None:
        return {}
    for a in st.all_attempts:
        if a.attempt == attempt:
            return a.events
    return {}


def attempts_of(rows: Iterable[Mapping[str, Any]], gpus_by_step: Mapping[str, int], price: float | None,
                aliases: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every executor pod of the run as an attempt: step, attempt number, outcome, reason, GPU-hours, cost."""
    by_step: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("role") != "driver" and row.get("step") and not row.get("gang"):
            by_step.setdefault(row["step"], []).append(row)
    out = []
    for pod_step, mine in by_step.items():
        for n, row in enumerate(sorted(mine, key=_order)):
            gpus = gpus_by_step.get(pod_step, 0)
            hours = gpus * max(0.0, pod_billed_s(row) or 0.0) / 3600.0
            out.append({"step": (aliases or {}).get(pod_step, pod_step), "attempt": n, "pod": row.get("pod"),
                        "outcome": attempt_outcome(row), "reason": row.get("disruption"),
                        "disrupted_at": row.get("disrupted_at"), "gpus": gpus, "gpu_hours": hours,
                        "cost_usd": None if price is None else hours * price})
    return sorted(out, key=lambda a: (a["step"], a["attempt"]))


def gang_attempts(rows: Iterable[Mapping[str, Any]], price: float | None,
                  aliases: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Each TrainJob gang's attempts: the k-th pod (by creation) of every node rank is attempt k, as a JobSet
    restarted whole recreates every node pod. Preempted when one of its pods was disrupted (the earliest's
    reason and time); else failed, succeeded or running as its pods are. GPU-hours: every node pod's."""
    ranks: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("gang") and row.get("step") and row.get("role") != "driver":
            key = (str(row["step"]), str(row["gang"]), int(row.get("gang_node") or 0))
            ranks.setdefault(key, []).append(row)
    grouped: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for (step, gang, _), mine in ranks.items():
        for k, row in enumerate(sorted(mine, key=_order)):
            grouped.setdefault((step, gang, k), []).append(row)
    out = []
    for (step, gang, k), pods in sorted(grouped.items(), key=lambda kv: min(_order(r) for r in kv[1])):
        outcomes = [attempt_outcome(r) for r in pods]
        hit = sorted((r for r in pods if r.get("disruption")), key=lambda r: r.get("disrupted_at") or math.inf)
        outcome = next((o for o in ("preempted", "failed", "running") if o in outcomes), "succeeded")
        gpus = sum(int(r.get("gang_gpus") or 0) for r in pods)
        hours = sum(int(r.get("gang_gpus") or 0) * max(0.0, pod_billed_s(r) or 0.0) for r in pods) / 3600.0
        out.append({"step": (aliases or {}).get(step, step), "attempt": k, "gang": gang, "pod": pods[0].get("pod"),
                    "pods": [r.get("pod") for r in pods], "outcome": outcome,
                    "reason": hit[0].get("disruption") if hit else None,
                    "disrupted_at": hit[0].get("disrupted_at") if hit else None, "gpus": gpus, "gpu_hours": hours,
                    "cost_usd": None if price is None else hours * price})
    return out


def _events_in(steps: Mapping[str, Any], step: str, start: float | None, end: float | None) -> Mapping[str, float]:
    """The step attempt whose first optimizer step fell in [start, end] (a gang's attempt, by its pods' times:
    its ranks may log the launcher's attempt number whatever the JobSet restart); {} when none did."""
    st = steps.get(step)
    if st is None or start is None:
        return {}
    for a in st.all_attempts:
        first = a.events.get("first_step", a.events.get("model_loaded"))
        if first is not None and first >= start and (end is None or first <= end):
            return a.events
    return {}


def _gang_waste(a: dict[str, Any], nxt: dict[str, Any] | None, row_of: Mapping[Any, Mapping[str, Any]],
                steps: Mapping[str, Any]) -> tuple[float, float, float, float | None, float | None]:
    """(GPU-seconds lost, GPU-seconds of respin, kept training s, lost s, respin s) of a preempted gang: every node
    pod's GPU time since the gang's checkpoint, every new node pod's GPU time before the new gang's first step."""
    pods = [row_of[p] for p in a["pods"]]
    at = a["disrupted_at"]
    begun = min((s for s in (_gpu_start(r) for r in pods) if s is not None), default=None)
    events = _events_in(steps, a["step"], begun, at)
    saved = events.get(CHECKPOINT_EVENT)
    lost_gpu_s, lost = 0.0, None
    for r in pods:
        since = saved if saved is not None else _gpu_start(r)
        if at is not None and since is not None:
            lost = max(lost or 0.0, at - since)
            lost_gpu_s += int(r.get("gang_gpus") or 0) * max(0.0, at - since)
    kept = max(0.0, saved - events["first_step"]) if saved is not None and events.get("first_step") is not None else 0.0
    respin_gpu_s, respin, resumed = 0.0, None, None
    if nxt is not None:
        npods = [row_of[p] for p in nxt["pods"]]
        nstart = min((s for s in (_gpu_start(r) for r in npods) if s is not None), default=None)
        nev = _events_in(steps, a["step"], nstart, None)
        resumed = nev.get("first_step", nev.get("model_loaded"))
        for r in npods:
            g = _gpu_start(r)
            if resumed is not None and g is not None:
                respin = max(respin or 0.0, resumed - g)
                respin_gpu_s += int(r.get("gang_gpus") or 0) * max(0.0, resumed - g)
    return lost_gpu_s, respin_gpu_s, kept, lost, resumed


def preemption_metrics(rows: Iterable[Mapping[str, Any]], steps: Mapping[str, Any], gpus_by_step: Mapping[str, int],
                       price: float | None, *, retry_gpu_hours: float | None = None,
                       aliases: Mapping[str, str] | None = None
                       ) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """The run's preemption metrics and its attempts (each preempted one with its waste).

    Metrics: ``preemptions``; ``preempted_gpu_hours`` (the preempted attempts' whole GPU time);
    ``preemption_waste_gpu_hours`` / ``preemption_waste_usd`` (per preemption: GPU time since the
    attempt's last checkpoint, plus the next attempt's spin-up and model load to its first step);
    ``time_to_recover_s`` (the longest, preemption to the next attempt's first step);
    ``failure_retry_gpu_hours`` / ``failure_retry_usd`` (``retry_gpu_hours`` less the preempted
    attempts: the retries a failure cost); ``kept_train_s`` (training the run kept: each preempted
    attempt's up to its checkpoint, plus the last attempt's ``train_s``). None where unmeasured.
    """
    rows = [r for r in rows if r.get("role") != "driver"]
    gangs = gang_attempts(rows, price, aliases)
    attempts = attempts_of(rows, gpus_by_step, price, aliases)
    by_pod = {a["pod"]: a for a in attempts}
    preempted = [a for a in attempts if a["outcome"] == "preempted"]
    waste_s, recover, kept_before = 0.0, [], 0.0
    row_of = {r.get("pod"): r for r in rows}
    for a in (g for g in gangs if g["outcome"] == "preempted"):  # a gang: every node pod's loss and respin
        nxt = next((b for b in gangs if b["step"] == a["step"] and b["gang"] == a["gang"]
                    and b["attempt"] == a["attempt"] + 1), None)
        lost_gpu_s, respin_gpu_s, kept, lost, resumed = _gang_waste(a, nxt, row_of, steps)
        kept_before += kept
        if resumed is not None and a["disrupted_at"] is not None:
            recover.append(resumed - a["disrupted_at"])
        a["lost_s"] = None if lost is None else round(lost, 6)
        a["respin_s"] = None if nxt is None or resumed is None else round(
            resumed - min(_gpu_start(row_of[p]) or resumed for p in nxt["pods"]), 6)
        a["waste_gpu_hours"] = (lost_gpu_s + respin_gpu_s) / 3600.0
        a["waste_usd"] = None if price is None else a["waste_gpu_hours"] * price
        waste_s += lost_gpu_s + respin_gpu_s
    gang_preempted_h = sum(a["gpu_hours"] for a in gangs if a["outcome"] == "preempted")
    for a in preempted:
        row = row_of[a["pod"]]
        at = a["disrupted_at"] or row.get("finished")
        events = _attempt_events(steps, a["step"], a["attempt"])
        saved = events.get(CHECKPOINT_EVENT)
        since = saved if saved is not None else _gpu_start(row)
        lost = max(0.0, at - since) if at is not None and since is not None else 0.0
        if saved is not None and events.get("first_step") is not None:
            kept_before += max(0.0, saved - events["first_step"])
        nxt = next((b for b in attempts if b["step"] == a["step"] and b["attempt"] == a["attempt"] + 1), None)
        respin = 0.0
        if nxt is not None:
            nrow = row_of[nxt["pod"]]
            nev = _attempt_events(steps, a["step"], nxt["attempt"])
            resumed = nev.get("first_step", nev.get("model_loaded"))
            gstart = _gpu_start(nrow)
            if resumed is not None and gstart is not None:
                respin = max(0.0, resumed - gstart)
            if resumed is not None and at is not None:
                recover.append(resumed - at)
        a["lost_s"], a["respin_s"] = round(lost, 6), round(respin, 6)
        a["waste_gpu_hours"] = a["gpus"] * (lost + respin) / 3600.0
        a["waste_usd"] = None if price is None else a["waste_gpu_hours"] * price
        waste_s += a["gpus"] * (lost + respin)
        by_pod[a["pod"]] = a
    pod_preempted_h = sum(a["gpu_hours"] for a in preempted)  # a gang's pods are never in retry_gpu_hours
    train = steps.get("finetune")
    last_train = train.metrics.get("train_s") if train is not None else None
    failure_h = None if retry_gpu_hours is None else max(0.0, retry_gpu_hours - pod_preempted_h)
    n_gang = sum(a["outcome"] == "preempted" for a in gangs)
    attempts = sorted(attempts + gangs, key=lambda a: (a["step"], bool(a.get("gang")), a["attempt"]))
    metrics: dict[str, float | None] = {
        "preemptions": float(len(preempted) + n_gang),
        "preempted_gpu_hours": pod_preempted_h + gang_preempted_h,
        "preemption_waste_gpu_hours": waste_s / 3600.0,
        "preemption_waste_usd": None if price is None else waste_s / 3600.0 * price,
        "time_to_recover_s": max(recover) if recover else None,
        "failure_retry_gpu_hours": failure_h,
        "failure_retry_usd": None if price is None or failure_h is None else failure_h * price,
        "kept_train_s": None if last_train is None else last_train + kept_before,
    }
    return metrics, attempts
