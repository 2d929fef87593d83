"""The compiled pipeline's own closing task on the loopback cluster: ``close-record`` played for real.

Every compiled path ends with the summarizing task (:mod:`components.record.close`): KFP's
``dsl.ExitHandler`` task ``close-record``, Argo's ``spec.onExit``, the final block of MLflow's
``main`` in the Job's pod. :class:`standins.fake_cluster.FakeCluster` leaves it out unless given
``on_exit`` (the tests of ``compare --cluster`` measure the client's own closing, and keep it so);
:class:`ExitTask` is that hook. It runs the real :func:`components.record.close.close` when the
run's last pod has finished, before the orchestrator reports the end (as an exit handler runs
before the run is done), with what the exit pod's environment holds on a cluster.

In full: docs/internals/stand-ins.md, "The closing task played for real".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


def argo_traceparent(namespace: str, pipeline_run: str) -> str:
    """The ``TRACEPARENT`` the stand-in's Argo controller injects into a workflow's exit pod."""
    trace = hashlib.sha256(f"argo-workflow/{namespace}/{pipeline_run}".encode()).hexdigest()[:32]
    span = hashlib.sha256(f"argo-node/{namespace}/{pipeline_run}/onExit".encode()).hexdigest()[:16]
    return f"00-{trace}-{span}-01"


@dataclass
class ExitTask:
    """``FakeCluster(on_exit=ExitTask(tracking_uri))``: the pipeline's closing task, played (module docstring)."""

    tracking_uri: str
    hand_over_s: float = 2.0
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)   # pipeline_run -> close()'s summary
    traceparents: dict[str, str] = field(default_factory=dict)           # pipeline_run -> what Argo planted
    errors: list[BaseException] = field(default_factory=list)

    def __call__(self, script: Any) -> None:
        from components.record.close import close

        env = {"MLFLOW_TRACKING_URI": self.tracking_uri, "LLMPACK_TRACKING_MAX_WAIT_S": "10"}
        if script.orchestrator == "argo":
            env["TRACEPARENT"] = self.traceparents[script.pipeline_run] = argo_traceparent(script.namespace,
                                                                                           script.pipeline_run)
        values = {"submitted_at": script.submitted_at, "run_group": script.run_group,
                  "pipeline_run": script.pipeline_run, "orchestrator": script.orchestrator, "mode": "cluster"}
        ends = [p["finished"] for p in script.pods.values()]
        try:
            self.summaries[script.pipeline_run] = close(
                values=values, status="Failed" if script.failed_step else "Succeeded", uses=[],
                finished_at=max(ends) + self.hand_over_s if ends else None, env=env)
        except Exception as exc:  # noqa: BLE001 - the real task's main warns and exits 0: the run's status stands
            self.errors.append(exc)
