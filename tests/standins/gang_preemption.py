"""The loopback cluster preempts a node pod of a TrainJob gang, and JobSet restarts the gang whole.

With ``FakeCluster(preempt=Preemption.parse("finetune@4s"))`` and a 2-node TrainJob (``--nodes 2``),
the finetune step's GPUs are the gang's node pods, not the launcher's (a CPU pod). So
:func:`script_gang` plays, ``at_s`` virtual seconds after the gang's last node pod started (the
gang is ready then: torchrun's rendezvous waits for every node).

In full: docs/internals/stand-ins.md, "A preempted TrainJob gang".
"""

from __future__ import annotations

import copy
import math
from typing import Any

from llmpack.cluster.k8s.preemption import CHECKPOINT_EVENT, RESUMED_METRIC
from standins.k8s_api import _iso

GANG = "gang"  # the key of a gang's preemption in Preemption.done: (pipeline_run, GANG)


def end_states(states: list[dict[str, Any]], *, at: float, finished: float, grace_s: int,
               cond: dict[str, Any] | None, namespace: str) -> list[tuple[float, int, str, Any]]:
    """A pod told to go at ``at`` (``cond``, its DisruptionTarget, when it is the one preempted), terminated with
    exit 143 and Failed at ``finished``, then deleted: the actions that replace its last state."""
    name = states[0]["metadata"]["name"]
    disrupted, last = copy.deepcopy(states[3]), copy.deepcopy(states[4])  # told to go, then gone
    for st in (disrupted, last):
        if cond is not None:
            st["status"]["conditions"].append(dict(cond))
        st["metadata"]["deletionTimestamp"] = _iso(at + grace_s)
    for status in last["status"].get("containerStatuses") or ():
        term = (status.get("state") or {}).get("terminated")
        if term:
            term.update(exitCode=143, reason="Error")
    return [(at, 2, "pod", disrupted), (finished, 2, "pod", last), (finished, 3, "delete", (namespace, name))]


def script_gang(plan: Any, cluster: Any, script: Any, step: str) -> float | None:
    """Preempt ``script.gang`` (just scripted by the fake cluster's ``_gang_events``) and restart it whole;
    the launcher's new ``finished``, or None when no moment falls inside the gang's training."""
    from standins.fake_cluster import _DEFAULT_COMPUTE_S, _floor, _suffix

    t, gang = cluster.timings, script.gang
    ev = dict(script.events[step])
    old = gang["pods"]
    ready = max(p["started"] for p in old)
    end = max(v for k, v in ev.items() if k.startswith("finished.rank"))
    moments = plan.spec.moments(end - ready)
    if not moments:
        return None
    at = math.ceil(ready + moments[0])
    trained_from = ev["first_step"]
    saves = [trained_from + k * plan.checkpoint_every_s
             for k in range(1, int((at - trained_from) / plan.checkpoint_every_s) + 1)] if at > trained_from else []
    kept_s = (saves[-1] - trained_from) if saves else 0.0
    ev0 = {k: v for k, v in ev.items() if v < at and not k.startswith("finished")}
    if saves:
        ev0[CHECKPOINT_EVENT] = round(saves[-1], 6)
    resumed_step = float(int(kept_s * 10.0))  # standins.preemption.STEPS_PER_S
    if plan.real is not None:  # standins.real_gang: the real gang, SIGTERMed at the moment, says what it kept
        compute = t.compute_s.get(step, _DEFAULT_COMPUTE_S)
        got = plan.real.resume_gang(script, (at - trained_from) / compute, plan.grace_s)
        ev0[CHECKPOINT_EVENT] = round(at + got["delay_s"], 6)  # written in the grace, after the moment
        kept_s, resumed_step = ev0[CHECKPOINT_EVENT] - trained_from, got["resumed"]
    victim = old[-1]["index"]
    for p in old:
        p.update(finished=at + plan.grace_s, failed=True, replaced=True)
        if p["index"] == victim:
            p["disrupted"] = at
    created = at + plan.retry_gap_s
    name, gpus, world = gang["trainjob"], gang["gpus_per_node"], gang["world_size"]
    new = []
    for p in old:  # JobSet's restart: every node pod again, on its node (still there), the image present
        i = p["index"]
        times = {"created": created, "node": p["node"], "node_created": p["node_created"],
                 "node_ready": p["node_ready"],
                 "scheduled": created + t.bind_s, "index": i, "restart": 1, "pull_s": 0, "node_obj": p["node_obj"],
                 "pod": f"{name}-node-0-{i}-{_suffix(name + str(i) + 'restart1', 5)}"}
        times["initialized"] = times["scheduled"] + t.init_s
        times["started"] = times["initialized"] + t.gang_start_s[i % len(t.gang_start_s)]
        new.append(times)
    rendezvous = max(p["started"] for p in new) + t.process_s
    ev1: dict[str, float] = {}
    for p in new:
        for local in range(gpus):
            r = p["index"] * gpus + local
            ev1[f"process_started.rank{r}"] = round(p["started"] + t.process_s + 0.01 * local, 6)
            ev1[f"model_loaded.rank{r}"] = round(rendezvous + t.load_s.get(step, 0.0) + t.rank_load_s * r, 6)
    first = round(max(v for k, v in ev1.items() if k.startswith("model_loaded")) + t.first_step_s, 6)
    left = max(0.0, t.compute_s.get(step, _DEFAULT_COMPUTE_S) - kept_s)
    for r in range(world):
        ev1[f"first_step.rank{r}"] = round(first - 0.001 * (world - 1 - r), 6)
        ev1[f"finished.rank{r}"] = round(first + left + 0.001 * r, 6)
    for p in new:
        p["finished"] = _floor(max(ev1[f"finished.rank{p['index'] * gpus + g}"] for g in range(gpus))) + 1
    gang["pods"] = old + new
    gang["complete"] = max(p["finished"] for p in new)
    ev1["model_loaded"], ev1["first_step"] = ev1[f"model_loaded.rank{world - 1}"], ev1[f"first_step.rank{world - 1}"]
    ev1["finished"] = round(gang["complete"] + t.launcher_poll_s + t.copy_back_s, 6)
    script.events[step] = ev1
    metrics = dict(script.metrics.get(step) or {})
    metrics["train_s"] = round(max(0.0, metrics.get("train_s", 0.0) - kept_s), 6)
    metrics[RESUMED_METRIC] = resumed_step
    script.metrics[step] = metrics
    plan.done[(script.pipeline_run, GANG)] = {
        "at": at, "began": ready, "kept_s": kept_s, "checkpoint": ev0.get(CHECKPOINT_EVENT), "victim": victim,
        "old": [p["pod"] for p in old], "new": [p["pod"] for p in new],
        "retry": {"started": min(p["started"] for p in new)},
        "attempts": {step: [ev0]}}
    return ev1["finished"]


def gang_pod_end(plan: Any, p: dict[str, Any], states: list[dict[str, Any]], actions: list[Any],
                 namespace: str) -> list[Any]:
    """A node pod's actions: as played, or, for a pod of the preempted gang, ending at the restart."""
    if not p.get("replaced"):
        return actions
    cond = None
    if p.get("disrupted") is not None:
        cond = {"type": "DisruptionTarget", "status": "True", "reason": plan.reason, "lastProbeTime": None,
                "lastTransitionTime": _iso(p["disrupted"]), "message": "Kubernetes Scheduler preempted this pod"}
    return [a for a in actions if a[3] is not states[4]] + end_states(
        states, at=p["finished"] - plan.grace_s, finished=p["finished"], grace_s=plan.grace_s, cond=cond,
        namespace=namespace)
