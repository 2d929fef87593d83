"""``llmpack compare --cluster``: kfp, argo and mlflow submitted to one fake cluster (the three
stand-ins on 127.0.0.1 made one by ``standins.fake_cluster``), watched, measured and reported."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
from standins.loopback import ARGO_TOKEN, K8S_TOKEN, KFP_TOKEN, LoopbackCluster, client_env

from components.errors import InputError
from components.record import cost, tracking
from llmpack import gpu_catalogue
from llmpack.cluster.compare import cluster
from llmpack.report import rebill, runs_from_mlflow, write_report

CLUSTER_EVENTS = ("pod_created", "pod_scheduled", "node_ready", "container_started")
# The order they happen in for a pod that needs a new node: the scheduler binds it once the node is Ready.
NEW_NODE_ORDER = ("pod_created", "node_ready", "pod_scheduled", "container_started")
H200_AWS = 7.912  # components/record/prices.yaml: nvidia-h200, aws (p5en.48xlarge)


pytestmark = pytest.mark.usefixtures("loopback_env")  # tests/conftest.py: no client variable of the shell


@pytest.fixture()
def fake(loopback: LoopbackCluster) -> LoopbackCluster:
    """The loopback cluster (tests/conftest.py), by the name these tests gave it."""
    return loopback


def finetune_pod(script) -> dict:
    return script.pods["main" if script.orchestrator == "mlflow" else "finetune"]


def expected_gpu_seconds(script) -> float:
    """What the cluster bills: GPU pods from container start to finish, plus the node brought up."""
    if script.orchestrator == "mlflow":
        main = script.pods["main"]
        return main["finished"] - main["started"] + main["node_ready"] - main["created"]
    ft, ev = script.pods["finetune"], script.pods["evaluate"]
    return (ft["finished"] - ft["started"] + ft["node_ready"] - ft["created"]) + (ev["finished"] - ev["started"])


def expected_node_gpu_seconds(script, scale_down_delay_s: float = 600.0) -> float:
    """What a cloud bills: the GPU node's 8 GPUs from Ready to its removal, or, not seen removed,
    to the last pod's finish on it plus the autoscaler's scale-down delay."""
    node = script.node
    last = max(p["finished"] for p in script.pods.values() if p.get("node") == node["name"])
    end = node["removed"] if "removed" in node else last + scale_down_delay_s
    return 8 * (end - node["ready"])


# --------------------------------------------------------------------------- the whole comparison


def test_compare_cluster_measures_every_path_with_the_cluster_phases(fake: LoopbackCluster, tmp_path: Path) -> None:
    seen: list[tuple[str, str, float]] = []
    result = cluster.compare_cluster(**fake.options(progress=lambda *a: seen.append(a)))
    fake.fake.wait_idle()

    # The compare() shape, every run a cluster run that succeeded.
    assert set(result) >= {"run_group", "backends", "repeats", "percentile_method", "runs", "failed", "summary"}
    assert result["backends"] == ["kfp", "argo", "mlflow"] and result["repeats"] == 1 and result["failed"] == []
    runs = {r["orchestrator"]: r for r in result["runs"]}
    assert list(runs) == ["kfp", "argo", "mlflow"]
    for orch, run in runs.items():
        assert run["status"] == "succeeded", (orch, run["error"], run["warnings"])
        assert run["mode"] == "cluster" and run["tags"]["llmpack.mode"] == "cluster"
        assert run["run_group"] == result["run_group"] and run["error"] is None
        assert set(run) >= {"pipeline_run", "orchestrator", "mode", "status", "error", "submitted_at", "metrics",
                            "tags", "events", "artifacts"}
        assert result["summary"][orch]["spinup_s"]["n"] == 1

    for orch, run in runs.items():
        script = fake.fake.scripts[run["pipeline_run"]]
        pod, t0 = finetune_pod(script), run["submitted_at"]
        assert script.submitted_at == t0
        m, ev = run["metrics"], run["events"]["finetune"]
        # The cluster events of the finetune step are the scripted pod and node times...
        assert ev["pod_created"] == pod["created"] and ev["pod_scheduled"] == pod["scheduled"]
        assert ev["node_ready"] == pod["node_ready"] and ev["container_started"] == pod["started"]
        # ...and the in-container ones are what the steps logged to MLflow.
        for name in ("process_started", "model_loaded", "first_step", "finished"):
            assert ev[name] == pytest.approx(script.events["finetune"][name], abs=1e-6)
        order = [t0, *(ev[e] for e in NEW_NODE_ORDER), ev["process_started"], ev["model_loaded"], ev["first_step"],
                 ev["finished"]]
        assert order == sorted(order) and len(set(order)) == len(order), (orch, order)

        assert m["queue_s"] == pytest.approx(pod["scheduled"] - pod["created"], abs=0.01)
        assert m["provision_s"] == pytest.approx(pod["node_ready"] - pod["created"], abs=0.01)
        assert m["spinup_s"] == pytest.approx(ev["process_started"] - t0, abs=0.01)  # the training process starts
        assert m["time_to_first_step_s"] == pytest.approx(script.events["finetune"]["first_step"] - t0, abs=0.01)
        last = max([p["finished"] for p in script.pods.values()] + [d["finished"] for d in script.drivers])
        assert m["total_s"] == pytest.approx(last - t0, abs=0.01)
        assert m["train_s"] == pytest.approx(script.metrics["finetune"]["train_s"])
        assert m["eval_loss"] == pytest.approx(1.25) and m["base_eval_loss"] == pytest.approx(3.5)

        # Cost: the node's nvidia.com/gpu.product (NVIDIA-H200) priced from the table, node
        # provisioning included, the provider (aws) from the node's instance type.
        tags = run["tags"]
        assert tags["llmpack.gpu_type"] == "nvidia-h200" and tags["llmpack.gpu_product"] == "NVIDIA-H200"
        assert tags["llmpack.gpu_type_source"] == "node nvidia.com/gpu.product=NVIDIA-H200"
        assert tags["llmpack.instance_type"] == "p5en.48xlarge"
        assert float(tags["llmpack.price_per_gpu_hour"]) == H200_AWS
        assert tags["llmpack.price_source"] == "aws-pricelist@2026-08"
        # GPU-hours are the containers' (plus provisioning); the cost is the node's time, the way a
        # cloud bills it: 8 GPUs from Ready to the last pod's finish + 600 s scale-down delay
        # (the watcher stopped with the run, before the autoscaler removed the node).
        gpu_s = expected_gpu_seconds(script)
        assert m["gpu_hours"] == pytest.approx(gpu_s / 3600, abs=0.01 / 3600)
        node_s = expected_node_gpu_seconds(script)
        assert tags["llmpack.cost_basis"] == "node" and tags["llmpack.scale_down_delay_s"] == "600"
        assert m["node_gpu_hours"] == pytest.approx(node_s / 3600, abs=1e-9)
        assert m["node_tail_gpus"] == 8
        assert m["cost_usd"] == pytest.approx(node_s * H200_AWS / 3600, abs=1e-6)
        assert m["cost_compute_usd"] + m["cost_overhead_usd"] == pytest.approx(m["cost_usd"])
        assert 0 < m["cost_compute_usd"] < gpu_s * H200_AWS / 3600 < m["cost_usd"]
        assert m["usd_per_1m_tokens"] == pytest.approx(m["cost_usd"] / script.metrics["finetune"]["train_tokens"] * 1e6)

    # KFP's own driver pods were watched (found by the run id KFP put on them), and are not steps.
    roles = {p["role"] for p in runs["kfp"]["pods"]}
    assert roles == {"driver", "executor"}
    assert {p["step"] for p in runs["kfp"]["pods"] if p["role"] == "executor"} == set(fake.fake.scripts[
        runs["kfp"]["pipeline_run"]].pods)
    # Where the pipeline paths differ: KFP's drivers before each step cost it spin-up.
    assert runs["kfp"]["metrics"]["spinup_s"] > runs["argo"]["metrics"]["spinup_s"]
    # The image pull on the new GPU node is in the pod rows.
    ft_pod = next(p for p in runs["argo"]["pods"] if p["step"] == "finetune")
    assert ft_pod["image_pull_s"] == fake.fake.timings.pull_s and ft_pod["instance_type"] == "p5en.48xlarge"

    # Progress: per run, from "submitting" to "succeeded", with the pods' states in between.
    for orch in ("kfp", "argo", "mlflow"):
        mine = [msg for label, msg, _ in seen if label == orch]
        assert mine[0] == "submitting" and mine[-1] == "succeeded", mine

    # The report: the timeline chart, and the cluster events of finetune in report.json.
    out = write_report(result, tmp_path / "report")
    assert (out / "timeline.png").stat().st_size > 0
    report = json.loads((out / "report.json").read_text())
    for run in report["runs"]:
        assert set(CLUSTER_EVENTS) <= set(run["events"]["finetune"]), run["orchestrator"]

    # MLflow alone rebuilds the same runs (llmpack report --run-group).
    rebuilt = {r["pipeline_run"]: r for r in runs_from_mlflow(tracking.client(fake.tracking_uri), result["run_group"])}
    assert set(rebuilt) == {r["pipeline_run"] for r in result["runs"]}
    for run in result["runs"]:
        again = rebuilt[run["pipeline_run"]]
        assert (again["orchestrator"], again["mode"], again["status"]) == (run["orchestrator"], "cluster", "succeeded")
        assert again["submitted_at"] == run["submitted_at"]
        assert again["events"] == run["events"]
        assert again["metrics"] == {k: v for k, v in run["metrics"].items() if v is not None}
        assert run["tags"].items() <= again["tags"].items()

    # llmpack report --scale-down-delay-s 60: the same runs re-billed with a 1-minute delay.
    for again in rebill.rebill(list(rebuilt.values()), 60):
        script = fake.fake.scripts[again["pipeline_run"]]
        assert again["metrics"]["cost_usd"] == pytest.approx(expected_node_gpu_seconds(script, 60) * H200_AWS / 3600)


def test_compare_cluster_bills_the_node_until_its_removal_when_seen(tmp_path: Path, tracking_uri: str) -> None:
    c = LoopbackCluster(tmp_path, tracking_uri, scale_down_s=30)
    try:
        result = cluster.compare_cluster(**c.options(backends="argo", scale_down_delay_s=120))
        c.fake.wait_idle()
    finally:
        c.close()
    (run,) = result["runs"]
    assert run["status"] == "succeeded", (run["error"], run["warnings"])
    script = c.fake.scripts[run["pipeline_run"]]
    m = run["metrics"]
    node_s = expected_node_gpu_seconds(script)  # Ready -> the deletionTimestamp the watcher read at the end
    assert node_s == 8 * (script.pods["evaluate"]["finished"] + 30 - script.node["ready"])
    assert m["node_tail_gpus"] == 0 and m["node_gpu_hours"] == pytest.approx(node_s / 3600)
    assert m["cost_usd"] == pytest.approx(node_s * H200_AWS / 3600)
    assert run["tags"]["llmpack.scale_down_delay_s"] == "120"  # not billed: the removal was seen
    with pytest.raises(InputError, match="--scale-down-delay-s"):
        cluster.compare_cluster(**c.options(scale_down_delay_s=-5))


def test_one_path_refused_keeps_the_others(tmp_path: Path, tracking_uri: str) -> None:
    fake = LoopbackCluster(tmp_path, tracking_uri)
    try:
        stdout = sys.stdout
        # Three at once; the pod watcher reaches the cluster through the MLflow path's kubeconfig.
        result = cluster.compare_cluster(**fake.options(argo={"host": fake.argo.url, "token": "wrong-Zz9SECRET"},
                                                        concurrency=3, k8s=None))
        fake.fake.wait_idle()
        assert sys.stdout is stdout
    finally:
        fake.close()
    runs = {r["orchestrator"]: r for r in result["runs"]}
    assert runs["kfp"]["status"] == runs["mlflow"]["status"] == "succeeded"
    argo = runs["argo"]
    assert argo["status"] == "failed" and "401" in argo["error"] and "wrong-Zz9SECRET" not in json.dumps(result)
    assert result["failed"] == [{"pipeline_run": argo["pipeline_run"], "orchestrator": "argo", "error": argo["error"]}]
    assert result["summary"]["argo"]["total_s"]["n"] == 0 and result["summary"]["kfp"]["total_s"]["n"] == 1
    assert not fake.argo.workflows  # nothing reached the Argo Server
    assert {r["pipeline_run"] for r in runs_from_mlflow(tracking.client(tracking_uri), result["run_group"])} == {
        runs["kfp"]["pipeline_run"], runs["mlflow"]["pipeline_run"]}
    write_report(result, tmp_path / "report")  # a failed path does not break the report


def test_failed_step_fails_its_run_only(tmp_path: Path, tracking_uri: str) -> None:
    fake = LoopbackCluster(tmp_path, tracking_uri, fail={"kfp": "evaluate"})
    try:
        result = cluster.compare_cluster(**fake.options(backends="kfp,argo"))
        fake.fake.wait_idle()
    finally:
        fake.close()
    runs = {r["orchestrator"]: r for r in result["runs"]}
    assert runs["argo"]["status"] == "succeeded"
    kfp_run = runs["kfp"]
    assert kfp_run["status"] == "failed" and kfp_run["failed_step"] == "evaluate"
    assert "evaluate" in kfp_run["error"] and kfp_run["tags"]["llmpack.status"] == "failed"
    assert kfp_run["metrics"]["time_to_first_step_s"] is not None  # what it measured is kept
    (again,) = [r for r in runs_from_mlflow(tracking.client(tracking_uri), result["run_group"])
                if r["orchestrator"] == "kfp"]
    assert again["status"] == "failed" and again["error"] == kfp_run["error"]


def test_a_run_that_does_not_finish_times_out(tmp_path: Path, tracking_uri: str) -> None:
    fake = LoopbackCluster(tmp_path, tracking_uri)
    fake.fake.close()  # nothing plays the Workflow: it stays Running
    try:
        result = cluster.compare_cluster(**fake.options(backends="argo", timeout_s=0.5))
    finally:
        fake.close()
    (run,) = result["runs"]
    assert run["status"] == "failed" and run["error"] == "did not finish within 0.5 s (last state Running)"
    assert run["state"] == "Running" and run["submitted_at"] is not None


# --------------------------------------------------------------------------- bad input


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_bad_input_is_one_line_before_anything_is_submitted(fake: LoopbackCluster) -> None:
    cases = [
        ({"backends": "kfp,direct"}, "cannot run on a cluster"),
        ({"repeats": 0}, "--repeats"),
        ({"concurrency": 0}, "--concurrency"),
        ({"params": {"max_steps": 0}}, "max_steps"),
        ({"params": {"nope": 1}}, "unknown pipeline parameter"),
        ({"price_per_gpu_hour": "cheap"}, "not a number"),
        ({"price_file": str(fake.kubeconfig.with_name("missing.yaml"))}, "cannot read price file"),
        ({"kfp": {"token": KFP_TOKEN}}, "no KFP endpoint"),
        ({"argo": {"host": fake.argo.url, "tokn": "x"}}, "unknown tokn"),
        ({"k8s": {"host": fake.kube.url, "token": "wrong-Kk1SECRET"}}, "401"),
        ({"k8s": {"host": f"http://127.0.0.1:{closed_port()}", "token": K8S_TOKEN}}, "connection refused"),
        ({"mlflow": {"kubeconfig": str(fake.kubeconfig), "namespace": "nowhere"}}, "'nowhere' not found"),
        ({"run_group": "Not_A_Label"}, "--run-group"),
        ({"variants": ["none", "everything"]}, "--fuse 'everything'"),
        ({"variants": ["gpu"], "gpus": 2}, "the many-process finetune runs unfused"),
        ({"variants": ["all"], "kfp": {"host": fake.kfp.url, "token": KFP_TOKEN, "package_path": "x.yaml"}},
         "option package_path cannot be given too"),
    ]
    for overrides, expected in cases:
        with pytest.raises(InputError) as info:
            cluster.compare_cluster(**fake.options(**overrides))
        message = str(info.value)
        assert expected in message and "\n" not in message and "SECRET" not in message, (overrides, message)
    assert not fake.kfp.runs and not fake.argo.workflows and not fake.kube.jobs


# --------------------------------------------------------------------------- GPU type and price from the node


def test_gpu_type_from_the_node() -> None:
    assert gpu_catalogue.gpu_type_for_product("NVIDIA-H100-80GB-HBM3") == "nvidia-h100-80gb"
    assert gpu_catalogue.gpu_type_for_product("NVIDIA-A100-SXM4-80GB") == "nvidia-a100-80gb"
    assert gpu_catalogue.gpu_type_for_product("NVIDIA-H200") == "nvidia-h200"
    assert gpu_catalogue.gpu_type_for_product("NVIDIA-L4") == "nvidia-l4"
    assert gpu_catalogue.gpu_type_for_product("NVIDIA-A100-SXM4-40GB-SHARED") == "nvidia-a100-40gb"  # time-sliced
    assert gpu_catalogue.gpu_type_for_product("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb") is None
    assert gpu_catalogue.gpu_type_for_product("NVIDIA-H100-PCIe") is None  # another product, another price
    assert gpu_catalogue.gpu_type_for_instance("p5.48xlarge") == ("nvidia-h100-80gb", "aws")
    assert gpu_catalogue.gpu_type_for_instance("p4de.24xlarge") == ("nvidia-a100-80gb", "aws")
    assert gpu_catalogue.gpu_type_for_instance("p5en.48xlarge") == ("nvidia-h200", "aws")
    assert gpu_catalogue.gpu_type_for_instance("a3-highgpu-8g") == ("nvidia-h100-80gb", "gcp")
    assert gpu_catalogue.gpu_type_for_instance("Standard_ND96isr_H100_v5") == ("nvidia-h100-80gb", "azure")
    assert gpu_catalogue.gpu_type_for_instance("m6i.4xlarge") is None

    # The product wins; the instance type names the provider whose list price applies.
    gpu = gpu_catalogue.node_gpu({"gpu_product": "NVIDIA-H100-80GB-HBM3", "instance_type": "a3-highgpu-8g"},
                                 "nvidia-a100-80gb")
    assert (gpu.gpu_type, gpu.provider) == ("nvidia-h100-80gb", "gcp")
    price = gpu_catalogue.resolve_node_price(gpu)
    assert (price.per_gpu_hour, price.provider) == (11.061, "gcp")
    # No product label (no GPU feature discovery): the instance type.
    gpu = gpu_catalogue.node_gpu({"gpu_product": None, "instance_type": "p5.48xlarge"}, "nvidia-a100-80gb")
    assert (gpu.gpu_type, gpu.source) == ("nvidia-h100-80gb", "node instance type p5.48xlarge")
    assert gpu_catalogue.resolve_node_price(gpu).per_gpu_hour == 6.88
    # An unknown product is reported under its own name: unpriced, unless the user prices it.
    gpu = gpu_catalogue.node_gpu({"gpu_product": "NVIDIA-H100-PCIe", "instance_type": "p5.48xlarge"},
                                 "nvidia-h100-80gb")
    assert gpu.gpu_type == "nvidia-h100-pcie" and gpu_catalogue.resolve_node_price(gpu) is None
    assert gpu_catalogue.resolve_node_price(gpu, flag="2.5").per_gpu_hour == 2.5
    # No node information at all: the pipeline spec's type.
    gpu = gpu_catalogue.node_gpu(None, "nvidia-h100-80gb")
    assert (gpu.gpu_type, gpu.source) == ("nvidia-h100-80gb", "pipeline spec")
    assert gpu_catalogue.resolve_node_price(gpu).per_gpu_hour == cost.resolve_price("nvidia-h100-80gb").per_gpu_hour


# --------------------------------------------------------------------------- the timeline chart's phases


def test_timeline_draws_the_provisioning_of_a_new_node() -> None:
    from llmpack.report.charts import _phase_spans

    t = 1_800_000_000.0
    events = {"pod_created": t, "node_ready": t + 7, "pod_scheduled": t + 8, "container_started": t + 14,
              "process_started": t + 14.35, "model_loaded": t + 15.65, "first_step": t + 16.45, "finished": t + 22.05}
    spans = {label: (start - t, end - t) for label, start, end, _ in _phase_spans(events)}
    assert spans["queue"] == (0, 8)
    assert spans["provision"] == (0, 7)
    assert spans["pull + container start"] == (8, 14)


# --------------------------------------------------------------------------- through the CLI


@pytest.mark.slow  # a whole compare --cluster through the CLI (~20 s)
def test_the_cli_compare_cluster_writes_a_report_with_cluster_phases(fake: LoopbackCluster, tmp_path: Path) -> None:
    import subprocess

    report = tmp_path / "report"
    env = client_env()
    env.update(KFP_TOKEN=KFP_TOKEN, ARGO_TOKEN=ARGO_TOKEN, HOME=str(tmp_path / "home"))
    r = subprocess.run(
        [sys.executable, "-m", "llmpack", "cluster", "compare", "--backends", "kfp,argo,mlflow", "--max-steps", "7",
         "--kfp-host", fake.kfp.url, "--argo-host", fake.argo.url, "--kubeconfig", str(fake.kubeconfig),
         "--tracking-uri", fake.tracking_uri, "--poll", "0.05", "--timeout", "60", "--report", str(report), "--json"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert [x["status"] for x in out["runs"]] == ["succeeded"] * 3
    saved = json.loads((report / "report.json").read_text())
    for run in saved["runs"]:
        finetune = run["events"]["finetune"]
        assert set(CLUSTER_EVENTS) <= set(finetune), run["orchestrator"]
        assert run["metrics"]["provision_s"] > 0 and run["metrics"]["queue_s"] > 0
    assert (report / "timeline.png").stat().st_size > 0
    for secret in (KFP_TOKEN, ARGO_TOKEN, K8S_TOKEN):
        assert secret not in r.stdout + r.stderr
