"""GPU utilisation in the record: the sampler on GPU steps and ``gpu_idle_before_first_step_s``.

The derivation on synthetic sample series; the nvidia-smi source against a stand-in executable
speaking the real CSV (tests/standins/nvidia_smi.py) and the NVML source against an object shaped
like ``pynvml``; a real step process (``python -m components.run``) of a GPU step sampling the
stand-in, logging its metrics into the JSONL and its series to the MLflow REST stand-in; and a CPU
run (no nvidia-smi, or one without a driver) that logs no GPU metric and succeeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from standins import nvidia_smi
from standins.mlflow_rest import MlflowRestStandIn

from components.record import gpu_metrics, telemetry
from components.record.gpu_metrics import Reading, Sample

REPO = Path(__file__).resolve().parents[2]
PROBE = "tests.components.gpu_probe_step:gpu_probe"


def _series(*utils: float | tuple[float, ...], t0: float = 100.0, dt: float = 1.0) -> list[Sample]:
    """Samples at t0+dt, t0+2dt, ...: one utilisation per GPU (a number: one GPU)."""
    out = []
    for k, u in enumerate(utils, start=1):
        per_gpu = u if isinstance(u, tuple) else (u,)
        out.append(Sample(t=t0 + k * dt, readings=tuple(Reading(gpu=i, util_pct=v, mem_used_mb=1.0, mem_total_mb=2.0)
                                                        for i, v in enumerate(per_gpu))))
    return out


# --------------------------------------------------------------------------- the derivation


def test_idle_before_first_step_counts_the_seconds_below_the_threshold() -> None:
    samples = _series(0, 0, 3, 0, 80, 90, 95, 0)  # at 101..108
    # [100,101] idle (the first sample holds back to the start), 102, 103 (3 < 5), 104 idle; busy from 104 on
    assert gpu_metrics.idle_seconds(samples, 100.0, 106.5, threshold=5.0) == pytest.approx(4.0)
    assert gpu_metrics.idle_seconds(samples, 100.0, 106.5, threshold=3.0) == pytest.approx(3.0)  # 3 % is not below 3
    assert gpu_metrics.idle_seconds(samples, 102.5, 103.5, threshold=5.0) == pytest.approx(1.0)  # clipped to the window
    # idle again from 107 to the last sample (108), which holds on to the end (110)
    assert gpu_metrics.idle_seconds(samples, 100.0, 110.0, threshold=5.0) == pytest.approx(4.0 + 1.0 + 2.0)


def test_idle_is_averaged_over_the_gpus_and_absent_without_samples() -> None:
    samples = _series((0, 0), (0, 0), (70, 0), (70, 0), (70, 60))  # GPU 1 starts two seconds later
    assert gpu_metrics.idle_seconds(samples, 100.0, 105.0, threshold=5.0) == pytest.approx((2 + 4) / 2)
    assert gpu_metrics.idle_seconds([], 100.0, 105.0, threshold=5.0) is None
    assert gpu_metrics.idle_seconds(samples, 100.0, 100.0, threshold=5.0) is None  # empty window
    assert gpu_metrics.idle_seconds(samples, 90.0, 95.0, threshold=5.0) is None  # every sample after the window


def test_summary_and_the_runs_figures_per_node() -> None:
    samples = _series(0, 0, 50, 100)
    s = gpu_metrics.summary(samples, started=100.0, first_step=103.0, threshold=5.0)
    assert s == {"gpu_util_mean_pct": 37.5, "gpu_mem_max_mb": 1.0, "gpus_sampled": 1.0,
                 "gpu_idle_before_first_step_s": pytest.approx(2.0)}
    assert "gpu_idle_before_first_step_s" not in gpu_metrics.summary(samples, started=100.0, first_step=None,
                                                                     threshold=5)
    assert gpu_metrics.summary([], started=100.0, first_step=103.0, threshold=5.0) == {}
    gang = {"gpu_idle_before_first_step_s.node0": 4.0, "gpu_idle_before_first_step_s.node1": 9.0,
            "gpu_util_mean_pct.node0": 40.0, "gpu_util_mean_pct.node1": 60.0, "train_s": 3.0}
    assert gpu_metrics.derived(gang) == {"gpu_idle_before_first_step_s": 9.0, "gpu_util_mean_pct": 50.0}
    assert gpu_metrics.derived({"train_s": 3.0}) == {"gpu_idle_before_first_step_s": None, "gpu_util_mean_pct": None}


def test_the_derived_record_has_the_idle_time_only_where_a_gpu_was_sampled() -> None:
    ctx = telemetry.RunContext(run_group="g", pipeline_run="p", orchestrator="direct", mode="local",
                               submitted_at=1000.0)
    recs = [telemetry.make_record(ctx, "event", "finetune", "process_started", 1001.0),
            telemetry.make_record(ctx, "event", "finetune", "first_step", 1009.0),
            telemetry.make_record(ctx, "event", "finetune", "finished", 1010.0)]
    cpu = telemetry.derive_metrics(telemetry.group_by_step(recs), submitted_at=1000.0)
    assert cpu["gpu_idle_before_first_step_s"] is None and cpu["gpu_util_mean_pct"] is None
    recs.append(telemetry.make_record(ctx, "metric", "finetune", "gpu_idle_before_first_step_s", 6.5))
    assert (telemetry.derive_metrics(telemetry.group_by_step(recs), submitted_at=1000.0)
            ["gpu_idle_before_first_step_s"] == 6.5)


# --------------------------------------------------------------------------- the sources


def test_smi_csv_parsed_in_megabytes_and_unsupported_gpus_left_out() -> None:
    text = "0, 87, 30512, 81559\n1, [N/A], [N/A], [N/A]\n\n2, 0, 0, 81559\n"
    readings = gpu_metrics.parse_smi_csv(text)
    assert [(r.gpu, r.util_pct) for r in readings] == [(0, 87.0), (2, 0.0)]
    assert readings[0].mem_used_mb == pytest.approx(30512 * 1.048576)


def test_the_sampler_reads_a_stand_in_nvidia_smi_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "busy"
    nvidia_smi.install(tmp_path / "bin", busy_marker=marker, gpus=2)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    source = gpu_metrics.smi_source()
    assert source is not None and [r.util_pct for r in source()] == [0.0, 0.0]
    sampler = gpu_metrics.start(tmp_path / "out", source=source, env={"LLMPACK_GPU_SAMPLE_INTERVAL_S": "0.05"})
    assert sampler is not None
    time.sleep(0.3)
    marker.touch()
    time.sleep(0.3)
    samples = sampler.stop()
    utils = [tuple(r.util_pct for r in s.readings) for s in samples]
    assert (0.0, 0.0) in utils and (87.0, 87.0) in utils and utils.index((87.0, 87.0)) > utils.index((0.0, 0.0))
    lines = (tmp_path / "out" / gpu_metrics.SAMPLES_FILE).read_text().splitlines()
    assert len(lines) == len(samples)  # every sample on disk as it was taken


def test_no_source_where_nvidia_smi_is_missing_or_has_no_driver(tmp_path: Path) -> None:
    assert gpu_metrics.smi_source(str(tmp_path / "absent")) is None
    broken = nvidia_smi.install(tmp_path / "bin", broken=True)
    assert gpu_metrics.smi_source(str(broken)) is None
    assert gpu_metrics.start(tmp_path, source=lambda: [], env={"LLMPACK_GPU_METRICS": "0"}) is None  # turned off


def test_nvml_source_reads_an_nvml_shaped_library() -> None:
    class NVMLError(Exception):
        pass

    def handle(i: int) -> str:
        return f"h{i}"

    util = {"h0": 12, "h1": 0}
    nvml = SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=2_000_000_000, total=80_000_000_000),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=util[h], memory=0))
    source = gpu_metrics.nvml_source(nvml)
    assert source is not None
    assert source() == [Reading(gpu=0, util_pct=12.0, mem_used_mb=2000.0, mem_total_mb=80000.0),
                        Reading(gpu=1, util_pct=0.0, mem_used_mb=2000.0, mem_total_mb=80000.0)]

    def no_driver() -> None:
        raise NVMLError("Driver Not Loaded")

    assert gpu_metrics.nvml_source(SimpleNamespace(nvmlInit=no_driver)) is None
    assert gpu_metrics.nvml_source(SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 0)) is None


def test_a_gang_nodes_metrics_end_in_its_node_and_measure_to_its_ranks_first_step(tmp_path: Path) -> None:
    from components.reporting import StepTelemetry

    assert gpu_metrics.node_of({"GROUP_RANK": "1", "RANK": "3"}) == "node1"
    ctx = telemetry.RunContext(run_group="g", pipeline_run="p", orchestrator="argo", mode="cluster", submitted_at=1.0)
    tel = StepTelemetry(ctx, "finetune", tmp_path / "llmpack-events.rank3.jsonl", rank=3)
    busy = threading.Event()
    started = time.time()
    sampler = gpu_metrics.start(tmp_path, step="finetune", node="node1", env={"LLMPACK_GPU_SAMPLE_INTERVAL_S": "0.05"},
                                source=lambda: [Reading(gpu=0, util_pct=90.0 if busy.is_set() else 0.0,
                                                        mem_used_mb=1.0, mem_total_mb=2.0)])
    time.sleep(0.4)
    busy_at = time.time()
    busy.set()
    time.sleep(0.2)
    tel.event("first_step")  # this rank's: first_step.rank3
    gpu_metrics.finish(sampler, tel, started=started)
    recs = {r.name: r.value for r in telemetry.read_records([tmp_path / "llmpack-events.rank3.jsonl"])}
    assert set(recs) == {"first_step.rank3", "gpu_idle_before_first_step_s.node1", "gpu_util_mean_pct.node1",
                         "gpu_mem_max_mb.node1", "gpus_sampled.node1"}
    # idle runs to the last idle sample (each reading holds back to the one before), whenever the sampler woke
    rows = [json.loads(line) for line in (tmp_path / "llmpack-gpu.node1.jsonl").read_text().splitlines()]
    idle_ts = [r["t"] for r in rows if r["gpus"][0]["util_pct"] == 0.0]
    busy_ts = [r["t"] for r in rows if r["gpus"][0]["util_pct"] == 90.0]
    assert idle_ts and busy_ts and max(idle_ts) < min(busy_ts), rows
    assert recs["gpu_idle_before_first_step_s.node1"] == pytest.approx(max(idle_ts) - started, abs=1e-6)
    assert max(idle_ts) <= busy_at  # busy is set after the last idle reading was taken
    assert set(gpu_metrics.read_series(tmp_path)) == {"system/finetune/node1/gpu_0_utilization_percentage",
                                                     "system/finetune/node1/gpu_0_memory_usage_megabytes"}


# --------------------------------------------------------------------------- a real step process


def _run_probe(tmp_path: Path, path_dir: Path, extra: dict[str, str],
               *params: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    env.update(PYTHONPATH=str(REPO), PATH=str(path_dir), LLMPACK_GPU_SAMPLE_INTERVAL_S="0.1", **extra)
    out = tmp_path / "out"
    tmp_path.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "components.run", PROBE, f"--output=out={out}",
         f"--param=busy_marker={tmp_path / 'busy'}",
         "--param=pipeline_run=gpu-probe", "--param=orchestrator=direct", "--param=mode=local",
         f"--param=submitted_at={time.time()}", *params],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out


def test_a_gpu_step_logs_its_idle_time_and_series(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    nvidia_smi.install(bin_dir, busy_marker=tmp_path / "busy")
    with MlflowRestStandIn() as srv:
        _, out = _run_probe(tmp_path, bin_dir, {"MLFLOW_TRACKING_URI": srv.url})
        batches = [r.body for r in srv.recorded("POST", "runs/log-batch")]
    recs = {r.name: r.value for r in telemetry.read_records([out / telemetry.EVENTS_FILE])}
    busy_at = float((out / "busy_at").read_text())
    idle = recs["gpu_idle_before_first_step_s"]
    # idle from the process start until the "kernels" started, to within a sample or two
    assert abs(idle - (busy_at - recs["process_started"])) < 0.5, (idle, busy_at - recs["process_started"])
    assert idle < recs["first_step"] - recs["process_started"] - 0.3  # the busy seconds before first_step are not idle
    assert recs["gpus_sampled"] == 1 and 0 < recs["gpu_util_mean_pct"] < 87
    assert (out / gpu_metrics.SAMPLES_FILE).is_file()
    logged = [m for b in batches for m in b.get("metrics", [])]
    util = [m for m in logged if m["key"] == "system/gpu-probe/gpu_0_utilization_percentage"]
    assert len(util) >= 5 and [m["step"] for m in util] == list(range(len(util)))
    assert {m["value"] for m in util} == {0.0, 87.0}
    assert any(m["key"] == "metric.gpu-probe.gpu_idle_before_first_step_s" for m in logged)
    # the client's upload and llmpack sync read the same series back from the run directory
    series = gpu_metrics.read_series(tmp_path)
    assert [(n, v) for n, v, _ in series["system/gpu-probe/gpu_0_utilization_percentage"]] == [
        (m["step"], m["value"]) for m in util]
    assert {k for m in logged if (k := m["key"]).startswith("system/")} == set(series)


def test_a_run_upload_logs_the_series_once(tmp_path: Path) -> None:
    """What ``llmpack run``'s client upload and ``llmpack sync`` send: every series, and nothing twice."""
    from components.record import rest, tracking

    samples = {"node0": _series(0, 50, 100), "node1": _series(0, 0, 90)}
    series = gpu_metrics.series("finetune", samples)
    ctx = telemetry.RunContext(run_group="g", pipeline_run="gpu-upload", orchestrator="argo", mode="cluster",
                               submitted_at=100.0)
    upload = tracking.RunUpload(ctx=ctx, records=[], metrics={}, tags={}, status="FINISHED", finished_at=110.0,
                                series=series)
    with MlflowRestStandIn() as srv:
        mc = rest.RestClient(srv.url)
        for _ in range(2):
            tracking.upload_run(mc, upload, tracking.upload_retry())
        logged = [m for r in srv.recorded("POST", "runs/log-batch") for m in r.body.get("metrics", [])
                  if m["key"].startswith("system/")]
    assert sorted({m["key"] for m in logged}) == sorted(series) and len(series) == 4  # 2 nodes x (utilisation, memory)
    assert len(logged) == 12  # 4 series x 3 samples, once
    node1 = sorted((m["step"], m["value"], m["timestamp"]) for m in logged
                   if m["key"] == "system/finetune/node1/gpu_0_utilization_percentage")
    assert node1 == [(0, 0.0, 101_000), (1, 0.0, 102_000), (2, 90.0, 103_000)]


