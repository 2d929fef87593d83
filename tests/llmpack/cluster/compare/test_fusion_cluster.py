"""Step fusion on the loopback cluster: ``llmpack compile --fuse gpu|all`` artifacts submitted through
the real clients (kfp.Client, Hera, the kubernetes client) to the stand-ins, played by
:class:`standins.fake_cluster.FakeCluster`, whose pods are counted through the Kubernetes API.

Fusion on a cluster: step pods per run (KFP's driver pods aside) 5 -> 4 (``--fuse gpu``) and 1
(``--fuse all``); the MLflow Job is one pod whatever the fusion. A pre-pulled node: on a node whose image is
pre-pulled, the pod watcher's ``image_pull_s`` of the GPU pod is 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from standins.fake_cluster import STEPS, fused_members
from standins.loopback import ARGO_TOKEN, K8S_TOKEN, PARAMS, LoopbackCluster, client_env

from llmpack.cluster import submit
from llmpack.cluster.compare import cluster
from llmpack.cluster.k8s.podphases import orchestrator_of, role_of
from llmpack.compile.artifacts import compile_all

MODES = ("none", "gpu", "all")
# What each compiled variant runs: pod (task) -> the authored steps it runs, in order.
TASKS: dict[str, dict[str, tuple[str, ...]]] = {
    "none": {s: (s,) for s in STEPS},
    "gpu": {"prepare-data": ("prepare-data",), "tokenize": ("tokenize",), "finetune-evaluate": ("finetune", "evaluate"),
            "register": ("register",)},
    "all": {"all-steps": STEPS},
}
GPU_PODS = {"none": {"finetune", "evaluate"}, "gpu": {"finetune-evaluate"}, "all": {"all-steps"}}
pytestmark = pytest.mark.usefixtures("loopback_env")  # tests/conftest.py: no client variable of the shell


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``llmpack compile [--fuse gpu|all] --out DIR`` (through :func:`compile_all`), once per module."""
    out = {}
    for mode in MODES:
        out[mode] = tmp_path_factory.mktemp(f"fuse-{mode}") / "compiled"
        compile_all(out[mode], fuse=mode)
    return out


