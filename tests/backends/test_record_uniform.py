"""One record, whoever starts the run.

Unit checks of :mod:`components.record.uniform` and of the summarizing task with KFP's MLflow plugin
variables set; then (slow) the same one-step pipeline run by every path — direct, kfp.local, the Argo
local executor, ``mlflow run`` as llmpack drives it, and a plain ``mlflow run`` typed by a user —
each leaving its record, closed by its own summarizing task, in the ``llmpack`` experiment with the
same parameter names.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from components.commands import pipeline_values
from components.dsl import Pipeline, pipeline
from components.record import close as record
from components.record import uniform

TOY_STEPS = '''
from pathlib import Path

from components.dsl import Dataset, Metrics, Output, step


@step(name="toy-echo")
def toy_echo(out: Output[Dataset], scores: Output[Metrics], text: str = "hi", repeat: int = 1,
             sleep_s: float = 0.0) -> None:
    """Write the text, a score as evaluate writes its metrics, and a short training log as finetune writes one."""
    import time

    time.sleep(sleep_s)
    (Path(out.path) / "data.txt").write_text(text * repeat)
    (Path(scores.path) / "metrics.json").write_text('{"score": 0.5, "passed": true, "label": "x"}')
    log = "".join('{"step": %d, "loss": %s, "lr": 0.001}\\n' % (i, 2.0 / i) for i in range(1, 4))
    (Path(out.path) / "train_log.jsonl").write_text(log)
'''


# --------------------------------------------------------------------------- the rules, one by one


def test_metrics_from_the_first_pod_are_named_for_it_and_submit_instants_keep_spinup_s():
    metrics = {"spinup_s": 3.0, "time_to_first_step_s": 5.0, "total_s": 9.0, "eval_loss": 1.0}
    for source in ("client", "orchestrator", "none"):
        assert uniform.name_from_submit(metrics, source) == metrics
    renamed = uniform.name_from_submit(metrics, "first_pod")
    assert renamed == {"spinup_from_first_pod_s": 3.0, "time_to_first_step_from_first_pod_s": 5.0,
                       "total_from_first_pod_s": 9.0, "eval_loss": 1.0}


def test_mode_auto_is_cluster_only_inside_a_pod():
    assert uniform.effective_mode("auto", {}) == "local"  # a plain kfp.local call of a KFP package
    assert uniform.effective_mode("auto", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) == "cluster"
    assert uniform.effective_mode("cluster", {}) == "cluster"  # still refuses a sqlite file outside a pod
    assert uniform.effective_mode("local", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) == "local"


def test_the_kfp_package_compiles_mode_auto():
    from kfp_pipelines.compiler import TELEMETRY_DEFAULTS

    assert TELEMETRY_DEFAULTS["mode"] == uniform.AUTO_MODE


def test_the_loss_curve_is_read_by_step_and_a_cut_last_line_is_skipped(tmp_path: Path):
    log = tmp_path / "finetune" / "model" / uniform.TRAIN_LOG
    log.parent.mkdir(parents=True)
    log.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}\n{"step": 2, "loss": 2.0}\n{"step": 3, "lo')
    assert uniform.loss_curve(tmp_path) == [(1, 2.5), (2, 2.0)]
    assert uniform.loss_curve(tmp_path / "nothing") == [] and uniform.loss_curve(None) == []


def test_record_params_are_every_value_with_the_identity_resolved():
    params = uniform.record_params({"max_steps": 5, "lr": 0.5, "flag": True, "pipeline_run": "", "run_group": "",
                                    "submitted_at": 0.0}, run_group="g", pipeline_run="p", submitted_at=12.5)
    assert params == {"max_steps": "5", "lr": "0.5", "flag": "true", "pipeline_run": "p", "run_group": "g",
                      "submitted_at": "12.5"}


def _plugin_env(tmp_path: Path, uri: str) -> dict[str, str]:
    """What KFP 2.17's MLflow plugin injects into a step container (KEP-12862), with a KFP experiment of its own."""
    from mlflow.tracking import MlflowClient

    mc = MlflowClient(uri)
    kfp_exp = mc.create_experiment("kfp-plugin", artifact_location=(tmp_path / "kfp-art").as_uri())
    kfp_run = mc.create_run(kfp_exp, run_name="close-record")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    return {**env, "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_ID": kfp_exp, "MLFLOW_RUN_ID": kfp_run.info.run_id}