@pytest.mark.skipif(gpu_metrics.nvml_source() is not None, reason="a real GPU with NVML here")
def test_a_cpu_run_logs_no_gpu_metric_and_never_fails(tmp_path: Path) -> None:
    for name, bin_dir in (("no nvidia-smi", tmp_path / "empty"), ("no driver", tmp_path / "broken")):
        bin_dir.mkdir()
        if name == "no driver":
            nvidia_smi.install(bin_dir, broken=True)
        _, out = _run_probe(tmp_path / name.replace(" ", "-"), bin_dir, {"LLMPACK_MLFLOW_LOGGING": "0"},
                            "--param=idle_s=0", "--param=busy_s=0")
        names = {r.name for r in telemetry.read_records([out / telemetry.EVENTS_FILE])}
        assert {"process_started", "first_step", "finished"} <= names
        assert not [n for n in names if n.startswith("gpu")], name
        assert not list(out.glob("llmpack-gpu*")), name


@pytest.mark.slow  # a two-node TrainJob of real finetune processes (tests/components/test_gang.py's stand-ins)
def test_each_gang_node_samples_its_gpus_and_the_run_takes_the_slowest(tokens: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from standins.k8s_api import KubeAPIStandIn

    from components.trainjob import gang
    from tests.components.test_gang import NS, TOKEN, TUNE, TrainerController, write_kubeconfig
    from tests.conftest import run_step

    bin_dir = tmp_path / "bin"
    nvidia_smi.install(bin_dir, gpus=2)  # idle all along: every second before the first step is idle
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")  # the node processes' too
    shared = tmp_path / "pvc"
    shared.mkdir()
    spec = gang.GangSpec(image="ghcr.io/llmpack/llmpack:0.1.0", gpus_per_node=0, cpu=1, memory="2Gi",
                         claim="shared", mount=str(shared))
    env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1", "LLMPACK_GPU_SAMPLE_INTERVAL_S": "0.2",
           "LLMPACK_GANG_SPECS": gang.spec_digest(spec)}  # as compile --nodes pins it in the launcher's pod
    monkeypatch.setenv("LLMPACK_GPU_SAMPLE_INTERVAL_S", "0.2")
    with KubeAPIStandIn(token=TOKEN, namespaces=(NS,)) as kube:
        TrainerController(kube)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
        out = tmp_path / "gang"
        from tests.sealing import for_run

        run_tokens = for_run(tokens, tmp_path / "run-tokens", "run-gpu-gang")  # a run takes only its own outputs
        r = run_step(TUNE, f"--input=tokens={run_tokens}", f"--output=model={out}", "--param=max_steps=2",
                     "--param=batch_size=4", "--param=nnodes=2", f"--param=trainjob={spec.to_json()}",
                     "--param=pipeline_run=run-gpu-gang", cwd=tmp_path, env={**env, "KUBECONFIG": str(kubeconfig)})
        assert r.returncode == 0, r.stdout + r.stderr
    step = telemetry.group_by_step(telemetry.read_records([out / telemetry.EVENTS_FILE]))["finetune"]
    for node in (0, 1):  # one process per node: rank R on node R
        idle = step.metrics[f"gpu_idle_before_first_step_s.node{node}"]
        own = step.events[f"first_step.rank{node}"] - step.events[f"process_started.rank{node}"]
        assert abs(idle - own) < 0.3, (node, idle, own)
        assert step.metrics[f"gpus_sampled.node{node}"] == 2 and step.metrics[f"gpu_util_mean_pct.node{node}"] == 0
        assert (out / f"llmpack-gpu.node{node}.jsonl").is_file()
    assert "gpu_idle_before_first_step_s" not in step.metrics  # the gang's figure is derived, never a node's
    derived = telemetry.derive_metrics({"finetune": step}, submitted_at=step.events["process_started"])
    assert derived["gpu_idle_before_first_step_s"] == max(step.metrics[f"gpu_idle_before_first_step_s.node{n}"]
                                                          for n in (0, 1))


