"""``llmpack compare --cluster --nodes 2 --gpus 4``: finetune as a Kubeflow Trainer TrainJob gang on the
loopback cluster (the three stand-ins made one by :class:`standins.fake_cluster.FakeCluster`), through
the real clients, for kfp, argo and mlflow.

Per run: the launcher pod, the TrainJob, and 2 node pods (JobSet's names and labels), each on its own
new GPU node; the watcher sees every node's pod as one attempt of finetune, the timeline lists them,
``gang_ready_s`` is the last node pod's container start - submitted_at, and cost bills 2 x 4 GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standins.k8s_api import TRAINJOBS
from standins.loopback import ARGO_TOKEN, KFP_TOKEN, LoopbackCluster, client_env, isolate

from components.errors import InputError
from llmpack.cluster.compare import cluster
from llmpack.cluster.k8s.objects import JOB_COMPLETION_INDEX, JOBSET_NAME_LABEL
from llmpack.cluster.k8s.step_records import to_step_records
from llmpack.cluster.k8s.timeline import format_table

NODES, GPUS = 2, 4
H200_AWS = 7.912  # components/record/prices.yaml: nvidia-h200, aws (p5en.48xlarge)
DELAY = 600.0  # the default scale-down delay the node bill adds after a node's last pod


pytestmark = pytest.mark.usefixtures("loopback_env")  # tests/conftest.py: no client variable of the shell


def options(c: LoopbackCluster, **overrides: Any) -> dict[str, Any]:
    """``compare_cluster`` keywords for the three paths, finetune on NODES x GPUS."""
    return c.options(**{"nodes": NODES, "gpus": GPUS, **overrides})


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], LoopbackCluster]]:
    """One ``compare --cluster --nodes 2 --gpus 4`` of the three paths (module-wide: it is the slow part)."""
    tmp = tmp_path_factory.mktemp("gang")
    mp = pytest.MonkeyPatch()
    isolate(mp, tmp)
    c = LoopbackCluster(tmp, f"sqlite:///{tmp / 'mlflow.db'}")
    try:
        result = cluster.compare_cluster(**options(c))
        c.fake.wait_idle()
        yield result, c
    finally:
        c.close()
        mp.undo()


def _gang_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted((p for p in run["pods"] if p.get("gang")), key=lambda r: r["gang_node"])


def test_every_path_runs_finetune_as_a_trainjob_of_two_nodes(compared) -> None:
    result, c = compared
    runs = {r["orchestrator"]: r for r in result["runs"]}
    assert list(runs) == ["kfp", "argo", "mlflow"] and result["failed"] == []
    for orch, run in runs.items():
        assert run["status"] == "succeeded", (orch, run["error"], run["warnings"])
        script = c.fake.scripts[run["pipeline_run"]]
        gang = script.gang
        assert gang["nodes"] == NODES and gang["gpus_per_node"] == GPUS and gang["world_size"] == NODES * GPUS
        # The TrainJob the launcher creates, in the launcher's namespace, Complete.
        ns = {"kfp": "kubeflow"}.get(orch, "llmpack")
        obj = c.kube.custom_objects[TRAINJOBS.resource][(ns, gang["trainjob"])]
        assert obj["spec"]["trainer"]["numNodes"] == NODES
        assert obj["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == str(GPUS)
        assert [cd["type"] for cd in obj["status"]["conditions"]] == ["Complete"]
        # Its node pods: JobSet's names and labels, one per node, each on its own new GPU node.
        rows = _gang_rows(run)
        assert [r["gang_node"] for r in rows] == [0, 1], orch
        for r, p in zip(rows, gang["pods"], strict=True):
            assert r["pod"] == p["pod"] and r["pod"].startswith(f"{gang['trainjob']}-node-0-{p['index']}-")
            assert r["gang"] == gang["trainjob"] and r["gang_gpus"] == GPUS and r["step"] == "finetune"
            assert r["node"] == p["node"] and r["node_ready"] == p["node_ready"]
            assert r["container_started"] == p["started"] and r["finished"] == p["finished"]
            assert r["image_pull_s"] == p["pull_s"] and r["provision_s"] == p["node_ready"] - p["created"]
            assert r["pipeline_run"] == run["pipeline_run"] and r["run_group"] == result["run_group"]
        assert len({r["node"] for r in rows}) == NODES
        assert not {r["node"] for r in rows} & {p["node"] for p in run["pods"] if not p.get("gang")}
        # Different paces per node: the nodes came up, pulled and started at different times.
        assert rows[0]["provision_s"] != rows[1]["provision_s"] and rows[0]["image_pull_s"] != rows[1]["image_pull_s"]
        pod = c.kube._pods[(ns, rows[1]["pod"])]
        labels = pod["metadata"]["labels"]
        assert labels[JOBSET_NAME_LABEL] == gang["trainjob"] and labels[JOB_COMPLETION_INDEX] == "1"
        assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
        assert labels["llmpack.io/pipeline-run"] == run["pipeline_run"] and labels["llmpack.io/gpu-count"] == str(GPUS)


def test_gang_pods_are_one_attempt_and_the_timeline_lists_every_node(compared) -> None:
    result, c = compared
    for run in result["runs"]:
        m = run["metrics"]
        assert m["retries"] == 0 and run["retried_attempts"] == [], run["orchestrator"]
        assert m["retry_gpu_hours"] == 0
        # finetune is one attempt: its events have no attempt suffix; every node has its own.
        ev = run["events"]["finetune"]
        script = c.fake.scripts[run["pipeline_run"]]
        for p in script.gang["pods"]:
            i = p["index"]
            assert ev[f"node_ready.node{i}"] == p["node_ready"] and ev[f"container_started.node{i}"] == p["started"]
            assert ev[f"pod_created.node{i}"] == p["created"] and ev[f"pod_scheduled.node{i}"] == p["scheduled"]
        # The rank events the fake wrote to MLflow: the step's first_step is the last rank's.
        last = NODES * GPUS - 1
        assert ev["first_step"] == ev[f"first_step.rank{last}"] == script.events["finetune"]["first_step"]
        assert ev["first_step"] == max(v for k, v in ev.items() if k.startswith("first_step.rank"))
        # The timeline: one line per node pod, marked with its rank.
        table = format_table(run["pods"])
        for r in _gang_rows(run):
            line = next(line for line in table.splitlines() if line.startswith(r["pod"]))
            assert f"finetune/node{r['gang_node']}" in line
        from components.record.telemetry import RunContext

        ctx = RunContext(run_group=run["run_group"], pipeline_run=run["pipeline_run"],
                         orchestrator=run["orchestrator"], mode="cluster", submitted_at=run["submitted_at"])
        assert {r.attempt for r in to_step_records(run["pods"], ctx) if r.step == "finetune"} == {0}


def test_gang_ready_s_is_the_last_node_pods_start(compared) -> None:
    result, c = compared
    for run in result["runs"]:
        script = c.fake.scripts[run["pipeline_run"]]
        expected = script.gang_ready - script.submitted_at
        assert run["metrics"]["gang_ready_s"] == pytest.approx(expected, abs=1e-6), run["orchestrator"]
        assert script.gang_ready == max(p["started"] for p in script.gang["pods"])
        assert expected > 0
    # compare's output says it, per path.
    from rich.console import Console

    from llmpack.compare.table import compare_table

    console = Console(record=True, width=200)
    compare_table(result, console=console)
    text = console.export_text()
    line = next(line for line in text.splitlines() if line.startswith("gang ready"))
    for run in result["runs"]:
        assert f"{run['orchestrator']} {run['metrics']['gang_ready_s']:.1f} s (n=1)" in line
        # and its summary (the JSON output) has it per path, as every other metric
        assert result["summary"][run["orchestrator"]]["gang_ready_s"]["p50"] == run["metrics"]["gang_ready_s"]


def expected_container_gpu_seconds(script) -> float:
    """GPU pods' container time (+ provisioning): each gang pod's 4 GPUs, evaluate's (or the MLflow Job's) 1."""
    total = 0.0
    for p in script.gang["pods"]:
        total += GPUS * (p["finished"] - p["started"] + p["node_ready"] - p["created"])
    if script.orchestrator == "mlflow":
        main = script.pods["main"]
        total += main["finished"] - main["started"] + main["node_ready"] - main["created"]
    else:
        ev = script.pods["evaluate"]
        total += ev["finished"] - ev["started"] + ev["node_ready"] - ev["created"]
    return total


def expected_node_gpu_seconds(script) -> float:
    """Each gang node's 4 GPUs from Ready to its pod's finish + the delay; the evaluate (MLflow: Job) node's 8."""
    total = sum(GPUS * (p["finished"] + DELAY - p["node_ready"]) for p in script.gang["pods"])
    node = script.node
    last = max(p["finished"] for p in script.pods.values() if p.get("node") == node["name"])
    return total + 8 * (last + DELAY - node["ready"])


