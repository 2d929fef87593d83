"""The pod watcher (``llmpack.cluster.k8s.watcher.PodWatcher``) on the real API server's list and watch.

A run group of pods made by the real Job controller (one Job, 20 completions, 10 at a time),
bound by the real scheduler to the simulated nodes and moved Pending → Running → Succeeded by
kwok: the watcher, with the real kubernetes client, lists and watches them from the real API
server (its watch cache, resourceVersions and event stream) until every pod has terminated.
kwok's stages stamp a pod's start and finish with one time, so the rows' durations are not
checked here. Bookmarks and a 410 after a real etcd compaction: ``test_watch_compaction_real``;
the 1,000-node, 10,000-pod scale: ``benchmarks/watcher_real.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.realcluster.apiserver import make_namespace
from tests.realcluster.conftest import RealCluster

pytestmark = pytest.mark.cluster

NS = "llmpack-watch"
RUN_GROUP = "rg-real-watch"
PODS = 20


def _job() -> dict[str, Any]:
    container = {"name": "main", "image": "registry.example/x@sha256:" + "0" * 64, "command": ["true"],
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                 "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                     "runAsNonRoot": True, "runAsUser": 1000,
                                     "seccompProfile": {"type": "RuntimeDefault"}}}
    labels = {"llmpack.io/run-group": RUN_GROUP, "llmpack.io/step": "prepare_data",
              "llmpack.io/pipeline-run": RUN_GROUP}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "watched", "labels": labels},
            "spec": {"completions": PODS, "parallelism": 10, "backoffLimit": 0,
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"restartPolicy": "Never", "containers": [container]}}}}


def test_the_watcher_sees_every_pod_of_a_run_group_terminate(real_cluster: RealCluster) -> None:
    """Every pod the Job controller made, each with its node and a terminal phase, from the real list and watch."""
    from kubernetes import client

    from llmpack.cluster.k8s.podphases import all_terminated
    from llmpack.cluster.k8s.watcher import PodWatcher

    make_namespace(real_cluster.api, NS)
    client.BatchV1Api(real_cluster.api).create_namespaced_job(NS, _job())
    watcher = PodWatcher(real_cluster.api, NS, RUN_GROUP, window_s=5)
    rows = watcher.run(until=all_terminated(min_pods=PODS), timeout_s=120)
    assert watcher.stopped_by == "condition", (watcher.stopped_by, watcher.warnings)
    assert len(rows) == PODS and len({r["pod"] for r in rows}) == PODS, rows[:2]
    assert {r["outcome"] for r in rows} == {"succeeded"} and {r["phase"] for r in rows} == {"Succeeded"}
    assert {r["node"] for r in rows} <= {"cpu-0", "cpu-1", "h100-0", "h100-1"}  # bound by the real scheduler
    assert {r["instance_type"] for r in rows} <= {"m6i.4xlarge", "p5.48xlarge"}  # read from the real nodes
    assert all(r["orchestrator_run"] == "watched" and r["step"] == "prepare_data" for r in rows)
    assert watcher.stats["watches"] >= 1 and watcher.stats["events"] >= PODS, watcher.stats
