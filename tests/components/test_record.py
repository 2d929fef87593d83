"""The pipeline closes its own record: submit-time sources, run identity, status, and each native path.

Each native path (``mlflow run``, kfp's loader + kfp.local, the compiled Argo YAML) is run with no
llmpack client by tests/llmpack/test_tutorials.py, which checks the record it leaves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from components import fusion, settings
from components.fusion import FUSE_TAG
from components.record import close as record
from components.record import telemetry
from components.record.cost import GpuUse
from components.record.telemetry import RunContext, make_record

REPO = Path(__file__).resolve().parents[2]
LLMPACK_CLI = Path(sys.executable).with_name("llmpack")


def _rec(step: str, name: str, value: float, kind: str = "event") -> telemetry.Record:
    ctx = RunContext(run_group="g", pipeline_run="p", orchestrator="kfp", mode="cluster", submitted_at=0.0)
    return make_record(ctx, kind, step, name, value)


# --------------------------------------------------------------------------- pure rules


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-01-09T12:34:56Z", 1767962096.0),
    ("2026-01-09T14:34:56+02:00", 1767962096.0),
    ("1767962096.5", 1767962096.5),
    ("", None),
    ("{{$.pipeline_job_create_time_utc}}", None),  # an older KFP backend passes the literal text
    ("{{workflow.creationTimestamp}}", None),
    ("2026-01-09T12:34:56", None),  # no zone: refused rather than guessed
    ("yesterday", None),
    ("0", None),
])
def test_parse_timestamp(text: str, expected: float | None):
    assert record.parse_timestamp(text) == expected


def test_submit_time_prefers_the_client_then_the_orchestrator_then_the_first_pod():
    records = [_rec("prepare-data", "process_started", 105.0), _rec("finetune", "pod_created", 103.0),
               _rec("finetune", "first_step", 200.0)]
    assert record.resolve_submit_time(100.0, "2026-01-09T12:34:56Z", records) == (100.0, "client")
    assert record.resolve_submit_time(0.0, "2026-01-09T12:34:56Z", records) == (1767962096.0, "orchestrator")
    assert record.resolve_submit_time(0.0, "{{workflow.creationTimestamp}}", records) == (103.0, "first_pod")
    assert record.resolve_submit_time(0.0, None, []) == (0.0, "none")


def test_without_a_submit_time_no_metric_is_measured_from_1970():
    records = [_rec("finetune", "process_started", 10.0), _rec("finetune", "first_step", 12.0),
               _rec("finetune", "finished", 20.0)]
    ctx = RunContext(run_group="g", pipeline_run="p", orchestrator="kfp", mode="cluster", submitted_at=0.0)
    metrics, _ = record.summarize(ctx=ctx, records=records, uses=[], price=None, finished_at=21.0)
    assert metrics["spinup_s"] is None and metrics["time_to_first_step_s"] is None and metrics["total_s"] is None


@pytest.mark.parametrize(("given", "expected"), [
    ("Succeeded", "FINISHED"), ("SUCCEEDED", "FINISHED"), ("Failed", "FAILED"), ("Error", "FAILED"),
    ("FAILED", "FAILED"), ("CANCELED", "KILLED"), ("Cancelled", "KILLED"), ("KILLED", "KILLED"), ("weird", "FAILED"),
])
def test_orchestrator_states_map_to_mlflow_statuses(given: str, expected: str):
    assert record.record_status(given) == expected


def test_an_empty_pipeline_run_takes_the_orchestrator_run_id():
    assert record.identity({"pipeline_run": "", "run_group": ""}, "llm-finetune-x7k2p") == (
        "llm-finetune-x7k2p", "llm-finetune-x7k2p")
    assert record.identity({"pipeline_run": "mine", "run_group": "g"}, "other") == ("g", "mine")


def test_close_writes_the_summary_from_the_jsonl_without_mlflow(tmp_path: Path):
    """Client mode: the summary file is derived from the step records, nothing is sent to MLflow."""
    log = telemetry.EventLog(tmp_path / "finetune" / "model" / telemetry.EVENTS_FILE)
    ctx = RunContext(run_group="g", pipeline_run="p1", orchestrator="argo", mode="local", submitted_at=0.0)
    for name, value in (("process_started", 1000.0), ("first_step", 1004.0), ("finished", 1010.0)):
        log.append(make_record(ctx, "event", "finetune", name, value))
    log.append(make_record(ctx, "metric", "finetune", "train_s", 6.0))
    uses = [GpuUse(step="finetune", gpus=2, cpu=16, gpu_type="nvidia-h100-80gb")]
    env = {settings.CLIENT_UPLOADS.name: "1", "LLMPACK_PRICE_PER_GPU_HOUR": "3.6"}
    summary = record.close(values={"pipeline_run": "p1", "run_group": "g", "orchestrator": "argo", "mode": "local",
                                   "submitted_at": "0.0"},
                           status="Succeeded", uses=uses, orchestrator_created_at="1970-01-01T00:16:38Z",
                           finished_at=1011.0, records_dir=tmp_path, env=env)
    assert summary == record.read_summary(tmp_path)
    assert summary["status"] == "FINISHED" and summary["submit_time_source"] == "orchestrator"
    m = summary["metrics"]
    assert m["spinup_s"] == pytest.approx(2.0) and m["time_to_first_step_s"] == pytest.approx(6.0)
    assert m["cost_usd"] == pytest.approx(2 * 10.0 * 3.6 / 3600)
    assert summary["tags"]["llmpack.price_source"] == "env"
    assert summary["tags"]["llmpack.submit_time_source"] == "orchestrator"


def test_the_command_line_runs_as_compiled(tmp_path: Path):
    """What every compiled exit handler runs: ``python -m components.record ...``."""
    args = record.record_args(status="Failed", uses=record.uses_json([GpuUse(step="finetune", gpus=1, gpu_type="x")]),
                              run_id="wf-abc", created_at="", params={"submitted_at": "0.0", "pipeline_run": "",
                                                                      "run_group": "", "orchestrator": "argo",
                                                                      "mode": "cluster"})
    env = {**os.environ, settings.CLIENT_UPLOADS.name: "1", settings.RECORDS_DIR.name: str(tmp_path)}
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = record.read_summary(tmp_path)
    assert summary["pipeline_run"] == "wf-abc" and summary["status"] == "FAILED"
    assert summary["submit_time_source"] == "none"


@pytest.mark.parametrize("fuse", ["none", "gpu", "all", "GPU"])
def test_a_fused_pipeline_closes_its_record_tagged_with_its_packaging(tmp_path: Path, fuse: str):
    """A record closed on the cluster without the client says how its steps were packaged, so a fused
    run's history is its own path's (llmpack plan, report), as a client-closed record's is."""
    args = record.record_args(status="Succeeded", uses="[]", run_id="wf-f", created_at="", fuse=fuse,
                              params={"submitted_at": "0.0", "pipeline_run": "", "run_group": "",
                                      "orchestrator": "argo", "mode": "cluster"})
    env = {**os.environ, settings.CLIENT_UPLOADS.name: "1", settings.RECORDS_DIR.name: str(tmp_path)}
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)
    if fuse == "GPU":  # a mode the compiler never writes: one line, nothing written
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            "llmpack: error: --fuse 'GPU': choose one of none, gpu, all; did you mean 'gpu'?"], proc.stderr
        assert record.read_summary(tmp_path) is None
        return
    assert proc.returncode == 0, proc.stderr
    tags = record.read_summary(tmp_path)["tags"]
    assert tags.get(FUSE_TAG, "none") == fuse and (FUSE_TAG in tags) == (fuse != "none")
    assert fusion.path_of({"orchestrator": "argo", "tags": tags}) == fusion.path_label("argo", fuse)