def test_cost_bills_two_nodes_of_four_gpus(compared) -> None:
    result, c = compared
    for run in result["runs"]:
        script = c.fake.scripts[run["pipeline_run"]]
        m, tags = run["metrics"], run["tags"]
        assert tags["llmpack.gpu_type"] == "nvidia-h200" and tags["llmpack.gpu_count"] == str(NODES * GPUS)
        assert tags["llmpack.cost_basis"] == "node"
        assert m["gpu_hours"] == pytest.approx(expected_container_gpu_seconds(script) / 3600, abs=1e-9)
        node_s = expected_node_gpu_seconds(script)
        assert m["node_gpu_hours"] == pytest.approx(node_s / 3600, abs=1e-9), run["orchestrator"]
        assert m["cost_usd"] == pytest.approx(round(node_s / 3600 * H200_AWS, 2), abs=0.005)
        ft = script.events["finetune"]
        compute = NODES * GPUS * (ft["finished"] - ft["model_loaded"])
        ev = script.events["evaluate"]
        compute += ev["finished"] - ev["model_loaded"]
        assert m["cost_compute_usd"] == pytest.approx(compute / 3600 * H200_AWS, abs=1e-6)
        assert m["goodput"] == pytest.approx(m["train_s"] * NODES * GPUS / node_s, rel=1e-9)


