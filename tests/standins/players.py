"""The fake cluster's orchestrator players: what the cluster does with a KFP run, an Argo
Workflow or an MLflow Job (:class:`OrchestratorPlayers`, a mixin of
:class:`~standins.fake_cluster.FakeCluster`, which owns the state these use and the shared
machinery: nodes, pod times, pod states and the play loop).

KFP and Argo run one pod per task (:meth:`OrchestratorPlayers._script_steps`); MLflow's Job runs
every step in its one pod. What each plays, in full: docs/internals/stand-ins.md, "The fake cluster".
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from standins.cluster_plan import (
    _PARAM_REF,
    IMAGE,
    KFP_DRIVER,
    STEPS,
    PlannedTask,
    RunScript,
    Timings,
    _floor,
    _hash_digits,
    _suffix,
    argo_tasks,
    command_params,
    gang_of,
    kfp_defaults,
    kfp_tasks,
)
from standins.k8s_api import _iso


class OrchestratorPlayers:
    """Plays each orchestrator's submission for :class:`~standins.fake_cluster.FakeCluster`."""

    timings: Timings
    kube: Any
    kfp: Any
    argo: Any
    kfp_namespace: str
    fail: dict[str, str]
    preempt: Any
    scripts: dict[str, RunScript]

    # ------------------------------------------------------------------ KFP and Argo: one pod per task

    def _script_steps(self, script: RunScript, kfp: bool, tasks: list[PlannedTask],
                      gang: tuple[int, Any] | None = None) -> int:
        """Per-task pods of KFP / Argo one after the other; returns the last pod's end.

        A fused task's members run back to back in its one pod: each member's process starts
        when the one before it finished (the hand-over the fusion keeps in one process).
        """
        t = self.timings
        cursor = _floor(script.submitted_at) + t.first_pod_s
        if kfp:
            root = {"name": "root", "created": cursor, "scheduled": cursor + 1, "initialized": cursor + 2,
                    "started": cursor + 3, "finished": cursor + 3 + t.kfp_driver_s}
            script.drivers.append(root)
            cursor = root["finished"] + t.step_gap_s
        first_gpu = True
        failing = self.fail.get(script.orchestrator)
        for task in tasks:
            if kfp:
                drv = {"name": task.name, "created": cursor, "scheduled": cursor + 1, "initialized": cursor + 2,
                       "started": cursor + 3, "finished": cursor + 3 + t.kfp_driver_s}
                script.drivers.append(drv)
                cursor = drv["finished"] + t.step_gap_s
            launcher = gang is not None and task.members == ("finetune",)
            gpu = task.gpu and not launcher  # the gang's launcher is a CPU pod: the GPUs are the TrainJob's
            times = self._pod_times(script, cursor, gpu, first_gpu and gpu)
            first_gpu = first_gpu and not gpu
            times["gpu"] = gpu
            finished = times["started"] + t.process_s
            ran: list[str] = []
            retried = None if self.preempt is None or task.fused or not self.preempt.target(task.members, gpu) else \
                self.preempt.script_step(self, script, task.name, times, finished, self._step_events)
            if retried is not None:  # standins.preemption: the preempted pod, then its retry's times
                (times, finished), ran = retried, list(task.members)
            for member in () if retried else task.members:
                if launcher:
                    finished = self._gang_events(script, member, finished, gang)
                    finished = self._gang_preempted(script, member) or finished
                else:
                    finished = self._step_events(script, member, finished)
                ran.append(member)
                if member == failing:
                    script.failed_step, script.failed_task = member, task.name
                    break
            times["finished"] = _floor(finished) + 1
            times["failed"] = script.failed_task == task.name
            script.pods[task.name] = times
            script.tasks[task.name] = tuple(ran)
            cursor = times["finished"] + t.step_gap_s
            if times["failed"]:
                break
        return cursor

    def _ran(self, script: RunScript) -> list[str]:
        """The steps that ran, in order (a fused pod's members in its place)."""
        return [step for task in script.pods for step in script.tasks.get(task, (task,))]

    @staticmethod
    def _fused_command(states: list[dict[str, Any]], task: PlannedTask) -> None:
        """A fused pod's main container runs the task's compiled command (naming its members);
        unfused pods keep the stand-in's generic one, as they always had."""
        if not task.fused or not task.command:
            return
        for st in states:
            main = st["spec"]["containers"][-1]
            main["command"], main["args"] = list(task.command[:1]), list(task.command[1:])

    # ------------------------------------------------------------------ the players (each step's record at its end)

    def _mlflow_actions(self, script: RunScript, steps: list[str]) -> list[tuple[float, int, str, Any]]:
        return [(script.events[s]["finished"], 3, "mlflow", s) for s in steps]

    # KFP ----------------------------------------------------------------

    def _play_kfp(self, run: dict[str, Any]) -> None:
        params = (run.get("runtime_config") or {}).get("parameters") or {}
        spec = run.get("pipeline_spec") or {}
        platform = spec.get("platform_spec") or {}
        executors = (((platform.get("platforms") or {}).get("kubernetes") or {}).get("deploymentSpec") or {}).get(
            "executors") or {}
        ns = self.kfp_namespace
        script = RunScript("kfp", str(params["pipeline_run"]), str(params["run_group"]),
                           float(params["submitted_at"]), ns)
        script.artifact = run
        self.scripts[script.pipeline_run] = script
        wf = f"llm-finetune-{_suffix(run['run_id'], 5)}"
        base = {"pipeline/runid": run["run_id"], "pipelines.kubeflow.org/v2_component": "true",
                "workflows.argoproj.io/workflow": wf}
        planned = {task.name: task for task in kfp_tasks(spec)}
        gang = gang_of({**kfp_defaults(spec), **params})
        self._script_steps(script, kfp=True, tasks=list(planned.values()), gang=gang)
        actions: list[tuple[float, int, str, Any]] = []
        for drv in script.drivers:
            kind = "system-dag-driver" if drv["name"] == "root" else "system-container-driver"
            node_name = f"{wf}.root-driver" if drv["name"] == "root" else f"{wf}.root.{drv['name']}-driver"
            pod = f"{wf}-{kind}-{_hash_digits(script.pipeline_run + node_name)}"
            states = self._states(pod, ns, dict(base), {"workflows.argoproj.io/node-name": node_name,
                                                        "pipelines.kubeflow.org/v2_component": "true"},
                                  {**drv, "node": "ip-10-0-1-23.ec2.internal"}, argo=True, image=KFP_DRIVER)
            for st in states:
                st["spec"]["containers"][-1]["command"] = ["driver"]
            actions += self._pod_actions(states, {**drv, "pull_s": 0}, namespace=ns, container="main", node=None)
        for step, times in script.pods.items():
            task = planned[step]
            labels = dict(((executors.get(task.source) or {}).get("podMetadata") or {}).get("labels") or {})
            labels.setdefault("llmpack.io/step", step)
            labels.update(base)
            node_name = f"{wf}.root.{step}.executor"
            pod = f"{wf}-system-container-impl-{_hash_digits(script.pipeline_run + node_name)}"
            states = self._states(pod, ns, labels, {"workflows.argoproj.io/node-name": node_name,
                                                    "pipelines.kubeflow.org/v2_component": "true"},
                                  times, argo=True, image=IMAGE, gpu=times.get("gpu", task.gpu))
            actions += self._task_pod_actions(script, step, task, states, times, ns)
        actions += self._gang_actions(script, ns) + self._mlflow_actions(script, self._ran(script))
        if self.preempt is not None:  # its preempted pod is deleted: a watcher started after that never sees it
            with contextlib.suppress(TimeoutError):  # (a real run's pods come seconds after the run: wait for the
                self.kube.wait_for_watches(1, 60.0, selecting=run["run_id"])  # watch the run's id selects)

        def finish() -> None:
            if script.failed_step:
                self.kfp.set_run_state(run["run_id"], "FAILED", f"task {script.failed_task} failed: exit code 1")
            else:
                self.kfp.set_run_state(run["run_id"], "SUCCEEDED")

        self._play(script, actions, finish)

    def _task_pod_actions(self, script: RunScript, step: str, task: PlannedTask, states: list[dict[str, Any]],
                          times: dict[str, Any], ns: str) -> list[tuple[float, int, str, Any]]:
        """A KFP executor's or an Argo step's pod played: its states, on the run's node, preempted if planned."""
        self._fused_command(states, task)
        node = script.node if "node_created" in times else None
        actions = self._pod_actions(states, times, namespace=ns, container="main", node=node)
        if self.preempt is not None:
            actions += self.preempt.pod_actions(self, script, step, states[0], ns)
        return actions

    # Argo ---------------------------------------------------------------

    def _play_argo(self, wf: dict[str, Any]) -> None:
        args = {p["name"]: p.get("value") for p in (wf["spec"].get("arguments") or {}).get("parameters") or []}
        ns, name = wf["metadata"]["namespace"], wf["metadata"]["name"]
        script = RunScript("argo", str(args["pipeline_run"]), str(args["run_group"]), float(args["submitted_at"]), ns)
        script.artifact = wf
        self.scripts[script.pipeline_run] = script
        templates = {t["name"]: t for t in wf["spec"].get("templates") or []}
        planned = {task.name: task for task in argo_tasks(wf)}

        def fill(value: str) -> str:
            return _PARAM_REF.sub(lambda m: str(args.get(m.group(1), "")), str(value))

        self._script_steps(script, kfp=False, tasks=list(planned.values()), gang=gang_of(args))
        actions: list[tuple[float, int, str, Any]] = []
        for step, times in script.pods.items():
            task = planned[step]
            tmpl = templates[task.source]
            meta = tmpl.get("metadata") or {}
            labels = {k: fill(v) for k, v in (meta.get("labels") or {}).items()}
            labels["workflows.argoproj.io/workflow"] = name
            annotations = {k: fill(v) for k, v in (meta.get("annotations") or {}).items()}
            annotations["workflows.argoproj.io/node-name"] = f"{name}.{step}"
            pod = f"{name}-{tmpl['name']}-{_hash_digits(name + step)}"
            states = self._states(pod, ns, labels, annotations, times, argo=True, image=IMAGE,
                                  gpu=times.get("gpu", task.gpu))
            actions += self._task_pod_actions(script, step, task, states, times, ns)
        actions += self._gang_actions(script, ns) + self._mlflow_actions(script, self._ran(script))

        def finish() -> None:
            if script.failed_step:
                self.argo.set_phase(ns, name, "Failed", f"child '{name}-{script.failed_task}' failed")
            else:
                self.argo.set_phase(ns, name, "Succeeded")

        self._play(script, actions, finish)

    # MLflow -------------------------------------------------------------

    def _play_mlflow(self, job: dict[str, Any]) -> None:
        t = self.timings
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        template = job["spec"]["template"]
        container = template["spec"]["containers"][0]
        params = command_params(container["command"])
        script = RunScript("mlflow", params["pipeline_run"], params["run_group"], float(params["submitted_at"]), ns)
        script.artifact = job
        self.scripts[script.pipeline_run] = script
        created = _floor(script.submitted_at) + t.first_pod_s
        times = self._pod_times(script, created, gpu=True, first_gpu=True)
        cursor = times["started"] + t.process_s  # python main.py
        ran = []
        gang = gang_of(params)
        for step in STEPS:
            if gang is not None and step == "finetune":  # main.py's finetune child is the launcher
                finished = self._gang_events(script, step, cursor + t.mlflow_child_s, gang)
                finished = self._gang_preempted(script, step) or finished
            else:
                finished = self._step_events(script, step, cursor + t.mlflow_child_s)
            ran.append(step)
            cursor = finished
            if self.fail.get("mlflow") == step:
                script.failed_step, script.failed_task = step, "main"
                break
        times["finished"] = _floor(cursor) + 1
        times["failed"] = script.failed_step is not None
        # standins.preemption: the Job's next pod, after the preempted one
        if self.preempt is not None and gang is None:
            times = self.preempt.script_job(self, script, times, tuple(ran)) or times
        script.pods["main"] = times
        script.tasks["main"] = tuple(ran)
        pod = f"{name}-{_suffix(name, 5)}"
        uid = job["metadata"].get("uid", "")
        labels = {**(template.get("metadata") or {}).get("labels", {}), "job-name": name,
                  "batch.kubernetes.io/job-name": name, "controller-uid": uid,
                  "batch.kubernetes.io/controller-uid": uid}
        states = self._states(pod, ns, labels, {}, times, argo=False, image=container["image"], main=container["name"],
                              gpu=True)
        for st in states:
            st["spec"]["containers"] = [copy.deepcopy(container)]
        actions = self._pod_actions(states, times, namespace=ns, container=container["name"],
                                    node=script.node if "node_created" in times else None)
        if self.preempt is not None:
            actions += self.preempt.pod_actions(self, script, "main", states[0], ns)
        actions += self._gang_actions(script, ns)
        actions += self._mlflow_actions(script, ran)
        self.kube.set_job_status(ns, name, {"startTime": _iso(created), "active": 1})

        def finish() -> None:
            if script.failed_step:
                cond = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                        "message": f"Job has reached the specified backoff limit (step {script.failed_step} failed)"}
                self.kube.set_job_status(ns, name, {"startTime": _iso(created), "failed": 1, "conditions": [cond]})
            else:
                cond = {"type": "Complete", "status": "True", "lastTransitionTime": _iso(times["finished"])}
                self.kube.set_job_status(ns, name, {"startTime": _iso(created), "succeeded": 1,
                                                    "completionTime": _iso(times["finished"]), "conditions": [cond]})

        self._play(script, actions, finish)