def step_pods(pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``llmpack.io/step`` -> pod, for the pods that run step code (KFP's driver pods aside)."""
    out = {}
    for pod in pods:
        if role_of(pod, orchestrator_of(pod)) == "driver":
            continue
        step = pod["metadata"]["labels"]["llmpack.io/step"]
        assert step not in out, f"two pods for {step}"
        out[step] = pod
    return out


def gpu_limit(pod: dict[str, Any]) -> str | None:
    main = next(c for c in pod["spec"]["containers"] if c["name"] not in ("wait", "init"))
    return ((main.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")


# --------------------------------------------------------------------------- the done-when: pods per run


def test_fused_member_names_come_from_the_fusion_ref() -> None:
    assert fused_members(["python", "-m", "components.run", "components.finetune_pipeline:finetune__evaluate", "--x=1"],
                         "finetune-evaluate") == ("finetune", "evaluate")
    assert fused_members(["components.finetune_pipeline:prepare_data__tokenize__finetune__evaluate__register"],
                         "all-steps") == STEPS
    assert fused_members(["python", "-m", "components.run", "components.steps.tokenize:tokenize"],
                         "tokenize") == ("tokenize",)


@pytest.mark.parametrize("orchestrator", ["argo", "kfp"])
def test_step_pods_per_run_5_4_1(orchestrator: str, compiled: dict[str, Path], loopback: LoopbackCluster) -> None:
    counts = {}
    for mode in MODES:
        summary = loopback.run(orchestrator, compiled[mode])
        script = loopback.fake.scripts[summary["pipeline_run"]]
        pods = loopback.pods(orchestrator, summary)
        steps = step_pods(pods)
        counts[mode] = len(steps)

        # The pods are the compiled tasks, labelled from the submitted template / executor...
        assert set(steps) == set(TASKS[mode]), (mode, sorted(steps))
        assert script.tasks == TASKS[mode]
        # ...the pods that run a GPU step ask for the GPU and run on the GPU node brought up for them.
        assert {s for s, p in steps.items() if gpu_limit(p)} == GPU_PODS[mode], mode
        assert {s for s, p in steps.items() if p["spec"]["nodeName"] == script.node["name"]} == GPU_PODS[mode]
        # A fused pod runs the compiled fused step (its container says which).
        for task, members in TASKS[mode].items():
            args = " ".join(next(c for c in steps[task]["spec"]["containers"] if c["name"] == "main").get("args") or [])
            assert ("components.finetune_pipeline:" in args) == (len(members) > 1), (mode, task)

        # Every authored step still ran and logged its events, members back to back in their pod.
        assert list(script.events) == list(STEPS)
        for task, members in TASKS[mode].items():
            pod = script.pods[task]
            first, last = script.events[members[0]], script.events[members[-1]]
            assert pod["started"] < first["process_started"] and last["finished"] <= pod["finished"]
            for before, after in zip(members, members[1:], strict=False):
                assert script.events[after]["process_started"] == script.events[before]["finished"]
        drivers = [p for p in pods if role_of(p, orchestrator_of(p)) == "driver"]
        # KFP: a root DAG driver plus one container driver per task; Argo has none.
        assert len(drivers) == (1 + len(TASKS[mode]) if orchestrator == "kfp" else 0)
    assert counts == {"none": 5, "gpu": 4, "all": 1}


def test_mlflow_job_is_one_pod_whatever_the_fusion(compiled: dict[str, Path], loopback: LoopbackCluster) -> None:
    for mode in MODES:
        summary = loopback.run("mlflow", compiled[mode])
        pods = loopback.pods("mlflow", summary)
        assert len(pods) == 1, (mode, [p["metadata"]["name"] for p in pods])
        assert pods[0]["metadata"]["labels"]["job-name"] == summary["job_name"]
        assert list(loopback.fake.scripts[summary["pipeline_run"]].events) == list(STEPS)


def test_a_failing_member_fails_its_fused_pod(compiled: dict[str, Path], tmp_path: Path, tracking_uri: str) -> None:
    c = LoopbackCluster(tmp_path, tracking_uri, fail={"argo": "finetune"})
    try:
        summary = submit.submit("argo", params=PARAMS, tracking_uri=tracking_uri, **c.connection("argo"),
                                workflow_path=str(compiled["gpu"] / "argo_workflows" / "finetune.yaml"))
        done = submit.wait_for_completion(summary, **c.connection("argo"), poll_s=0.02, timeout_s=30)
        c.fake.wait_idle()
        steps = step_pods(c.pods("argo", summary))
    finally:
        c.close()
    assert done["status"] == "failed" and "finetune-evaluate" in done["error"]
    script = c.fake.scripts[summary["pipeline_run"]]
    assert (script.failed_step, script.failed_task) == ("finetune", "finetune-evaluate")
    assert script.tasks["finetune-evaluate"] == ("finetune",)  # evaluate never started
    assert set(steps) == {"prepare-data", "tokenize", "finetune-evaluate"}
    assert steps["finetune-evaluate"]["status"]["phase"] == "Failed"


# --------------------------------------------------------------------------- a pre-pulled GPU node


@pytest.mark.parametrize("prepulled", [False, True])
def test_image_pull_on_the_gpu_node_is_zero_when_prepulled(prepulled: bool, tmp_path: Path, tracking_uri: str) -> None:
    c = LoopbackCluster(tmp_path, tracking_uri, prepulled=prepulled)
    try:
        result = cluster.compare_cluster(
            backends="argo,kfp", params=PARAMS, tracking_uri=tracking_uri, timeout_s=30, poll_s=0.05,
            **c.endpoints())
        c.fake.wait_idle()
    finally:
        c.close()
    for run in result["runs"]:
        assert run["status"] == "succeeded", (run["orchestrator"], run["error"], run["warnings"])
        # The pod watcher's rows (Pulling/Pulled events, or "already present on machine").
        rows = {p["step"]: p for p in run["pods"] if p["role"] == "executor"}
        gpu = rows["finetune"]
        expected = 0 if prepulled else c.fake.timings.pull_s
        assert gpu["image_pull_s"] == expected, (run["orchestrator"], gpu)
        assert gpu["node_ready"] is not None  # still a node brought up for the pod: only the pull is gone
        assert all(r["image_pull_s"] == 0 for s, r in rows.items() if s != "finetune")
        script = c.fake.scripts[run["pipeline_run"]]
        ft = script.pods["finetune"]
        assert ft["started"] - ft["initialized"] == c.fake.timings.start_s + (0 if prepulled else c.fake.timings.pull_s)


def test_prepulled_fused_gpu_pod_through_the_pod_watcher(compiled: dict[str, Path], tmp_path: Path,
                                                          tracking_uri: str) -> None:
    """The fused GPU pod, watched by :class:`~llmpack.cluster.k8s.watcher.PodWatcher` (started before the
    submission)."""
    from llmpack.cluster.k8s.api import build_api_client
    from llmpack.cluster.k8s.watcher import PodWatcher

    pulls = {}
    for prepulled in (False, True):
        (tmp_path / str(prepulled)).mkdir()
        c = LoopbackCluster(tmp_path / str(prepulled), tracking_uri, prepulled=prepulled)
        try:
            run_group = f"rg-fuse-pull-{str(prepulled).lower()}"
            watcher = PodWatcher(build_api_client(host=c.kube.url, token=K8S_TOKEN), "llmpack", run_group).start()
            summary = submit.submit("argo", params=PARAMS, tracking_uri=tracking_uri, run_group=run_group,
                                    workflow_path=str(compiled["gpu"] / "argo_workflows" / "finetune.yaml"),
                                    **c.connection("argo"))
            assert submit.wait_for_completion(summary, **c.connection("argo"), poll_s=0.02,
                                              timeout_s=30)["status"] == "succeeded"
            c.fake.wait_idle()
            rows = watcher.finish()
        finally:
            c.close()
        by_step = {r["step"]: r for r in rows}
        assert set(by_step) == set(TASKS["gpu"])
        pulls[prepulled] = by_step["finetune-evaluate"]["image_pull_s"]
        assert by_step["finetune-evaluate"]["node_ready"] is not None
    assert pulls == {False: 4, True: 0}



# --------------------------------------------------------------------------- --variants on a cluster


def test_compare_cluster_runs_the_variants_side_by_side(tmp_path: Path, tracking_uri: str) -> None:
    """``llmpack compare --cluster --variants default,fuse-gpu,fuse-all``: each path compiled in each
    packaging and submitted; a fused pod's phases are its training member's spin-up and its GPU
    node is billed once for all of its members."""
    c = LoopbackCluster(tmp_path, tracking_uri)
    try:
        result = cluster.compare_cluster(
            backends="argo,kfp", params=PARAMS, tracking_uri=tracking_uri, timeout_s=30, poll_s=0.05,
            variants=["none", "gpu", "all"],
            **c.endpoints())
        c.fake.wait_idle()
    finally:
        c.close()
    assert result["backends"] == ["argo", "kfp", "argo+fuse-gpu", "kfp+fuse-gpu", "argo+fuse-all", "kfp+fuse-all"]
    assert set(result["summary"]) == set(result["backends"])
    mode_of = {"": "none", "+fuse-gpu": "gpu", "+fuse-all": "all"}
    for run in result["runs"]:
        assert run["status"] == "succeeded", (run["orchestrator"], run["error"], run["warnings"])
        mode = run["fuse"]
        assert run["tags"]["llmpack.fuse"] == mode
        script = c.fake.scripts[run["pipeline_run"]]
        assert script.tasks == TASKS[mode]  # what was submitted is that variant's compiled pipeline
        executors = {r["step"] for r in run["pods"] if r["role"] == "executor"}
        assert executors == set(TASKS[mode]), (mode, executors)
        # Every authored step's own events are in the record...
        assert all({"process_started", "finished"} <= set(run["events"][s]) for s in STEPS), mode
        # ...the pod that runs finetune gives finetune its pod phases, fused or not, and spin-up ends when finetune's
        # process starts (after the members before it in that pod, as separate pods would be).
        train_task = next(t for t, members in TASKS[mode].items() if "finetune" in members)
        pod = script.pods[train_task]
        assert run["events"]["finetune"]["container_started"] == pytest.approx(pod["started"], abs=1e-3), mode
        assert run["events"]["finetune"]["node_ready"] == pytest.approx(script.node["ready"], abs=1e-3), mode
        assert run["metrics"]["spinup_s"] == pytest.approx(run["events"]["finetune"]["process_started"]
                                                           - run["submitted_at"], abs=1e-3), mode
        # The GPU node is billed (a fused pod's GPU found by its task name), and nothing counts as a retry.
        assert run["tags"]["llmpack.cost_basis"] == "node", mode
        assert run["metrics"]["cost_usd"] > 0 and run["metrics"]["retries"] == 0, mode
    for label, mode in mode_of.items():
        for orch in ("argo", "kfp"):
            assert sum(r["orchestrator"] == orch and r["fuse"] == mode for r in result["runs"]) == 1, label


@pytest.mark.slow  # the CLI over what test_compare_cluster_runs_the_variants_side_by_side checks (~20 s)
def test_the_cli_compare_cluster_variants(tmp_path: Path, tracking_uri: str) -> None:
    """``llmpack compare --cluster --variants default,fuse-all`` (the CLI, once, Argo only: the code above)."""
    import json
    import subprocess
    import sys

    c = LoopbackCluster(tmp_path, tracking_uri)
    env = client_env()
    env.update(ARGO_TOKEN=ARGO_TOKEN, HOME=str(tmp_path / "home"))
    try:
        r = subprocess.run(
            [sys.executable, "-m", "llmpack", "cluster", "compare", "--backends", "argo",
             "--variants", "default,fuse-all",
             "--max-steps", "7", "--argo-host", c.argo.url, "--kubeconfig", str(c.kubeconfig),
             "--tracking-uri", tracking_uri, "--poll", "0.05", "--timeout", "60", "--no-report", "--json"],
            env=env, capture_output=True, text=True, timeout=300)
        c.fake.wait_idle()
    finally:
        c.close()
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["backends"] == ["argo", "argo+fuse-all"]
    assert sorted(c.fake.scripts[run["pipeline_run"]].tasks == TASKS[run["fuse"]]
                  for run in result["runs"]) == [True, True]


def test_the_cli_refuses_fused_variants_of_a_many_gpu_finetune(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from llmpack.cli import main

    r = CliRunner().invoke(main, ["cluster", "compare", "--backends", "argo", "--variants", "default,fuse-gpu",
                                  "--gpus", "2", "--no-report"])
    assert r.exit_code == 2 and "the many-process finetune runs unfused" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