def test_nodes_refused_cases(tmp_path: Path, tracking_uri: str) -> None:
    c = LoopbackCluster(tmp_path, tracking_uri)
    try:
        with pytest.raises(InputError, match="--cache-pvc"):
            cluster.compare_cluster(**options(c, cache_pvc="Not_A_PVC"))
        with pytest.raises(InputError, match="package_path"):
            cluster.compare_cluster(**options(c, kfp={"host": c.kfp.url, "token": KFP_TOKEN, "package_path": "x.yaml"}))
        with pytest.raises(InputError, match="--nodes 0"):
            cluster.compare_cluster(**options(c, nodes=0))
    finally:
        c.close()
    assert c.fake.scripts == {}


def test_the_cli_compare_cluster_nodes(tmp_path: Path, tracking_uri: str) -> None:
    """``llmpack compare --cluster --nodes 2 --gpus 4`` (the CLI, once, Argo only: the same code as above)."""
    import subprocess
    import sys

    c = LoopbackCluster(tmp_path, tracking_uri)
    env = client_env()
    env.update(ARGO_TOKEN=ARGO_TOKEN, HOME=str(tmp_path / "home"))
    try:
        r = subprocess.run(
            [sys.executable, "-m", "llmpack", "cluster", "compare", "--backends", "argo",
             "--nodes", "2", "--gpus", "4", "--cache-pvc", "team-shared", "--max-steps", "7",
             "--argo-host", c.argo.url, "--kubeconfig", str(c.kubeconfig),
             "--tracking-uri", tracking_uri, "--poll", "0.05", "--timeout", "60", "--no-report"],
            env=env, capture_output=True, text=True, timeout=300)
        c.fake.wait_idle()
    finally:
        c.close()
    assert r.returncode == 0, r.stderr[-3000:]
    (script,) = c.fake.scripts.values()
    assert script.gang["spec"].claim == "team-shared" and len(script.gang["pods"]) == NODES
    line = next(line for line in r.stdout.splitlines() if line.startswith("gang ready"))
    assert f"argo {script.gang_ready - script.submitted_at:.1f} s (n=1)" in line


