"""The Argo path: the compiled Workflow (golden file, Argo's schema, the hera CLI) and a local run.

The golden file itself is checked against a fresh compile in tests/backends/test_golden.py (``make golden``
regenerates it).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from argo_workflows.workflow import build_workflow, cap_binds
from components.commands import pipeline_values
from components.dsl import Execution, Input, Metrics, Output, Resources, Retry, pipeline, step
from components.finetune_pipeline import build
from components.gpu_nodes import node_affinity
from components.steps.evaluate import evaluate
from components.steps.finetune import finetune
from components.steps.prepare_data import prepare_data
from components.steps.register import register
from components.steps.tokenize import tokenize

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "argo_workflows" / "finetune.yaml"


def _doc() -> dict:
    return yaml.safe_load(GOLDEN.read_text(encoding="utf-8"))


def _templates(doc: dict) -> dict[str, dict]:
    return {t["name"]: t for t in doc["spec"]["templates"]}


# --------------------------------------------------------------------------- golden file


def test_compile_is_deterministic():
    assert build_workflow(build()).to_yaml() == build_workflow(build()).to_yaml()


def test_golden_yaml_validates_against_argo_models():
    from hera.workflows import Workflow
    from hera.workflows.models import Workflow as ModelWorkflow

    text = GOLDEN.read_text(encoding="utf-8")
    model = ModelWorkflow.model_validate(yaml.safe_load(text))
    assert model.kind == "Workflow" and model.spec.entrypoint == "llm-finetune"
    # Hera reads it back into the same Workflow.
    assert Workflow.from_yaml(text).to_yaml() == text


def test_workflow_arguments_are_all_pipeline_params_with_argo_defaults():
    pipe = build()
    args = {p["name"]: p["value"] for p in _doc()["spec"]["arguments"]["parameters"]}
    assert list(args) == list(pipe.all_params)
    assert args["orchestrator"] == "argo" and args["mode"] == "cluster"
    assert args["max_steps"] == "120" and args["lr"] == "0.003"
    assert _doc()["metadata"]["generateName"] == "llm-finetune-"


def test_dag_follows_the_pipeline_object():
    pipe = build()
    doc = _doc()
    dag = _templates(doc)["llm-finetune"]["dag"]["tasks"]
    assert [t["name"] for t in dag] == [t.name for t in pipe.task_order()]
    for t in dag:
        assert t.get("dependencies", []) == pipe.tasks[t["name"]].upstream()
    evaluate_task = next(t for t in dag if t["name"] == "evaluate")
    assert ({"name": "model", "from": "{{tasks.finetune.outputs.artifacts.model}}"}
            in evaluate_task["arguments"]["artifacts"])


def test_container_command_is_the_shared_step_command():
    tmpl = _templates(_doc())["finetune"]
    c = tmpl["container"]
    assert c["command"] == ["python"]
    assert c["args"][:3] == ["-m", "components.run", "components.steps.finetune:finetune"]
    assert "--input=tokens={{inputs.artifacts.tokens.path}}" in c["args"]
    assert "--output=model={{outputs.artifacts.model.path}}" in c["args"]
    assert "--param=max_steps={{inputs.parameters.max_steps}}" in c["args"]
    assert "--param=submitted_at={{inputs.parameters.submitted_at}}" in c["args"]
    assert tmpl["inputs"]["artifacts"] == [{"name": "tokens", "path": "/tmp/llmpack/in/tokens"}]
    assert tmpl["outputs"]["artifacts"] == [{"name": "model", "path": "/tmp/llmpack/out/model"}]


def test_gpu_placement_retries_and_deadline():
    templates = _templates(_doc())
    ft = templates["finetune"]
    res = ft["container"]["resources"]
    assert res["requests"]["nvidia.com/gpu"] == "1" and res["limits"]["nvidia.com/gpu"] == "1"
    assert res["requests"]["cpu"] == "8" and res["requests"]["memory"] == "64Gi"
    assert ft["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "nodeSelector" not in ft  # the GPU type's nodes, by a required node affinity
    assert ft["affinity"] == {"nodeAffinity": node_affinity("nvidia-h100-80gb")}
    # int-or-string fields as strings: the CRD takes both, Argo's published JSON schema only strings
    assert ft["activeDeadlineSeconds"] == str(6 * 3600)
    rs = ft["retryStrategy"]
    assert rs["limit"] == "2" and rs["retryPolicy"] == "Always"
    assert rs["backoff"] == {"duration": "30s", "factor": "2"}  # 30s, 60s: the 300s cap never binds
    assert "maxDuration" not in rs["backoff"]  # a deadline from the first attempt: would block late retries
    assert rs["expression"] == "asInt(lastRetry.exitCode) != 2"
    # CPU steps ask for no GPU and carry no retry strategy (their Retry.limit is 0).
    prep = templates["prepare-data"]
    # CPU and memory limited as requested (Guaranteed-style: no step can take a node's memory)
    assert (prep["container"]["resources"]["limits"]
            == {k: v for k, v in prep["container"]["resources"]["requests"].items()})
    assert "nvidia.com/gpu" not in prep["container"]["resources"]["requests"]
    assert "retryStrategy" not in prep and "tolerations" not in prep


def test_a_template_with_retries_tells_its_step_the_attempt_as_the_local_runners_do(tmp_path: Path):
    """Issue 52 (leftover 5): compiled Workflows set no LLMPACK_ATTEMPT, so a retried step on a cluster learnt
    its attempt only from its own records. A template with a retryStrategy sets it from Argo's ``{{retries}}``
    (0 on the first attempt, as direct, the Argo local runner and the MLflow driver count); the others none."""
    from argo_workflows.local import load_workflow, plan
    from components.record.telemetry import RunContext, attempt_number

    for name, t in _templates(_doc()).items():
        env = {e["name"]: e.get("value") for e in t.get("container", {}).get("env", [])}
        assert env.get("LLMPACK_ATTEMPT") == ("{{retries}}" if "retryStrategy" in t else None), name
    steps, _ = plan(load_workflow(GOLDEN), {}, tmp_path)
    (ft,) = [s for s in steps if s.name == "finetune"]
    assert [ft.env({}, k)["LLMPACK_ATTEMPT"] for k in (0, 1, 2)] == ["0", "1", "2"]  # Argo resolves it alike
    ctx = RunContext(run_group="g", pipeline_run="r", orchestrator="argo", mode="cluster", submitted_at=0.0)
    assert attempt_number(ctx, "finetune", tmp_path / "none.jsonl", env=ft.env({}, 1)) == 1


def test_pod_labels_security_and_secret_reference():
    doc = _doc()
    for name, tmpl in _templates(doc).items():
        if "container" not in tmpl:
            continue
        labels = tmpl["metadata"]["labels"]
        assert labels["llmpack.io/step"] == name
        assert labels["llmpack.io/orchestrator"] == "argo"
        assert labels["llmpack.io/run-group"] == "{{workflow.parameters.run_group}}"
        assert labels["llmpack.io/pipeline-run"] == "{{workflow.parameters.pipeline_run}}"
        assert {"llmpack.io/gpu-type", "llmpack.io/gpu-count"} <= set(labels)
        sc = tmpl["container"]["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 1000
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        env = {e["name"]: e for e in tmpl["container"]["env"]}
        assert env["MLFLOW_TRACKING_URI"] == {  # required: no Secret, no pod (tests/backends/test_tracking_secret.py)
            "name": "MLFLOW_TRACKING_URI",
            "valueFrom": {"secretKeyRef": {"name": "llmpack-mlflow", "key": "tracking-uri"}},
        }
    assert _templates(doc)["finetune"]["metadata"]["labels"]["llmpack.io/gpu-type"] == "nvidia-h100-80gb"
    pod = doc["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 1000
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}


def test_finetune_template_has_prometheus_metrics():
    metrics = _templates(_doc())["finetune"]["metrics"]["prometheus"]
    by_name = {m["name"]: m for m in metrics}
    gauge = by_name["llmpack_finetune_node_seconds"]["gauge"]
    assert gauge == {"realtime": True, "value": "{{duration}}"}
    hist = by_name["llmpack_finetune_node_duration_seconds"]["histogram"]
    assert hist["value"] == "{{duration}}" and hist["buckets"] == sorted(hist["buckets"])
    others = [t for t in _doc()["spec"]["templates"] if t["name"] not in ("finetune", "close-record")]
    assert not any("metrics" in t for t in others)
    # The live gauge is one series per run (concurrent runs no longer overwrite it); the
    # histogram, a distribution over runs, has no run label.
    run = {"pipeline_run": "{{workflow.parameters.pipeline_run}}", "workflow": "{{workflow.name}}"}
    gauge_labels = {lab["key"]: lab["value"] for lab in by_name["llmpack_finetune_node_seconds"]["labels"]}
    assert run.items() <= gauge_labels.items()
    hist_labels = {lab["key"] for lab in by_name["llmpack_finetune_node_duration_seconds"]["labels"]}
    assert not hist_labels & set(run)


def test_exit_handler_emits_spinup_and_time_to_first_step_per_run():
    close = _templates(_doc())["close-record"]
    by_name = {m["name"]: m for m in close["metrics"]["prometheus"]}
    assert set(by_name) == {"llmpack_spinup_seconds", "llmpack_time_to_first_step_seconds"}
    params = {p["name"]: p["valueFrom"] for p in close["outputs"]["parameters"]}
    args = close["container"]["args"]
    for name, key in (("spinup_seconds", "spinup_s"), ("time_to_first_step_seconds", "time_to_first_step_s")):
        metric = by_name[f"llmpack_{name}"]
        assert metric["gauge"]["value"] == f"{{{{outputs.parameters.{name}}}}}"
        assert name in metric["when"]  # nothing emitted when the run never got there (the file's default "")
        labels = {lab["key"]: lab["value"] for lab in metric["labels"]}
        assert (labels["pipeline_run"] == "{{workflow.parameters.pipeline_run}}"
                and labels["workflow"] == "{{workflow.name}}")
        assert params[name]["default"] == "" and params[name]["path"].endswith(name)
        assert f"--metric-file={key}={{{{outputs.parameters.{name}.path}}}}" in args


@pytest.mark.parametrize(
    ("retry", "cap"),
    [
        (Retry(limit=2, backoff_s=30, factor=2, max_backoff_s=300), None),
        (Retry(limit=5, backoff_s=30, factor=2, max_backoff_s=300), "300s"),  # 30 .. 480: capped
        (Retry(limit=3, backoff_s=10, factor=1, max_backoff_s=5), "5s"),
    ],
)
def test_backoff_cap_is_written_only_where_it_binds(retry: Retry, cap: str | None):
    assert cap_binds(retry) is (cap is not None)

    @step(name="toy-retry", execution=Execution(retry=retry))
    def toy_retry(out: Output[Metrics]) -> None:
        """Toy step with retries."""

    @pipeline(name="toy-retry-pipeline")
    def toy():
        toy_retry()

    doc = yaml.safe_load(build_workflow(toy()).to_yaml())
    backoff = _templates(doc)["toy-retry"]["retryStrategy"]["backoff"]
    assert backoff.get("cap") == cap
    assert backoff["duration"] == f"{retry.backoff_s}s" and backoff["factor"] == str(retry.factor)  # int-or-string


# --------------------------------------------------------------------------- the hera CLI


def test_hera_generate_yaml_cli_reproduces_the_golden_file(tmp_path: Path):
    if importlib.util.find_spec("cappa") is None:
        pytest.skip("the hera CLI needs the 'cli' extra: pip install 'hera[cli]'")
    out = tmp_path / "finetune.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "hera", "generate", "yaml", "argo_workflows/workflow.py", "--to", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text(encoding="utf-8") == GOLDEN.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- adding a step


@step(name="toy-report", execution=Execution(resources=Resources(cpu=0.5, memory="256Mi")))
def toy_report(metrics: Input[Metrics], report: Output[Metrics], title: str = "report") -> None:
    """Toy extra step: write a one-line report of the evaluation."""
    (Path(report.path) / "report.txt").write_text(title + "\n", encoding="utf-8")


@pipeline(name="llm-finetune-plus", description="The fine-tuning pipeline with one more step.")
def finetune_plus(model: str = "tiny", seed: int = 0, max_steps: int = 60, title: str = "weekly"):
    prepared = prepare_data(data="builtin", seed=seed)
    tokens = tokenize(dataset=prepared.outputs["dataset"], model=model, seq_len=128)
    tuned = finetune(tokens=tokens.outputs["tokens"], base_model=model, max_steps=max_steps, seed=seed)
    scored = evaluate(tokens=tokens.outputs["tokens"], model=tuned.outputs["model"])
    register(model=tuned.outputs["model"], metrics=scored.outputs["metrics"])
    toy_report(metrics=scored.outputs["metrics"], title=title)


def test_an_added_step_appears_in_the_compiled_workflow():
    doc = yaml.safe_load(build_workflow(finetune_plus()).to_yaml())
    assert doc["metadata"]["generateName"] == "llm-finetune-plus-"
    templates = _templates(doc)
    tmpl = templates["toy-report"]
    assert tmpl["container"]["args"][2] == f"{toy_report.ref}"
    assert "--param=title={{inputs.parameters.title}}" in tmpl["container"]["args"]
    assert tmpl["container"]["resources"]["requests"] == {"cpu": "500m", "memory": "256Mi"}
    (task,) = [t for t in templates["llm-finetune-plus"]["dag"]["tasks"] if t["name"] == "toy-report"]
    assert task["dependencies"] == ["evaluate"]
    assert task["arguments"]["artifacts"] == [
        {"name": "metrics", "from": "{{tasks.evaluate.outputs.artifacts.metrics}}"}]
    # Literal arguments are passed as values, pipeline parameters by reference.
    prep = next(t for t in templates["llm-finetune-plus"]["dag"]["tasks"] if t["name"] == "prepare-data")
    params = {p["name"]: p["value"] for p in prep["arguments"]["parameters"]}
    assert params["data"] == "builtin" and params["seed"] == "{{workflow.parameters.seed}}"


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_local_run_matches_direct_byte_for_byte(tmp_path: Path):
    from argo_workflows.local import run_local
    from llmpack.run import direct

    pipe = build()
    env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1"}
    common = {"max_steps": 5, "mode": "local", "run_group": "rg-argo-test", "submitted_at": time.time()}
    started = time.perf_counter()
    argo = run_local(pipe, pipeline_values(pipe, {**common, "orchestrator": "argo", "pipeline_run": "a"}),
                     tmp_path / "argo", env)
    argo_s = time.perf_counter() - started
    ref = direct.run_local(pipe, pipeline_values(pipe, {**common, "orchestrator": "direct", "pipeline_run": "d"}),
                           tmp_path / "direct", env)
    assert set(argo) == set(ref)
    adapter = Path("adapter") / "adapter_model.safetensors"
    assert (argo["finetune.model"] / adapter).read_bytes() == (ref["finetune.model"] / adapter).read_bytes()
    metrics = "metrics.json"
    assert (argo["evaluate.metrics"] / metrics).read_text() == (ref["evaluate.metrics"] / metrics).read_text()
    # It ran the compiled YAML it wrote, each task logged on its own.
    assert (tmp_path / "argo" / "workflow.yaml").read_text() == GOLDEN.read_text()
    for name in pipe.tasks:
        log = (tmp_path / "argo" / "logs" / f"{name}.log").read_text()
        assert log.startswith(f"$ {sys.executable} -m components.run ")
        assert "--param=orchestrator=argo" in log
    print(f"argo local run: {argo_s:.1f}s")