def test_every_path_compiled_fused_tells_its_summarizing_task_so() -> None:
    golden = REPO / "tests" / "fixtures" / "golden" / "fuse-gpu"
    assert "- --fuse=gpu\n" in (golden / "argo_workflows" / "finetune.yaml").read_text()
    assert "'--fuse=gpu'" in (golden / "kfp_pipelines" / "finetune.yaml").read_text()
    for project in ("finetune", "finetune-k8s"):
        spec = json.loads((golden / "mlflow_projects" / project / "pipeline.json").read_text())
        assert spec["fuse"] == "gpu"
    assert "fuse" not in json.loads((REPO / "mlflow_projects" / "finetune" / "pipeline.json").read_text())
    assert "--fuse" not in (REPO / "argo_workflows" / "finetune.yaml").read_text()


# --------------------------------------------------------------------------- compiled artifacts


def test_every_compiled_path_ends_with_the_summarizing_task():
    argo = yaml.safe_load((REPO / "argo_workflows" / "finetune.yaml").read_text())
    assert argo["spec"]["onExit"] == record.CLOSE_TASK
    (close,) = [t for t in argo["spec"]["templates"] if t["name"] == record.CLOSE_TASK]
    args = close["container"]["args"]
    assert "--status={{workflow.status}}" in args and "--created-at={{workflow.creationTimestamp}}" in args
    assert "--run-id={{workflow.name}}" in args
    steps = [t for t in argo["spec"]["templates"] if "container" in t and t["name"] != record.CLOSE_TASK]
    assert all("--param=orchestrator_run_id={{workflow.name}}" in t["container"]["args"] for t in steps)

    kfp = yaml.safe_load_all((REPO / "kfp_pipelines" / "finetune.yaml").read_text())
    spec = next(iter(kfp))
    root = spec["root"]["dag"]["tasks"]
    exit_task = root[record.CLOSE_TASK]
    assert exit_task["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert "taskFinalStatus" in exit_task["inputs"]["parameters"]["status"]

    pipeline_json = json.loads((REPO / "mlflow_projects" / "finetune" / "pipeline.json").read_text())
    assert pipeline_json["uses"] == [{"cpu": 8, "gpu_type": "nvidia-h100-80gb", "gpus": 1, "step": "finetune"},
                                     {"cpu": 8, "gpu_type": "nvidia-h100-80gb", "gpus": 1, "step": "evaluate"}]


def compiled_uses(base: Path) -> dict[str, str]:
    """The ``--uses`` each compiled path's summarizing task runs with, as compiled (by path)."""
    import re

    argo = yaml.safe_load((base / "argo_workflows" / "finetune.yaml").read_text())
    (close,) = [t for t in argo["spec"]["templates"] if t["name"] == record.CLOSE_TASK]
    found = {"argo": next(a for a in close["container"]["args"] if a.startswith("--uses="))[len("--uses="):]}
    spec = next(iter(yaml.safe_load_all((base / "kfp_pipelines" / "finetune.yaml").read_text())))
    source = "\n".join(spec["deploymentSpec"]["executors"][f"exec-{record.CLOSE_TASK}"]["container"]["command"])
    (found["kfp"],) = re.findall(r"'--uses=(\[[^']*\])'", source)
    for project in ("finetune", "finetune-k8s"):  # main's final block passes pipeline.json's uses
        found[f"mlflow {project}"] = json.dumps(
            json.loads((base / "mlflow_projects" / project / "pipeline.json").read_text())["uses"])
    return found


@pytest.mark.parametrize("path", ["argo", "kfp", "mlflow finetune", "mlflow finetune-k8s"])
def test_a_gang_is_billed_for_its_nodes_times_gpus_on_every_compiled_path(path: str, tmp_path: Path):
    """``compile --nodes 2 --gpus 4`` (examples/multinode, a fresh compile by the golden test): the summarizing
    task of every path bills finetune's 8 GPUs for its time, as the compiled spec says, not its launcher's none."""
    uses = record.parse_uses(compiled_uses(REPO / "examples" / "multinode")[path])
    # MLflow's one Job runs on CPU beside a gang (no GPU idles in it while the gang trains): only the gang billed
    gang = 8
    evaluate = 0 if path.startswith("mlflow") else 1
    assert {u.step: u.gpus for u in uses} == {"finetune": gang, **({"evaluate": 1} if evaluate else {})}
    ctx = RunContext(run_group="g", pipeline_run="p1", orchestrator="argo", mode="cluster", submitted_at=1000.0)
    times = {"finetune": (("process_started", 1000.0), ("first_step", 1060.0), ("finished", 4600.0)),
             "evaluate": (("process_started", 4600.0), ("finished", 4660.0))}
    for step, events in times.items():
        log = telemetry.EventLog(tmp_path / step / "out" / telemetry.EVENTS_FILE)
        for name, value in events:
            log.append(make_record(ctx, "event", step, name, value))
    telemetry.EventLog(tmp_path / "finetune" / "out" / telemetry.EVENTS_FILE).append(
        make_record(ctx, "metric", "finetune", "train_s", 3540.0))
    env = {settings.CLIENT_UPLOADS.name: "1", "LLMPACK_PRICE_PER_GPU_HOUR": "6.9"}
    summary = record.close(values={"pipeline_run": "p1", "run_group": "g", "orchestrator": "argo", "mode": "cluster",
                                   "submitted_at": "1000.0"}, status="Succeeded", uses=uses, finished_at=4661.0,
                           records_dir=tmp_path, env=env)
    m, tags = summary["metrics"], summary["tags"]
    gpu_hours = gang * 3600 / 3600 + evaluate * 60 / 3600
    assert m["gpu_hours"] == pytest.approx(gpu_hours) and m["cost_usd"] == pytest.approx(gpu_hours * 6.9)
    assert m["goodput"] > 0.9  # the training GPU-seconds are most of the bill, as they are
    assert tags["llmpack.gpu_count"] == str(gang) and tags["llmpack.gpu_type"] == "nvidia-h100-80gb"
    assert tags["llmpack.cpu_to_gpu_ratio"] == "8"  # the node pods' 32 CPUs per 4 GPUs: the spec's 8 per GPU


def test_the_compiled_uses_agree_across_paths_and_with_the_pipeline():
    """Every path's summarizing task bills what :func:`record.billed_uses` says of the pipeline it was compiled from."""
    from components.finetune_pipeline import build
    from llmpack.compile.artifacts import with_gpus
    from mlflow_projects.compiler import job_uses

    for base, pipe in ((REPO, build()),
                       (REPO / "examples" / "multinode", with_gpus(build(), 4, 2, claim="llmpack-shared"))):
        expected = json.loads(record.uses_json(record.billed_uses(pipe)))
        mlflow = json.loads(record.uses_json(job_uses(pipe)))  # + the one Job's own GPU while a gang trains
        assert {path: json.loads(text) for path, text in compiled_uses(base).items()} == {
            "argo": expected, "kfp": expected, "mlflow finetune": mlflow, "mlflow finetune-k8s": mlflow}, base
        assert (mlflow == expected) == (base == REPO)
    # what each pod holds stays the pods' own (the cluster's pod billing bills the gang's node pods itself)
    gang = with_gpus(build(), 4, 2, claim="llmpack-shared")
    assert {u.step: u.gpus for u in record.gpu_uses(gang)}["finetune"] == 0


def test_a_step_may_not_take_the_summarizing_tasks_name():
    from dataclasses import replace

    from components.dsl import Task
    from components.errors import PipelineValidationError
    from components.finetune_pipeline import build

    pipe = build()
    clash = Task(name=record.CLOSE_TASK, step=pipe.tasks["register"].step, arguments={})
    with pytest.raises(PipelineValidationError, match="reserved for the run's summarizing task"):
        replace(pipe, tasks={**pipe.tasks, record.CLOSE_TASK: clash}).validate()


# --------------------------------------------------------------------------- native paths, no client


def _records(tracking_db: Path) -> list:
    from mlflow.tracking import MlflowClient

    mc = MlflowClient(f"sqlite:///{tracking_db}")
    return mc.search_runs([e.experiment_id for e in mc.search_experiments()])


def _native_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               MLFLOW_TRACKING_URI="sqlite:///mlflow.db", HF_HUB_OFFLINE="1")
    return env


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code", "backend"), [(signal.SIGINT, 130, "direct"), (signal.SIGTERM, 143, "mlflow")])
def test_an_interrupted_run_exits_with_the_signal_and_leaves_nothing_running(tmp_path: Path, sig: int, code: int,
                                                                              backend: str):
    env = {**_native_env(), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    proc = subprocess.Popen([str(LLMPACK_CLI), "run", "--backend", backend, "--max-steps", "200"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "llmpack-runs").rglob("finetune.log")):
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    (kept,) = (tmp_path / "llmpack-runs").glob("*.failed")
    assert f"kept {kept}" in err and "rm -rf" in err
    assert "Traceback" not in err
    runs = _records(tmp_path / "mlflow.db")
    assert runs and not [r for r in runs if r.info.status == "RUNNING"]
    (rec,) = [r for r in runs if r.data.tags.get("llmpack.record") == "pipeline"]
    assert rec.info.status == "KILLED"
    leftover = subprocess.run(["pgrep", "-f", str(kept.with_suffix(""))], capture_output=True, text=True)
    assert not leftover.stdout.strip(), "a step process outlived the client"
