"""One fake cluster out of the three stand-ins: KFP, Argo and MLflow runs that "run" on Kubernetes.

(Its plan of a submitted run, tasks and virtual times, is :mod:`standins.cluster_plan`; what
each orchestrator's submission plays, :mod:`standins.players`; a TrainJob gang's pods and
ranks, :mod:`standins.fake_gang`.)

When the KFP stand-in receives a run, the Argo stand-in a Workflow, or the Kubernetes stand-in
a Job, :class:`FakeCluster` plays what the cluster would do, into the Kubernetes stand-in: each
orchestrator's pods labelled as it labels them, tasks in dependency order (a fused task one pod),
a GPU node brought up by the autoscaler and its image pulled (or ``prepulled``), each step's
events written to the run's MLflow record, the run reported finished or failed; a TrainJob gang's
launcher and node pods. Time is virtual and compressed (:class:`Timings`), consistent to the
second; :attr:`FakeCluster.scripts` keeps every run's timestamps for the test to compare.

What it plays, in full: docs/internals/stand-ins.md, "The fake cluster".
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

from components.record import tracking
from components.record.telemetry import RunContext, make_record
from standins.cluster_plan import _DEFAULT_COMPUTE_S as _DEFAULT_COMPUTE_S
from standins.cluster_plan import IMAGE as IMAGE
from standins.cluster_plan import KFP_LAUNCHER
from standins.cluster_plan import STEPS as STEPS
from standins.cluster_plan import RunScript as RunScript
from standins.cluster_plan import Timings as Timings
from standins.cluster_plan import _floor as _floor
from standins.cluster_plan import _suffix as _suffix
from standins.cluster_plan import command_params as command_params
from standins.cluster_plan import fused_members as fused_members
from standins.fake_gang import GangPlayer
from standins.k8s_api import _iso, iter_pod_states, node_object, pull_events
from standins.k8s_objects import present_event
from standins.players import OrchestratorPlayers


class FakeCluster(OrchestratorPlayers, GangPlayer):
    """Makes the stand-ins one cluster; use as a context manager, or ``start()`` / ``close()``."""

    def __init__(
        self,
        kube: Any,
        *,
        tracking_uri: str,
        kfp: Any = None,
        argo: Any = None,
        kfp_namespace: str = "kubeflow",
        gpu_product: str | None = "NVIDIA-H200",
        instance_type: str = "p5en.48xlarge",
        cpu_instance_type: str = "m6i.4xlarge",
        timings: Timings | None = None,
        pace_s: float = 0.002,
        fail: Mapping[str, str] | None = None,
        scale_down_s: int | None = None,
        prepulled: bool = False,
        node_paces: Any = None,
        gpu_node_hook: Any = None,
        on_exit: Any = None,
        preempt: Any = None,
    ) -> None:
        self.kube, self.kfp, self.argo = kube, kfp, argo
        self.tracking_uri = tracking_uri
        self.kfp_namespace = kfp_namespace
        self.gpu_product = gpu_product
        self.instance_type = instance_type
        self.timings = timings or Timings()
        self.pace_s = pace_s
        self.fail = dict(fail or {})
        self.scale_down_s = scale_down_s
        self.prepulled = prepulled  # GPU nodes come up with the image on them: no pull
        self.node_paces = node_paces  # standins.node_paces.NodePaces: gang nodes drawn, not cycled
        # node object -> node object, for every GPU node (standins.opencost.spot_nodes)
        self.gpu_node_hook = gpu_node_hook
        self.on_exit = on_exit  # standins.exit_task.ExitTask: the pipeline's closing task, played before the end
        self.preempt = preempt  # standins.preemption.Preemption: a GPU pod taken away mid-step, then retried
        self.scripts: dict[str, RunScript] = {}
        self.errors: list[BaseException] = []
        self._seen: set[Any] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._nodes = 0
        self._mc: Any = None
        # The orchestrators report the end when the pods are done, not after N reads.
        if kfp is not None:
            kfp.run_states = ["PENDING", "RUNNING"]
        if argo is not None:
            argo.phases = ["Pending", "Running"]
            argo.watch_pods(kube)  # status.nodes[].resourcesDuration from the pods played here

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeCluster:
        now = time.time()
        self.kube.add_node(node_object("ip-10-0-1-23.ec2.internal", created=now - 86400, ready=now - 86300,
                                       instance_type="m6i.4xlarge"))
        self.kube.on_job_created = self._on_job
        if self.kfp is not None or self.argo is not None:
            self._spawn(self._poll, "fake-cluster-poll")
        return self

    def close(self) -> None:
        self._stop.set()
        self.kube.on_job_created = None
        for thread in list(self._threads):
            thread.join(5.0)

    def __enter__(self) -> FakeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until every run seen so far has been played out (raises what a player raised)."""
        end = time.monotonic() + timeout
        for script in list(self.scripts.values()):
            script.done.wait(max(0.0, end - time.monotonic()))
        if self.errors:
            raise self.errors[0]

    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # surfaced by wait_idle()
                self.errors.append(exc)

        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _client(self) -> Any:
        with self._lock:
            if self._mc is None:
                self._mc = tracking.client(self.tracking_uri)
            return self._mc

    # ------------------------------------------------------------------ observing submissions

    def _poll(self) -> None:
        while not self._stop.wait(0.005):
            if self.kfp is not None:
                with self.kfp._lock:
                    runs = [copy.deepcopy(r) for k, r in self.kfp.runs.items() if ("kfp", k) not in self._seen]
                for run in runs:
                    self._seen.add(("kfp", run["run_id"]))
                    self._spawn(self._play_kfp, f"fake-kfp-{run['run_id'][:8]}", run)
            if self.argo is not None:
                with self.argo._lock:
                    wfs = [copy.deepcopy(w) for k, w in self.argo.workflows.items() if ("argo", k) not in self._seen]
                for wf in wfs:
                    self._seen.add(("argo", (wf["metadata"]["namespace"], wf["metadata"]["name"])))
                    self._spawn(self._play_argo, f"fake-argo-{wf['metadata']['name']}", wf)

    def _on_job(self, job: dict[str, Any]) -> None:
        self._spawn(self._play_mlflow, f"fake-job-{job['metadata']['name']}", job)

    # ------------------------------------------------------------------ scripting

    def _new_gpu_node(self, pod_created: int) -> dict[str, Any]:
        with self._lock:
            self._nodes += 1
            n = self._nodes
        t = self.timings
        created = pod_created + t.node_create_s
        return {"name": f"ip-10-2-{n}-{n * 7 % 250}.ec2.internal", "created": created,
                "ready": created + t.node_ready_s}

    def _step_events(self, script: RunScript, step: str, process_started: float) -> float:
        """The in-container events of one step from its process start; returns ``finished``."""
        t = self.timings
        ev = {"process_started": round(process_started, 6)}
        cursor = process_started
        if step in t.load_s:
            cursor += t.load_s[step]
            ev["model_loaded"] = round(cursor, 6)
        if step == "finetune":
            cursor += t.first_step_s
            ev["first_step"] = round(cursor, 6)
        cursor += t.compute_s.get(step, _DEFAULT_COMPUTE_S)
        ev["finished"] = round(cursor, 6)
        script.events[step] = ev
        if step == "prepare-data":
            script.metrics[step] = {"rows": 512.0}
        elif step == "finetune":
            train_s = round(ev["finished"] - ev["first_step"] + 0.4, 6)
            tokens = 60 * 8 * 128.0
            script.metrics[step] = {"train_s": train_s, "train_tokens": tokens, "tokens_per_s": tokens / train_s}
        elif step == "evaluate":
            script.metrics[step] = {"eval_loss": 1.25, "base_eval_loss": 3.5, "perplexity": math.exp(1.25)}
        return ev["finished"]

    def _pod_times(self, script: RunScript, created: int, gpu: bool, first_gpu: bool) -> dict[str, Any]:
        """created/scheduled/initialized/started for one pod; a new GPU node for the first GPU pod."""
        t = self.timings
        times: dict[str, Any] = {"created": created}
        if gpu and first_gpu:
            node = self._new_gpu_node(created)
            script.node = node
            times.update(node=node["name"], node_created=node["created"], node_ready=node["ready"],
                         scheduled=node["ready"] + t.bind_s)
            times["initialized"] = times["scheduled"] + t.init_s
            if self.prepulled:  # the image came with the node: "already present on machine"
                times["pull_s"] = 0
                times["started"] = times["initialized"] + t.start_s
            else:
                times["pulling"] = times["initialized"]
                times["pulled"] = times["pulling"] + t.pull_s
                times["pull_s"] = t.pull_s
                times["started"] = times["pulled"] + t.start_s
        else:
            times["node"] = script.node["name"] if gpu else "ip-10-0-1-23.ec2.internal"
            times["scheduled"] = created + t.schedule_s
            times["initialized"] = times["scheduled"] + t.init_s
            times["pull_s"] = 0
            times["started"] = times["initialized"] + t.start_s
        return times

    def _gpu_node_object(self, node: Mapping[str, Any]) -> dict[str, Any]:
        obj = node_object(node["name"], created=node["created"], ready=node["ready"],
                          instance_type=self.instance_type, gpu_product=self.gpu_product)
        gpus = str(node.get("gpus") or 8)
        obj["metadata"]["labels"].update({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": gpus})
        obj["status"]["capacity"]["nvidia.com/gpu"] = gpus
        return obj

    # ------------------------------------------------------------------ playing

    def _pod_actions(self, states: list[dict[str, Any]], times: dict[str, Any], *, namespace: str,
                     container: str, node: dict[str, Any] | None) -> list[tuple[float, int, str, Any]]:
        """(virtual time, order, kind, object) for a pod's states, its node and its image events."""
        name = states[0]["metadata"]["name"]
        when = [times["created"], times["scheduled"], times["initialized"], times["started"], times["finished"]]
        actions: list[tuple[float, int, str, Any]] = [(w, 2, "pod", s) for w, s in zip(when, states, strict=True)]
        if node is not None:
            obj = node_object(node["name"], created=node["created"], ready=node["ready"],
                              instance_type=self.instance_type, gpu_product=self.gpu_product)
            if self.gpu_product is None:
                obj["metadata"]["labels"].update({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8"})
            actions.append((node["created"], 0, "node", obj))
        if times.get("pull_s"):
            for ev in pull_events(name, namespace=namespace, container=container, image=IMAGE,
                                  pulling=times["pulling"], pulled=times["pulled"],
                                  message_seconds=f"{times['pull_s']}s"):
                actions.append((times["started"], 1, "event", ev))
        else:
            actions.append((times["started"], 1, "event",
                            present_event(states[0], namespace, container, times["started"], image=IMAGE)))
        return actions

    def _removal(self, script: RunScript) -> list[tuple[float, int, str, Any]]:
        """The GPU node's removal, ``scale_down_s`` after the last pod on it finished (see the module doc)."""
        if self.scale_down_s is None or not script.node:
            return []
        node = script.node
        last = max(p["finished"] for p in script.pods.values() if p.get("node") == node["name"])
        node["removed"] = last + self.scale_down_s
        obj = node_object(node["name"], created=node["created"], ready=node["ready"],
                          instance_type=self.instance_type, gpu_product=self.gpu_product)
        if self.gpu_product is None:  # as _pod_actions
            obj["metadata"]["labels"].update({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8"})
        obj["metadata"]["deletionTimestamp"] = _iso(node["removed"])
        obj["metadata"]["finalizers"] = ["karpenter.sh/termination"]
        obj["spec"]["taints"] = [{"key": "ToBeDeletedByClusterAutoscaler", "value": str(node["removed"]),
                                  "effect": "NoSchedule"}]
        out = [(node["removed"], 0, "node", obj)]
        for p in (script.gang or {}).get("pods") or ():  # each gang node, after its one pod
            if p.get("replaced"):  # a preempted gang's pod: its node runs the restarted gang's
                continue
            gnode = p["node_obj"]
            gnode["removed"] = p["finished"] + self.scale_down_s
            gobj = self._gpu_node_object(gnode)
            gobj["metadata"]["deletionTimestamp"] = _iso(gnode["removed"])
            gobj["metadata"]["finalizers"] = ["karpenter.sh/termination"]
            gobj["spec"]["taints"] = [{"key": "ToBeDeletedByClusterAutoscaler", "value": str(gnode["removed"]),
                                       "effect": "NoSchedule"}]
            out.append((gnode["removed"], 0, "node", gobj))
        return out

    def _play(self, script: RunScript, actions: list[tuple[float, int, str, Any]], finish: Any) -> None:
        actions = actions + self._removal(script)
        try:
            for _, _, kind, obj in sorted(actions, key=lambda a: (a[0], a[1])):
                if self._stop.is_set():
                    return
                if kind == "pod":
                    self.kube.apply_pod(obj)
                elif kind == "node":
                    self.kube.add_node(self.gpu_node_hook(obj) if self.gpu_node_hook else obj)
                elif kind == "event":
                    self.kube.add_event(obj)
                elif kind == "delete":
                    self.kube.delete_pod(*obj)
                elif kind == "mlflow":
                    self._log_step(script, obj)
                elif kind in ("trainjob", "workload"):
                    self.kube.apply_custom_object(obj)
                elif kind == "trainjob_done":
                    self.kube.set_trainjob_condition(*obj, "Complete", reason="AllJobsCompleted",
                                                     message="jobset completed successfully")
                if self.pace_s:
                    time.sleep(self.pace_s)
            if self.on_exit is not None and not self._stop.is_set():
                self.on_exit(script)
            finish()
        finally:
            script.done.set()

    def _log_step(self, script: RunScript, step: str) -> None:
        """What the step's runtime uploads at its end: its events and metrics, to the pipeline record."""
        ctx = RunContext(run_group=script.run_group, pipeline_run=script.pipeline_run,
                         orchestrator=script.orchestrator, mode="cluster", submitted_at=script.submitted_at)
        mc = self._client()
        # The client creates the record right after the orchestrator accepted the run; a step
        # starts seconds later on a real cluster. Wait for it rather than race it.
        end = time.monotonic() + 10.0
        run_id = tracking.find_pipeline_run(mc, script.pipeline_run)
        while run_id is None and time.monotonic() < end:
            time.sleep(0.02)
            run_id = tracking.find_pipeline_run(mc, script.pipeline_run)
        if run_id is None:
            run_id = tracking.open_pipeline_run(mc, ctx)
        attempts = (self.preempt.attempts(script, step) if self.preempt is not None else None) or [script.events[step]]
        records = [make_record(ctx, "event", step, k, v, n) for n, ev in enumerate(attempts) for k, v in ev.items()]
        records += [make_record(ctx, "metric", step, k, v, len(attempts) - 1)
                    for k, v in script.metrics.get(step, {}).items()]
        tracking.log_records(mc, run_id, records)

    # ------------------------------------------------------------------ pods

    def _states(self, pod: str, namespace: str, labels: dict[str, str], annotations: dict[str, str],
                times: Mapping[str, Any], *, argo: bool, image: str, main: str = "main",
                gpu: bool = False) -> list[dict[str, Any]]:
        states = list(iter_pod_states(
            pod, namespace=namespace, labels=labels, annotations=annotations, created=times["created"],
            scheduled=times["scheduled"], node=times["node"], sandbox=times["scheduled"],
            initialized=times["initialized"], started=times["started"], finished=times["finished"],
            failed=bool(times.get("failed")), main=main, argo=argo,
            image=image,
        ))
        assert len(states) == 5, pod
        for st in states:
            res = st["spec"]["containers"][-1].setdefault("resources", {})
            if not gpu:
                res["limits"] = {k: v for k, v in (res.get("limits") or {}).items() if k != "nvidia.com/gpu"}
            if argo and any(k.startswith("pipelines.kubeflow.org") for k in labels):
                st["spec"]["initContainers"].append({"name": "kfp-launcher", "image": KFP_LAUNCHER})
        return states
