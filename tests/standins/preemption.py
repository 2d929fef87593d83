"""The loopback cluster preempts a GPU pod: what a spot reclaim or a scheduler preemption looks like.

:class:`Preemption` (``FakeCluster(preempt=Preemption.parse("finetune@4s"))``) takes the step's
GPU pod away ``at_s`` virtual seconds after its container started (or at the moments a rate
draws, the same seed for every path: :meth:`llmpack.cluster.k8s.preemption.PreemptSpec.moments`), the
way Kubernetes does it.

In full: docs/internals/stand-ins.md, "A preempted GPU pod".
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from llmpack.cluster.k8s.preemption import CHECKPOINT_EVENT, RESUMED_METRIC, PreemptSpec, parse_preempt
from standins.gang_preemption import end_states, gang_pod_end, script_gang
from standins.k8s_api import _iso, status_object

STEPS_PER_S = 10.0  # virtual optimizer steps per second of training (what resumed_from_step counts)


@dataclass
class Preemption:
    """A preemption plan for the fake cluster; keeps what it did per run (``done``)."""

    spec: PreemptSpec
    checkpoint_every_s: float = 1.5
    grace_s: int = 1
    retry_gap_s: int = 2
    reason: str = "PreemptionByScheduler"
    real: Any = None  # standins.real_pods.RealFinetune: the real step, SIGTERMed at the moment, says what it kept
    # (pipeline_run, task) -> the preempted attempt
    done: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, **options: Any) -> Preemption:
        from standins.fake_cluster import STEPS

        return cls(spec=parse_preempt(text, STEPS), **options)

    def target(self, members: tuple[str, ...], gpu: bool) -> bool:
        return gpu and self.spec.step in members

    def script_step(self, cluster: Any, script: Any, task: str, times: dict[str, Any], process_started: float,
                    step_events: Any) -> tuple[dict[str, Any], float] | None:
        """Plan the preempted attempt and its retry from the first pod's ``times``; (the retry's times, the
        step's ``finished``), or None when no moment falls inside the step's run (it runs whole)."""
        t = cluster.timings
        full = step_events(script, self.spec.step, process_started)  # the uninterrupted run: its events
        first = dict(script.events[self.spec.step])
        moments = self.spec.moments(full - times["started"])
        if not moments:
            return None
        at = math.ceil(times["started"] + moments[0])  # Kubernetes stamps whole seconds
        trained_from = first.get("first_step", first.get("model_loaded", process_started))
        saves = [trained_from + k * self.checkpoint_every_s
                 for k in range(1, int((at - trained_from) / self.checkpoint_every_s) + 1)] if at > trained_from else []
        ev0 = {k: v for k, v in first.items() if v < at and k != "finished"}
        if saves:
            ev0[CHECKPOINT_EVENT] = round(saves[-1], 6)
        kept_s = (saves[-1] - trained_from) if saves else 0.0
        resumed_step = float(int(kept_s * STEPS_PER_S))
        if self.real is not None:
            ev0[CHECKPOINT_EVENT], kept_s, resumed_step = self._real(cluster, script, trained_from, at)
        pod0 = {**times, "finished": at + self.grace_s, "failed": True, "disrupted": at}
        retry = cluster._pod_times(script, at + self.retry_gap_s, True, False)
        retry["gpu"] = True
        start = retry["started"] + t.process_s
        resumed = step_events(script, self.spec.step, start)  # the retry's events, then shortened below
        ev1 = dict(script.events[self.spec.step])
        compute = t.compute_s.get(self.spec.step, 1.0)
        ev1["finished"] = round(resumed - min(kept_s, compute), 6)
        script.events[self.spec.step] = ev1
        metrics = dict(script.metrics.get(self.spec.step) or {})
        if "train_s" in metrics:
            metrics["train_s"] = round(max(0.0, metrics["train_s"] - kept_s), 6)
        metrics[RESUMED_METRIC] = resumed_step
        script.metrics[self.spec.step] = metrics
        self.done[(script.pipeline_run, task)] = {"times": pod0, "events": ev0, "at": at, "kept_s": kept_s,
                                                  "began": times["started"],
                                                  "checkpoint": ev0.get(CHECKPOINT_EVENT), "retry": retry,
                                                  "attempts": {self.spec.step: [ev0]}}
        return retry, ev1["finished"]

    def script_gang(self, cluster: Any, script: Any, step: str) -> float | None:
        """A node pod of the run's TrainJob gang preempted, the gang restarted whole
        (:mod:`standins.gang_preemption`)."""
        return script_gang(self, cluster, script, step) if self.spec.step == step else None

    def gang_pod(self, p: dict[str, Any], states: list[dict[str, Any]], actions: list[Any],
                 namespace: str) -> list[Any]:
        return gang_pod_end(self, p, states, actions, namespace)

    def script_job(self, cluster: Any, script: Any, times: dict[str, Any],
                   steps: tuple[str, ...]) -> dict[str, Any] | None:
        """The MLflow Job's one pod preempted in the step (``at_s`` after the step began in it); the Job's
        next pod reruns ``main`` from the start (the steps before, again), the step resumes from its
        checkpoint. Returns the retry pod's times, or None when no moment falls inside the step."""
        t = cluster.timings
        first = {s: dict(e) for s, e in script.events.items()}
        step_ev = first.get(self.spec.step)
        if step_ev is None or script.failed_step:
            return None
        began = step_ev["process_started"] - t.process_s
        moments = self.spec.moments(step_ev["finished"] - began)
        if not moments:
            return None
        at = math.ceil(began + moments[0])
        trained_from = step_ev.get("first_step", step_ev["process_started"])
        saves = [trained_from + k * self.checkpoint_every_s
                 for k in range(1, int((at - trained_from) / self.checkpoint_every_s) + 1)] if at > trained_from else []
        kept_s = (saves[-1] - trained_from) if saves else 0.0
        resumed_step = float(int(kept_s * STEPS_PER_S))
        before = {s: e for s, e in first.items() if e["process_started"] < at}
        before[self.spec.step] = {k: v for k, v in step_ev.items() if v < at and k != "finished"}
        if saves:
            before[self.spec.step][CHECKPOINT_EVENT] = round(saves[-1], 6)
        if self.real is not None:
            before[self.spec.step][CHECKPOINT_EVENT], kept_s, resumed_step = self._real(
                cluster, script, trained_from, at)
        retry = cluster._pod_times(script, at + self.retry_gap_s, True, False)
        cursor = retry["started"] + t.process_s
        for step in steps:  # main.py again: every step, the preempted one resumed
            cursor = cluster._step_events(script, step, cursor + t.mlflow_child_s)
            if step == self.spec.step:
                cursor -= min(kept_s, t.compute_s.get(step, 1.0))
                script.events[step]["finished"] = round(cursor, 6)
                metrics = dict(script.metrics.get(step) or {})
                if "train_s" in metrics:
                    metrics["train_s"] = round(max(0.0, metrics["train_s"] - kept_s), 6)
                metrics[RESUMED_METRIC] = resumed_step
                script.metrics[step] = metrics
        retry["finished"] = math.floor(cursor) + 1
        self.done[(script.pipeline_run, "main")] = {
            "times": {**times, "finished": at + self.grace_s, "failed": True}, "events": before[self.spec.step],
            "at": at, "began": began, "kept_s": kept_s, "checkpoint": before[self.spec.step].get(CHECKPOINT_EVENT),
            "retry": retry,
            "attempts": {s: [e] for s, e in before.items()}}
        return retry

    def _real(self, cluster: Any, script: Any, trained_from: float, at: float) -> tuple[float, float, float]:
        """(checkpoint_saved, kept_s, resumed_from_step) from the real step (:mod:`standins.real_pods`): its
        checkpoint written in the grace, the real delay after the moment; what the retry says it resumed."""
        compute = cluster.timings.compute_s.get(self.spec.step, 1.0)
        got = self.real.resume(script, (at - trained_from) / compute, self.grace_s)
        saved = round(at + got["delay_s"], 6)
        return saved, saved - trained_from, got["resumed"]

    def attempts(self, script: Any, step: str) -> list[dict[str, float]] | None:
        """The step's events per attempt (the preempted pod's first) when this run's pod was preempted."""
        found = next((d for (run, _), d in self.done.items() if run == script.pipeline_run), None)
        if found is None or step not in found["attempts"]:
            return None
        return [*found["attempts"][step], script.events[step]]

    def pod_actions(self, cluster: Any, script: Any, task: str, retry_state: dict[str, Any],
                    namespace: str) -> list[tuple[float, int, str, Any]]:
        """The preempted attempt's pod (named as the retry's, ``-p0``; on the node brought up for it),
        disrupted, failed and deleted."""
        from standins.fake_cluster import IMAGE

        found = self.done.get((script.pipeline_run, task))
        if found is None:
            return []
        meta = retry_state["metadata"]
        name = f"{meta['name']}-p0"
        annotations = dict(meta.get("annotations") or {})
        node_key = "workflows.argoproj.io/node-name"
        if node_key in annotations:
            annotations[node_key] = f"{annotations[node_key]}(0)"
        times = found["times"]
        containers = retry_state["spec"]["containers"]
        argo = any(c.get("name") == "wait" for c in containers)
        main = containers[-1]["name"]
        states = cluster._states(name, namespace, dict(meta.get("labels") or {}), annotations, times, argo=argo,
                                 image=IMAGE, gpu=True, main=main)
        for st in states:
            st["spec"]["containers"] = copy.deepcopy(retry_state["spec"]["containers"])
        node = script.node if "node_created" in times else None
        actions = [a for a in cluster._pod_actions(states, times, namespace=namespace, container=main, node=node)
                   if a[3] is not states[4]]
        at = found["at"]
        cond = {"type": "DisruptionTarget", "status": "True", "reason": self.reason, "lastProbeTime": None,
                "lastTransitionTime": _iso(at), "message": "Kubernetes Scheduler preempted this pod"}
        actions += end_states(states, at=at, finished=times["finished"], grace_s=self.grace_s, cond=cond,
                              namespace=namespace)
        return actions


def evict(api: Any, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
    """The API server's answer to ``POST .../pods/NAME/eviction`` with no PodDisruptionBudget in the way:
    the pod gets ``DisruptionTarget`` (``EvictionByEvictionAPI``) and a ``deletionTimestamp``, then is
    deleted; the request is kept in ``api.evictions``. (201, Status), or (404, Status) for no such pod."""
    import time

    with api._cond:
        obj = copy.deepcopy(api._pods.get((namespace, name)))
    if obj is None:
        return 404, status_object(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
    now = time.time()
    obj["status"].setdefault("conditions", []).append(
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "lastProbeTime": None,
         "lastTransitionTime": _iso(now), "message": "Eviction API: evicting"})
    obj["metadata"]["deletionTimestamp"] = _iso(now)
    api.apply_pod(obj)
    api.delete_pod(namespace, name)
    api.__dict__.setdefault("evictions", []).append((namespace, name))
    return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