@pytest.mark.slow  # the whole pipeline, llmpack run --backend direct, and MLflow's client reading the record
def test_llmpack_run_on_a_gpu_records_the_idle_time_and_the_series(tmp_path: Path) -> None:
    import json

    from tests.conftest import llmpack

    bin_dir = tmp_path / "bin"
    nvidia_smi.install(bin_dir, gpus=1)  # idle all along: finetune's idle time is its process start to first step
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "LLMPACK_GPU_SAMPLE_INTERVAL_S": "0.2"}
    r = llmpack("run", "--backend", "direct", "--max-steps", "4", "--json", "--tracking-uri", uri,
                cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    recs = telemetry.group_by_step(telemetry.read_records([Path(summary["artifacts"]["events_file"])]))
    tune = recs["finetune"]
    own = tune.events["first_step"] - tune.events["process_started"]
    assert abs(summary["metrics"]["gpu_idle_before_first_step_s"] - own) < 0.5
    assert summary["metrics"]["gpu_util_mean_pct"] == 0
    assert "gpu_util_mean_pct" in recs["evaluate"].metrics and "gpu_util_mean_pct" not in recs["tokenize"].metrics

    from mlflow.tracking import MlflowClient

    mc = MlflowClient(uri)
    run = mc.get_run(summary["artifacts"]["mlflow_run_id"])
    assert (run.data.metrics["gpu_idle_before_first_step_s"]
            == pytest.approx(summary["metrics"]["gpu_idle_before_first_step_s"]))
    history = mc.get_metric_history(run.info.run_id, "system/finetune/gpu_0_utilization_percentage")
    assert len(history) >= 2 and [m.step for m in history] == list(range(len(history)))
    assert {m.value for m in history} == {0.0} and "system/evaluate/gpu_0_memory_usage_megabytes" in run.data.metrics
