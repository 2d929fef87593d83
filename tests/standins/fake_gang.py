"""The fake cluster's TrainJob gang (``--nodes N``): N node pods, each on its own new GPU node
brought up, pulled and started at its own pace, every rank's events, the TrainJob's conditions,
and a preemption of one node pod (:class:`GangPlayer`, a mixin of
:class:`~standins.fake_cluster.FakeCluster`, which owns the state these use).
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from standins.cluster_plan import _DEFAULT_COMPUTE_S, IMAGE, RunScript, Timings, _floor, _suffix, _uid
from standins.k8s_api import _iso


class GangPlayer:
    """Plays a finetune TrainJob gang for :class:`~standins.fake_cluster.FakeCluster`."""

    timings: Timings
    node_paces: Any
    preempt: Any
    prepulled: bool
    gpu_product: str | None
    instance_type: str
    kube: Any
    _lock: threading.Lock
    _nodes: int

    def _gang_events(self, script: RunScript, step: str, process_started: float, gang: tuple[int, Any]) -> float:
        """The launcher's events and its TrainJob gang (pods, nodes, ranks) from the launcher's
        process start; returns the launcher's ``finished`` (see the module doc)."""
        from components.trainjob.gang import trainjob_name

        t = self.timings
        nodes, spec = gang
        gpus = max(1, int(spec.gpus_per_node))
        world = nodes * gpus

        def cycle(values: tuple[int, ...], i: int) -> int:
            return values[i % len(values)]

        ev: dict[str, float] = {"process_started": round(process_started, 6)}
        created_tj = round(process_started + t.trainjob_s, 6)
        ev["trainjob_created"] = created_tj
        name = trainjob_name(script.pipeline_run, step, 0)
        workload = None
        if spec.queue:  # Kueue admits it first: JobSet's pods appear only once it is unsuspended
            created_wl = _floor(created_tj) + 1
            workload = {"created": created_wl, "quota_reserved": created_wl + t.kueue_quota_s,
                        "admitted": created_wl + t.kueue_quota_s + t.kueue_admit_s}
        pods_created = (workload["admitted"] if workload else _floor(created_tj)) + t.gang_pods_s
        pods = []
        for i in range(nodes):
            with self._lock:
                self._nodes += 1
                n = self._nodes
            paces = self.node_paces.draw() if self.node_paces is not None else tuple(
                cycle(v, i) for v in (t.gang_node_create_s, t.gang_node_ready_s, t.gang_pull_s, t.gang_start_s))
            node_created = pods_created + paces[0]
            node = {"name": f"ip-10-3-{n}-{n * 11 % 250}.ec2.internal", "created": node_created,
                    "ready": node_created + paces[1], "gpus": gpus}
            times: dict[str, Any] = {"created": pods_created, "node": node["name"], "node_created": node["created"],
                                     "node_ready": node["ready"], "scheduled": node["ready"] + t.bind_s, "index": i,
                                     "pod": f"{name}-node-0-{i}-{_suffix(name + str(i), 5)}"}
            times["initialized"] = times["scheduled"] + t.init_s
            if self.prepulled:
                times["pull_s"] = 0
                times["started"] = times["initialized"] + paces[3]
            else:
                pull = paces[2]
                times.update(pulling=times["initialized"], pulled=times["initialized"] + pull, pull_s=pull)
                times["started"] = times["pulled"] + paces[3]
            pods.append({**times, "node_obj": node})
        # torchrun's rendezvous waits for every node: the ranks load once the last pod started.
        rendezvous = max(p["started"] for p in pods) + t.process_s
        load = t.load_s.get(step, 0.0)
        ranks: dict[int, dict[str, float]] = {}
        for p in pods:
            for local in range(gpus):
                r = p["index"] * gpus + local
                ranks[r] = {"process_started": round(p["started"] + t.process_s + 0.01 * local, 6),
                            "model_loaded": round(rendezvous + load + t.rank_load_s * r, 6)}
        loaded = max(v["model_loaded"] for v in ranks.values())
        first = round(loaded + t.first_step_s, 6)  # the first optimizer step is collective: the slowest rank's
        for r, v in ranks.items():
            v["first_step"] = round(first - 0.001 * (world - 1 - r), 6)
            v["finished"] = round(first + t.compute_s.get(step, _DEFAULT_COMPUTE_S) + 0.001 * r, 6)
        for p in pods:
            mine = [ranks[p["index"] * gpus + local]["finished"] for local in range(gpus)]
            p["finished"] = _floor(max(mine)) + 1
        complete = max(p["finished"] for p in pods)
        for r in sorted(ranks):
            for k, v in ranks[r].items():
                ev[f"{k}.rank{r}"] = v
        last = ranks[world - 1]
        ev["model_loaded"], ev["first_step"] = last["model_loaded"], last["first_step"]
        ev["finished"] = round(complete + t.launcher_poll_s + t.copy_back_s, 6)
        script.events[step] = ev
        train_s = round(max(v["finished"] for v in ranks.values()) - first + 0.4, 6)
        tokens = 60 * 8 * 128.0
        script.metrics[step] = {"train_s": train_s, "train_tokens": tokens, "tokens_per_s": tokens / train_s,
                                "world_size": float(world)}
        script.gang = {"trainjob": name, "nodes": nodes, "gpus_per_node": gpus, "world_size": world,
                       "created": created_tj, "complete": complete, "pods": pods, "spec": spec, "step": step,
                       "workload": workload}
        return ev["finished"]

    def _gang_actions(self, script: RunScript, namespace: str) -> list[tuple[float, int, str, Any]]:
        """The TrainJob, its node pods, their nodes and image events, and its Complete condition."""
        if not script.gang:
            return []
        from components.trainjob.gang import build_trainjob, gang_labels, trainer_command, trainer_env

        gang = script.gang
        spec, name, step = gang["spec"], gang["trainjob"], gang["step"]
        labels = gang_labels(spec, run_group=script.run_group, pipeline_run=script.pipeline_run,
                             orchestrator=script.orchestrator, step=step)
        command = trainer_command(f"components.steps.{step}:{step}", {"tokens": "/gang/in/tokens"},
                                  {"model": "/gang/out/model"}, {"pipeline_run": script.pipeline_run})
        obj = build_trainjob(spec, name=name, namespace=namespace, nodes=gang["nodes"], command=command,
                             labels=labels,
                             env=trainer_env(spec, 0))
        gang["object"] = obj
        patch = (obj["spec"].get("runtimePatches") or [{}])[0]
        jobs = ((((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {})
                .get("replicatedJobs") or [])
        pod_labels = dict(((((jobs[0] if jobs else {}).get("template") or {}).get("spec") or {}).get("template") or {})
                          .get("metadata", {}).get("labels") or {})
        actions: list[tuple[float, int, str, Any]] = [(gang["created"], 1, "trainjob", obj)]
        wl = gang.get("workload")
        if wl:  # Kueue's Workload for it: created pending, then QuotaReserved and Admitted
            workload = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                        "metadata": {"name": f"trainjob-{name}-{_suffix(name, 5)}", "namespace": namespace,
                                     "creationTimestamp": _iso(wl["created"]),
                                     "labels": {"kueue.x-k8s.io/job-uid": _uid(f"{namespace}/{name}")},
                                     "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                                          "kind": "TrainJob",
                                                          "name": name, "uid": _uid(f"{namespace}/{name}"),
                                                          "controller": True, "blockOwnerDeletion": True}]},
                        "spec": {"queueName": spec.queue, "podSets": [{"name": "node", "count": gang["nodes"]}]},
                        "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                                   "message": "couldn't assign flavors to pod set node",
                                                   "lastTransitionTime": _iso(wl["created"])}]}}
            admitted = copy.deepcopy(workload)
            admitted["status"] = {"admission": {"clusterQueue": "gpu-cluster-queue"}, "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                 "message": "Quota reserved in ClusterQueue gpu-cluster-queue",
                 "lastTransitionTime": _iso(wl["quota_reserved"])},
                {"type": "Admitted", "status": "True", "reason": "Admitted",
                 "message": "The workload is admitted", "lastTransitionTime": _iso(wl["admitted"])}]}
            actions += [(wl["created"], 1, "workload", workload), (wl["admitted"], 1, "workload", admitted)]
        job = f"{name}-node-0"
        for p in gang["pods"]:
            uid = _uid(f"{namespace}/{job}")
            index = str(p["index"])
            pl = {**pod_labels,
                  "jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/jobset-uid": _uid(f"{namespace}/{name}"),
                  "jobset.sigs.k8s.io/replicatedjob-name": "node", "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
                  "jobset.sigs.k8s.io/job-index": "0", "jobset.sigs.k8s.io/job-global-index": "0",
                  "jobset.sigs.k8s.io/restart-attempt": str(p.get("restart", 0)),
                  "batch.kubernetes.io/job-completion-index": index, "batch.kubernetes.io/job-name": job,
                  "job-name": job, "batch.kubernetes.io/controller-uid": uid, "controller-uid": uid}
            annotations = {"batch.kubernetes.io/job-completion-index": index, "jobset.sigs.k8s.io/jobset-name": name,
                           "jobset.sigs.k8s.io/replicatedjob-name": "node"}
            states = self._states(p["pod"], namespace, pl, annotations, p, argo=False, image=spec.image or IMAGE,
                                  main="node", gpu=True)
            for st in states:
                st["spec"].update(hostname=f"{job}-{index}", subdomain=name)
                st["spec"]["containers"][-1]["resources"] = {
                    "limits": {"nvidia.com/gpu": str(gang["gpus_per_node"])},
                    "requests": {"nvidia.com/gpu": str(gang["gpus_per_node"])}}
                st["spec"]["containers"][-1]["command"] = obj["spec"]["trainer"]["command"]
            played = self._pod_actions(states, p, namespace=namespace, container="node", node=None)
            actions += self.preempt.gang_pod(p, states, played, namespace) if self.preempt is not None else played
            node = p["node_obj"]
            actions.append((node["created"], 0, "node", self._gpu_node_object(node)))
        actions.append((gang["complete"], 4, "trainjob_done", (namespace, name)))
        return actions

    def _gang_preempted(self, script: RunScript, step: str) -> float | None:
        """standins.gang_preemption: a node pod preempted, the gang restarted whole; the launcher's new end."""
        return self.preempt.script_gang(self, script, step) if self.preempt is not None else None