def test_the_cli_refuses_cache_pvc_without_nodes(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from llmpack.cli import main

    r = CliRunner().invoke(main, ["compare", "--cache-pvc", "x", "--no-report"])
    assert r.exit_code != 0 and "llmpack cluster compare" in r.output
    r = CliRunner().invoke(main, ["cluster", "compare", "--backends", "argo", "--cache-pvc", "x", "--no-report"])
    assert r.exit_code != 0 and "--cache-pvc: with --cluster only for --nodes 2" in r.output


def test_gpus_alone_compiles_one_bigger_finetune_pod(tmp_path: Path, tracking_uri: str) -> None:
    """``--gpus 4`` without ``--nodes``: no gang; the finetune pod is billed for its 4 GPUs."""
    c = LoopbackCluster(tmp_path, tracking_uri)
    try:
        result = cluster.compare_cluster(**options(c, backends="argo", nodes=None))
        c.fake.wait_idle()
    finally:
        c.close()
    (run,) = result["runs"]
    assert run["status"] == "succeeded", (run["error"], run["warnings"])
    script = c.fake.scripts[run["pipeline_run"]]
    assert not script.gang and "gang_ready_s" not in run["metrics"] and run["tags"]["llmpack.gpu_count"] == str(GPUS)
    ft, ev = script.pods["finetune"], script.pods["evaluate"]
    expected = (GPUS * (ft["finished"] - ft["started"] + ft["node_ready"] - ft["created"])
                + ev["finished"] - ev["started"])
    assert run["metrics"]["gpu_hours"] == pytest.approx(expected / 3600, abs=1e-9)


def test_kueue_splits_the_gangs_queueing_into_quota_wait_and_admission_checks(
        tmp_path: Path, tracking_uri: str) -> None:
    """``--queue``: the TrainJob carries Kueue's queue label, its pods wait for the Workload's admission,
    and the run's ``quota_wait_s`` / ``admission_checks_s`` are the Workload's condition times, to the second."""
    c = LoopbackCluster(tmp_path, tracking_uri)
    try:
        result = cluster.compare_cluster(**options(c, backends="argo", queue="team-a"))
        c.fake.wait_idle()
        (run,) = result["runs"]
        assert run["status"] == "succeeded", (run["error"], run["warnings"])
        script = c.fake.scripts[run["pipeline_run"]]
        wl = script.gang["workload"]
        assert script.gang["object"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert run["metrics"]["quota_wait_s"] == wl["quota_reserved"] - wl["created"] == c.fake.timings.kueue_quota_s
        assert (run["metrics"]["admission_checks_s"] == wl["admitted"] - wl["quota_reserved"]
                == c.fake.timings.kueue_admit_s)
        assert result["summary"]["argo"]["quota_wait_s"]["p50"] == c.fake.timings.kueue_quota_s
        assert min(p["created"] for p in script.gang["pods"]) > wl["admitted"]  # suspended until admitted
    finally:
        c.close()
    (tmp_path / "nq").mkdir()
    no_queue = LoopbackCluster(tmp_path / "nq", tracking_uri)
    try:
        plain = cluster.compare_cluster(**options(no_queue, backends="argo"))
        no_queue.fake.wait_idle()
    finally:
        no_queue.close()
    (run,) = plain["runs"]
    assert run["metrics"]["quota_wait_s"] is None and run["metrics"]["admission_checks_s"] is None