def test_with_kfps_mlflow_plugin_the_record_stays_in_llmpack_and_links_to_kfps_run(
        tmp_path: Path, fresh_tracking_uri: str, monkeypatch: pytest.MonkeyPatch):
    from mlflow.tracking import MlflowClient

    env = _plugin_env(tmp_path, fresh_tracking_uri)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID"):
        monkeypatch.setenv(name, env[name])  # the steps' own uploads read os.environ
    monkeypatch.delenv("LLMPACK_EXPERIMENT", raising=False)
    (tmp_path / "records" / "finetune" / "model").mkdir(parents=True)
    (tmp_path / "records" / "finetune" / "model" / uniform.TRAIN_LOG).write_text(
        '{"step": 1, "loss": 3.0}\n{"step": 2, "loss": 2.0}\n')
    values = {"pipeline_run": "kfp-job-1", "run_group": "", "orchestrator": "kfp", "mode": "cluster",
              "submitted_at": "0.0", "max_steps": "2"}
    summary = record.close(values=values, status="SUCCEEDED", uses=[], records_dir=tmp_path / "records",
                           env={**env, "KUBERNETES_SERVICE_HOST": "10.0.0.1"})

    mc = MlflowClient(fresh_tracking_uri)
    rec = mc.get_run(summary["mlflow_run_id"])
    assert mc.get_experiment(rec.info.experiment_id).name == "llmpack"
    assert not mc.search_runs([env["MLFLOW_EXPERIMENT_ID"]], "tags.`llmpack.record` = 'pipeline'")  # none beside KFP's
    assert rec.data.tags[uniform.INJECTED_RUN_TAG] == env["MLFLOW_RUN_ID"]
    assert rec.data.tags[uniform.INJECTED_EXPERIMENT_TAG] == env["MLFLOW_EXPERIMENT_ID"]
    assert rec.data.tags["llmpack.mode"] == "cluster" and rec.info.status == "FINISHED"
    assert set(rec.data.params) == set(values) and rec.data.params["run_group"] == "kfp-job-1"
    curve = mc.get_metric_history(rec.info.run_id, uniform.LOSS_CURVE)
    assert sorted((m.step, m.value) for m in curve) == [(1, 3.0), (2, 2.0)]
    # closing again (a retried exit handler) logs the curve once
    record.close(values=values, status="SUCCEEDED", uses=[], records_dir=tmp_path / "records",
                 env={**env, "KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert len(mc.get_metric_history(rec.info.run_id, uniform.LOSS_CURVE)) == 2


# --------------------------------------------------------------------------- every path, one pipeline


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pipeline, Path]:
    root = tmp_path_factory.mktemp("uniform-toy")
    (root / "llmpack_uniform_toy_steps.py").write_text(textwrap.dedent(TOY_STEPS), encoding="utf-8")
    sys.path.insert(0, str(root))
    try:
        mod = importlib.import_module("llmpack_uniform_toy_steps")
    finally:
        sys.path.remove(str(root))

    @pipeline(name="toy-uniform")
    def toy_uniform(text: str = "hi", repeat: int = 2, sleep_s: float = 0.0):
        mod.toy_echo(text=text, repeat=repeat, sleep_s=sleep_s)

    return toy_uniform(), root


def _env(toy_dir: Path, uri: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    path = os.pathsep.join(p for p in (str(toy_dir), os.environ.get("PYTHONPATH", "")) if p)
    bindir = str(Path(sys.executable).parent)
    return {**env, "PYTHONPATH": path, "MLFLOW_TRACKING_URI": uri,
            "PATH": os.pathsep.join([bindir, env.get("PATH", "")])}


def _the_record(uri: str):
    from mlflow.tracking import MlflowClient

    mc = MlflowClient(uri)
    runs = mc.search_runs([e.experiment_id for e in mc.search_experiments()])
    assert not [r for r in runs if r.info.status == "RUNNING"], "a run was left RUNNING"
    (rec,) = [r for r in runs if r.data.tags.get("llmpack.record") == "pipeline"]
    return mc, rec, runs


@pytest.mark.slow
def test_every_path_leaves_the_same_record(toy: tuple[Pipeline, Path], tmp_path: Path, mlflow_template_db: Path):
    from argo_workflows.local import run_local as run_argo
    from kfp_pipelines.local import run_local as run_kfp
    from llmpack.run.direct import run_local as run_direct
    from mlflow_projects.local import run_local as run_mlflow
    from tests.conftest import fresh_store

    pipe, toy_dir = toy
    expected = set(pipe.all_params)
    seen = {}
    for name, run in (("direct", run_direct), ("kfp", run_kfp), ("argo", run_argo), ("mlflow", run_mlflow)):
        uri = fresh_store(mlflow_template_db, tmp_path / name / "mlflow.db")
        values = pipeline_values(pipe, {"text": "ok", "orchestrator": name, "pipeline_run": f"p-{name}"})
        run(pipe, values, tmp_path / name / "work", _env(toy_dir, uri))
        mc, rec, _ = _the_record(uri)
        names = set(rec.data.params) - set(uniform.MLFLOW_PROJECT_PARAMS if name == "mlflow" else ())
        seen[name] = (mc.get_experiment(rec.info.experiment_id).name, names, rec.info.status,
                      rec.data.tags["llmpack.mode"], rec.data.tags["llmpack.status"])
        assert [(m.step, m.value) for m in mc.get_metric_history(rec.info.run_id, uniform.LOSS_CURVE)] == [
            (1, 2.0), (2, 1.0), (3, 2.0 / 3)], name
        assert rec.data.params["text"] == "ok" and rec.data.params["pipeline_run"] == f"p-{name}"
        if name == "kfp":
            _check_kfp_scalars(tmp_path / name / "work", rec.data.metrics)
    assert seen == dict.fromkeys(seen, ("llmpack", expected, "FINISHED", "local", "succeeded")), seen


@pytest.mark.slow
def test_a_plain_mlflow_run_records_in_llmpack_and_links_its_own_run(toy: tuple[Pipeline, Path], tmp_path: Path,
                                                                     fresh_tracking_uri: str):
    """``mlflow run`` typed by a user puts its run in ``Default``: the record is opened in ``llmpack``, linked."""
    from mlflow_projects.compiler import write_local_project
    from mlflow_projects.local import mlflow_command

    pipe, toy_dir = toy
    project = write_local_project(pipe, tmp_path / "project")
    proc = subprocess.run([*mlflow_command(), "run", str(project), "-e", "main", "--env-manager", "local",
                           "-P", "text=typed"], cwd=tmp_path, env=_env(toy_dir, fresh_tracking_uri),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mc, rec, runs = _the_record(fresh_tracking_uri)
    assert mc.get_experiment(rec.info.experiment_id).name == "llmpack"
    (shell,) = [r for r in runs if r.info.run_id == rec.data.tags["llmpack.mlflow_run_id"]]
    assert mc.get_experiment(shell.info.experiment_id).name == "Default"
    assert shell.data.tags["llmpack.record_run_id"] == rec.info.run_id and shell.info.status == "FINISHED"
    assert f"Run (ID '{shell.info.run_id}') succeeded" in proc.stderr
    assert rec.data.tags["llmpack.pipeline_run"] == f"mlflow-{shell.info.run_id[:12]}"
    assert rec.data.tags["llmpack.submit_time_source"] == "orchestrator" and rec.info.status == "FINISHED"
    assert set(rec.data.params) == set(pipe.all_params) and rec.data.params["text"] == "typed"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == rec.info.run_id]
    assert [c.data.tags["llmpack.step"] for c in children] == ["toy-echo"]
    assert [m.step for m in mc.get_metric_history(rec.info.run_id, uniform.LOSS_CURVE)] == [1, 2, 3]
    status = json.loads(next((tmp_path).rglob("llmpack-mlflow-run.json")).read_text())
    assert status["status"] == "FINISHED"


def _check_kfp_scalars(workdir: Path, record_metrics: dict[str, float]) -> None:
    """kfp.local's output artifacts: each Output[Metrics] carries its numbers as system.Metrics scalars."""
    metadata = {}
    for path in workdir.rglob("executor_output.json"):
        for name, listed in json.loads(path.read_text()).get("artifacts", {}).items():
            for artifact in listed.get("artifacts", []):
                metadata[name] = artifact.get("metadata", {})
    assert metadata["scores"] == {"score": 0.5}, metadata  # a step's own: numbers only, booleans and text left out
    headline = metadata["headline"]  # the summarizing task's: the run's headline numbers, as on its record
    assert "total_from_first_pod_s" in headline and "total_s" not in headline, headline
    assert headline["total_from_first_pod_s"] == pytest.approx(record_metrics["total_from_first_pod_s"])


@pytest.mark.slow
def test_ctrl_c_of_a_plain_mlflow_run_ends_the_record_killed(toy: tuple[Pipeline, Path], tmp_path: Path,
                                                             fresh_tracking_uri: str):
    """Ctrl-C reaches `mlflow run` and `main` (one process group); `mlflow run` then SIGTERMs `main`.
    The record ends KILLED with llmpack.status=killed, as the tutorial says."""
    from mlflow_projects.compiler import write_local_project
    from mlflow_projects.local import mlflow_command

    pipe, toy_dir = toy
    project = write_local_project(pipe, tmp_path / "project")
    proc = subprocess.Popen([*mlflow_command(), "run", str(project), "-e", "main", "--env-manager", "local",
                             "-P", "sleep_s=120"], cwd=tmp_path, env=_env(toy_dir, fresh_tracking_uri),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and not list(tmp_path.rglob("toy-echo.log")):
        time.sleep(0.3)
    time.sleep(3.0)  # the step is sleeping
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does
    _out, err = proc.communicate(timeout=240)
    mc, rec, runs = _the_record(fresh_tracking_uri)
    assert (rec.info.status, rec.data.tags["llmpack.status"]) == ("KILLED", "killed"), err[-3000:]
    # The record (in `llmpack`) is what ends KILLED; the linked run `mlflow run` made in `Default` still ends
    # FAILED here (MLflow's own marking wins over the driver's end_linked: open, see the report).
    assert rec.data.tags["llmpack.mlflow_run_id"] in {r.info.run_id for r in runs}
