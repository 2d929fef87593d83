"""``llmpack cluster compare`` on the REAL control plane: argo vs mlflow, spin-up from the real controllers.

A control plane of this module's own with Argo's workflow-controller and the Argo Server; kwok's
nodes cordoned, every pod run on the process kubelet's nodes (container mode: root only), one H100
of a p5.48xlarge and an m6i.4xlarge (``compare_stage.py``). The committed artifacts are what the
CLI submits, unchanged: the argo path's Workflow through the real Argo Server (a ServiceAccount
token), run by the real controller and argoexec; the mlflow path's Job made by the real Job
controller, run in ``/opt/llmpack/mlflow_projects/finetune-k8s`` of the image folder. Each pod waits
``DELAY_MS`` + uniform(0, ``JITTER_MS``) before it starts (kwok's stage delay, played by the process
kubelet), so spin-up is not "Ready at once". kfp is not in it: the KFP API server and KFP's own
compiler are out of reach (docs/internals/stand-ins.md). The CLI runs as a user types it (a
subprocess); its table is printed (``-s``) and written to ``$LLMPACK_COMPARE_REAL_OUT`` when set.
docs/internals/real-cluster.md, "compare on the real controllers".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster.compare_stage import CPU_NODE, GPU_NODE, command, stage
from tests.realcluster.conftest import RealCluster, started_cluster
from tests.realcluster.process_kubelet import ProcessKubelet
from tests.realcluster.test_argo_real import _argo_bin, _can_mount

pytestmark = pytest.mark.cluster

DELAY_MS, JITTER_MS = 3000, 2000  # each pod's provisioning delay: 3 s + uniform(0, 2 s), seeded
ARGO_STEPS = ("prepare-data", "tokenize", "finetune", "evaluate", "register", "close-record")
REPEATS = int(os.environ.get("LLMPACK_COMPARE_REAL_REPEATS", "2"))


@pytest.fixture(scope="module")
def compare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A control plane with Argo's workflow-controller and the Argo Server (skips where they are not built)."""
    if not _can_mount():
        pytest.skip("the process kubelet's container mode needs mount namespaces (unshare --mount: root)")
    _argo_bin()
    with started_cluster(tmp_path_factory.mktemp("comparecluster") / "state",
                         settings={"LLMPACK_CLUSTER_CONTROLLERS": "argo,argo-server"}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def staged(compare_cluster: RealCluster) -> Iterator[dict[str, Any]]:
    """Namespace llmpack staged for the CLI and the process nodes up (``compare_stage.stage``)."""
    with stage(compare_cluster.api, compare_cluster.state_dir, delay_ms=DELAY_MS, jitter_ms=JITTER_MS) as staged:
        yield staged
        assert not staged["kubelet"].errors, staged["kubelet"].errors


def _compare(cluster: RealCluster, staged: dict[str, Any]) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_", "ARGO_", "KUBE"))}
    env.update(staged["env"], ARGO_TOKEN=staged["token"], KUBECONFIG=str(cluster.kubeconfig), COLUMNS="100")
    t0 = time.monotonic()
    done = subprocess.run(command(staged, cluster.kubeconfig, repeats=REPEATS), cwd=staged["root"] / "home", env=env,
                          capture_output=True, text=True, timeout=1800)
    return done, time.monotonic() - t0


def _logs(kubelet: ProcessKubelet) -> str:
    logs = kubelet.root / "logs"
    return "\n".join(f"--- {p.relative_to(logs)}\n{p.read_text()[-1500:]}" for p in sorted(logs.rglob("*.log")))


@pytest.mark.slow
def test_compare_decides_argo_vs_mlflow_on_spinup_from_the_real_controllers(compare_cluster: RealCluster,
                                                                              staged: dict[str, Any]) -> None:
    """Both paths succeed every round on the real controllers; each run's spin-up and time to first step come from
    its pods as the real controllers and the process kubelet reported them (so at least the provisioning delay),
    and the verdict on spin-up names a path or says undecided, with the rounds counted."""
    from kubernetes import client

    kubelet: ProcessKubelet = staged["kubelet"]
    done, wall_s = _compare(compare_cluster, staged)
    report = staged["root"] / "report" / "out" / "report.json"
    assert done.returncode == 0 and report.is_file(), (done.stdout[-3000:], done.stderr[-5000:], _logs(kubelet))
    table = done.stdout
    print(f"\n{table}\n(compare wall time {wall_s:.0f} s)")
    if os.environ.get("LLMPACK_COMPARE_REAL_OUT"):
        Path(os.environ["LLMPACK_COMPARE_REAL_OUT"]).write_text(f"{table}\ncompare wall time {wall_s:.0f} s\n")
        shutil.copy(report, Path(os.environ["LLMPACK_COMPARE_REAL_OUT"]).with_suffix(".json"))
    result = json.loads(report.read_text())
    runs = result["runs"]
    assert sorted(r["orchestrator"] for r in runs) == sorted(["argo", "mlflow"] * REPEATS), runs
    assert not result["failed"], result["failed"]
    assert all(r["status"] == "succeeded" for r in runs), [(r["orchestrator"], r["error"]) for r in runs]

    # every pod of every run, as the pod watcher saw it: made by the real controllers, bound by the real scheduler
    # to a process node, run there after the provisioning delay it was given (timestamps in whole seconds)
    for r in runs:
        pods = r["pods"]
        assert all(p["phase"] == "Succeeded" and p["node"] in (GPU_NODE, CPU_NODE) for p in pods), pods
        assert all(p["start_s"] >= DELAY_MS / 1000 - 1 for p in pods), [(p["pod"], p["start_s"]) for p in pods]
        assert {p["pod"] for p in pods} <= set(kubelet.delays), (sorted(kubelet.delays), pods)
        if r["orchestrator"] == "argo":  # the Workflow's five steps and its exit handler, each a pod of its own
            assert sorted(p["step"] for p in pods) == sorted(ARGO_STEPS), pods
            assert {p["orchestrator_run"] for p in pods} == {r["artifacts"]["server_id"]}, (pods, r["artifacts"])
        else:  # MLflow's one Job pod on the H100, every step in it
            (pod,) = pods
            assert pod["step"] == "main" and pod["node"] == GPU_NODE and pod["gpu_product"], pod
    assert all(DELAY_MS / 1000 <= d <= (DELAY_MS + JITTER_MS) / 1000 for d in kubelet.delays.values())
    jobs = client.BatchV1Api(compare_cluster.api).list_namespaced_job("llmpack").items
    assert len(jobs) == REPEATS and all(j.status.succeeded == 1 for j in jobs), jobs  # the real Job controller's

    # spin-up and time to first step from the pods: never below the first pod's provisioning delay
    for r in runs:
        m = r["metrics"]
        assert m["spinup_s"] >= DELAY_MS / 1000, (r["orchestrator"], m["spinup_s"])
        assert m["time_to_first_step_s"] >= m["spinup_s"], (r["orchestrator"], m)
        # one end on both paths: finetune's own process start (the MLflow Job's pod ran two steps before it)
        assert m["spinup_s"] == pytest.approx(r["events"]["finetune"]["process_started"] - r["submitted_at"],
                                              abs=0.01), (r["orchestrator"], m["spinup_s"], r["events"]["finetune"])
        assert r["tags"]["llmpack.mode"] == "cluster"
    # argo's first step to run finetune is its third pod: its spin-up waits out three provisioning delays
    for r in (r for r in runs if r["orchestrator"] == "argo"):
        assert r["metrics"]["spinup_s"] >= 3 * DELAY_MS / 1000, r["metrics"]
    summary = result["summary"]
    for path in ("argo", "mlflow"):
        assert summary[path]["spinup_s"]["n"] == REPEATS, summary[path]
    verdict = result["verdicts"]["spinup_s"]["mlflow"]
    assert verdict["verdict"] in ("faster", "slower", "equivalent", "undecided"), verdict
    assert verdict["n"] == verdict["n_baseline"] == REPEATS, verdict
    assert "spin-up" in table and "argo" in table and "mlflow" in table, table
