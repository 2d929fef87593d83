"""The KFP backend: compiled IR (golden), KFP's own loader and CLI, platform config, kfp.local runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.commands import pipeline_values, step_args, task_params
from components.dsl import Dataset, Input, Metrics, Model, Output, pipeline, step
from components.errors import RunFailed
from components.finetune_pipeline import build
from components.gpu_nodes import node_affinity
from components.record.close import CLOSE_TASK
from components.steps.evaluate import evaluate
from components.steps.finetune import finetune
from components.steps.prepare_data import prepare_data
from components.steps.register import register
from components.steps.tokenize import tokenize
from kfp_pipelines import PACKAGE_PATH
from kfp_pipelines.compiler import build_component, build_kfp_pipeline, compile_pipeline, component_source

REPO = Path(__file__).resolve().parents[2]
@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_pipeline(build(), tmp_path_factory.mktemp("kfp") / "finetune.yaml")


@pytest.fixture(scope="module")
def ir(compiled: Path) -> tuple[dict, dict]:
    spec, platform = yaml.safe_load_all(compiled.read_text(encoding="utf-8"))
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


# --------------------------------------------------------------------------- the compiled artifact


def body_tasks(spec: dict) -> dict:
    """The pipeline's tasks: inside the exit handler whose exit task closes the run's record."""
    root = spec["root"]["dag"]["tasks"]
    assert set(root) == {"exit-handler-1", CLOSE_TASK}
    return spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]


def test_compile_is_deterministic(tmp_path: Path, compiled: Path) -> None:
    again = compile_pipeline(build(), tmp_path / "again.yaml")
    assert again.read_bytes() == compiled.read_bytes()


def test_kfp_loader_accepts_the_package() -> None:
    from kfp import components

    comp = components.load_component_from_file(str(PACKAGE_PATH))
    assert comp.name == "llm-finetune"
    assert set(comp.component_spec.inputs) == set(build().all_params)


def test_parameters_and_defaults(ir: tuple[dict, dict]) -> None:
    spec, _ = ir
    params = spec["root"]["inputDefinitions"]["parameters"]
    pipe = build()
    assert set(params) == set(pipe.all_params)
    kinds = {int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE", str: "STRING", bool: "BOOLEAN"}
    for name, p in pipe.all_params.items():
        assert params[name]["parameterType"] == kinds[p.type], name
    assert params["orchestrator"]["defaultValue"] == "kfp"
    assert params["mode"]["defaultValue"] == "auto"  # kfp.local runs it as compiled: the step decides
    assert params["max_steps"]["defaultValue"] == pipe.params["max_steps"].default


def test_tasks_are_the_pipeline_steps(ir: tuple[dict, dict]) -> None:
    spec, _ = ir
    pipe = build()
    tasks = body_tasks(spec)
    assert set(tasks) == set(pipe.tasks)
    for name, task in pipe.tasks.items():
        assert tasks[name]["taskInfo"]["name"] == name
        assert sorted(tasks[name].get("dependentTasks", [])) == sorted(task.upstream())
        assert tasks[name]["cachingOptions"] == {}, "caching must be off: every run is a measurement"
        image = spec["deploymentSpec"]["executors"][f"exec-{name}"]["container"]["image"]
        assert image == task.step.execution.image
    # inside the exit handler, KFP passes pipeline parameters through as channels
    assert (tasks["finetune"]["inputs"]["parameters"]["base_model"]
            == {"componentInputParameter": "pipelinechannel--model"})


def test_component_runs_the_pack_without_installing(ir: tuple[dict, dict]) -> None:
    spec, _ = ir
    for name, executor in spec["deploymentSpec"]["executors"].items():
        command = "\n".join(executor["container"]["command"])
        assert "pip install" not in command, name
        entry = "components.record" if name == f"exec-{CLOSE_TASK}" else "components.runtime"
        assert f"from {entry} import main" in command
        assert "_llmpack_main(_llmpack_argv)" in command


def test_gpu_and_resources(ir: tuple[dict, dict]) -> None:
    spec, _ = ir
    executors = spec["deploymentSpec"]["executors"]
    for name in ("finetune", "evaluate"):
        res = executors[f"exec-{name}"]["container"]["resources"]
        assert res["accelerator"]["resourceType"] == "nvidia.com/gpu"
        assert res["accelerator"]["resourceCount"] == "1"
        assert res["resourceCpuLimit"] == "8" and res["resourceMemoryLimit"] == "64Gi"
    cpu_only = executors["exec-prepare-data"]["container"]["resources"]
    assert "accelerator" not in cpu_only
    assert cpu_only["resourceCpuRequest"] == "1" and cpu_only["resourceMemoryRequest"] == "2Gi"


def test_retry_policy(ir: tuple[dict, dict]) -> None:
    spec, _ = ir
    tasks = body_tasks(spec)
    policy = tasks["finetune"]["retryPolicy"]
    retry = finetune.execution.retry
    assert policy["maxRetryCount"] == retry.limit == 2
    assert policy["backoffDuration"] == f"{retry.backoff_s}s"
    assert policy["backoffFactor"] == float(retry.factor)
    # The window must let a retry start after a full-length attempt (KFP: total window, not one wait).
    assert int(policy["backoffMaxDuration"].rstrip("s")) >= (retry.limit + 1) * finetune.execution.timeout_s
    assert "retryPolicy" not in tasks["prepare-data"]


def test_platform_spec(ir: tuple[dict, dict]) -> None:
    _, k8s = ir
    pipe = build()
    assert set(k8s) == {f"exec-{name}" for name in [*pipe.tasks, CLOSE_TASK]}
    ft = k8s["exec-finetune"]
    # the step's GPU type (H100 80GB) by a required node affinity, one term per label naming it
    assert "nodeSelector" not in ft
    assert [t["matchExpressions"] for t in ft["nodeAffinity"]] == [
        term["matchExpressions"] for term in
        node_affinity("nvidia-h100-80gb")["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]]
    assert ft["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert ft["podMetadata"]["labels"] == {
        "llmpack.io/step": "finetune",
        "llmpack.io/gpu-type": "nvidia-h100-80gb",
        "llmpack.io/gpu-count": "1",
        "llmpack.io/orchestrator": "kfp",
        "llmpack.io/pipeline": "llm-finetune",
        "app.kubernetes.io/name": "llm-finetune",
        "app.kubernetes.io/component": "finetune",
        "app.kubernetes.io/part-of": "llmpack",
        "app.kubernetes.io/managed-by": "kfp",
        "app.kubernetes.io/version": "0.1.0",
    }
    assert ft["activeDeadlineSeconds"] == str(6 * 3600)
    prep = k8s["exec-prepare-data"]
    assert "nodeSelector" not in prep and "tolerations" not in prep
    assert prep["podMetadata"]["labels"]["llmpack.io/gpu-count"] == "0"
    for name, cfg in k8s.items():
        assert cfg["securityContext"]["runAsNonRoot"] is True, name
        assert cfg["securityContext"]["runAsUser"] != "0"
        uri, credentials = cfg["secretAsEnv"]  # the URI required, the credentials optional (test_tracking_secret.py)
        assert uri["secretName"] == credentials["secretName"] == "llmpack-mlflow"
        assert uri["optional"] is False and credentials["optional"] is True
        assert uri["keyToEnv"] == [{"secretKey": "tracking-uri", "envVar": "MLFLOW_TRACKING_URI"}]


def test_no_literal_credentials_or_timestamps() -> None:
    text = PACKAGE_PATH.read_text(encoding="utf-8")
    assert "://" not in text.replace("ghcr.io/", "")  # no tracking URI, no endpoint
    assert "2026-" not in text and "2025-" not in text


def test_kfp_cli_compiles_the_module(tmp_path: Path) -> None:
    kfp_cli = Path(sys.executable).with_name("kfp")
    cmd = [str(kfp_cli)] if kfp_cli.exists() else [sys.executable, "-m", "kfp.cli.__main__"]
    out = tmp_path / "cli.yaml"
    proc = subprocess.run([*cmd, "dsl", "compile", "--py", str(REPO / "kfp_pipelines" / "pipeline.py"),
                           "--output", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out.read_bytes() == PACKAGE_PATH.read_bytes()


# --------------------------------------------------------------------------- the component body


def test_component_argv_is_the_shared_command_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each generated component calls components.runtime.main with exactly step_args' arguments."""
    from kfp import dsl as kdsl

    import components.runtime

    build_kfp_pipeline(build())  # building the pipeline runs no step
    pipe = build()
    values = pipeline_values(pipe, {"lr": 1e-05, "max_steps": 7, "run_group": "g-1", "submitted_at": 1700000000.25,
                                    "orchestrator": "kfp"})
    seen: list[list[str]] = []
    monkeypatch.setattr(components.runtime, "main", lambda argv: seen.append(list(argv)) or 0)
    kinds = {Dataset: kdsl.Dataset, Model: kdsl.Model, Metrics: kdsl.Metrics}
    for task in pipe.task_order():
        func = build_component(task).python_func
        inputs = {n: str(tmp_path / "in" / n) for n in task.step.inputs}
        outputs = {n: str(tmp_path / task.name / n) for n in task.step.outputs}
        kwargs = {n: kinds[t](uri=inputs[n]) for n, t in task.step.inputs.items()}
        kwargs |= {n: kinds[t](uri=outputs[n]) for n, t in task.step.outputs.items()}
        kwargs |= task_params(task, values)
        func(**kwargs)
        shared = step_args(task, inputs=inputs, outputs=outputs, params=task_params(task, values))[2:]
        assert seen[-1] == [*shared, "--param=orchestrator_run_id="]  # KFP fills the job id on a cluster
        assert all(Path(p).is_dir() for p in outputs.values())


def test_component_exit_code_is_the_steps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kfp import dsl as kdsl

    import components.runtime

    pipe = build()
    task = pipe.tasks["prepare-data"]
    monkeypatch.setattr(components.runtime, "main", lambda argv: 2)
    kwargs = {"dataset": kdsl.Dataset(uri=str(tmp_path / "d")), **task_params(task, pipeline_values(pipe, {}))}
    with pytest.raises(SystemExit) as exc:
        build_component(task).python_func(**kwargs)
    assert exc.value.code == 2


# --------------------------------------------------------------------------- adding a step


@step(name="summarize")
def summarize(metrics: Input[Metrics], summary: Output[Metrics], note: str = "", verbose: bool = False) -> None:
    """Toy step: copy the evaluation metrics with a note."""


@pipeline(name="llm-finetune-plus", description="The fine-tuning pipeline plus a toy step.")
def finetune_plus(model: str = "tiny", seed: int = 0, max_steps: int = 60) -> None:
    prepared = prepare_data(seed=seed)
    tokens = tokenize(dataset=prepared.outputs["dataset"], model=model)
    tuned = finetune(tokens=tokens.outputs["tokens"], base_model=model, max_steps=max_steps, seed=seed)
    scored = evaluate(tokens=tokens.outputs["tokens"], model=tuned.outputs["model"])
    reg = register(model=tuned.outputs["model"], metrics=scored.outputs["metrics"])
    summarize(metrics=scored.outputs["metrics"], note="hello", verbose=True).after(reg)


def test_added_step_appears_in_compiled_output(tmp_path: Path) -> None:
    pipe = finetune_plus()
    path = compile_pipeline(pipe, tmp_path / "plus.yaml")
    spec, platform = yaml.safe_load_all(path.read_text(encoding="utf-8"))
    tasks = body_tasks(spec)
    assert set(tasks) == {"prepare-data", "tokenize", "finetune", "evaluate", "register", "summarize"}
    summ = tasks["summarize"]
    assert sorted(summ["dependentTasks"]) == ["evaluate", "register"]
    assert summ["inputs"]["parameters"]["note"] == {"runtimeValue": {"constant": "hello"}}
    assert summ["inputs"]["parameters"]["verbose"] == {"runtimeValue": {"constant": True}}
    comp = spec["components"]["comp-summarize"]["inputDefinitions"]["parameters"]
    assert comp["verbose"]["parameterType"] == "BOOLEAN"
    source = spec["deploymentSpec"]["executors"]["exec-summarize"]["container"]["command"][-1]
    assert component_source(pipe.tasks["summarize"]) in source
    assert f"_llmpack_argv = [{summarize.ref!r}]" in source
    labels = (platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-summarize"]
              ["podMetadata"]["labels"])
    assert labels["llmpack.io/step"] == "summarize"
    from kfp import components

    assert components.load_component_from_file(str(path)).name == "llm-finetune-plus"


# --------------------------------------------------------------------------- kfp.local runs


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_local_run_matches_direct(tmp_path: Path) -> None:
    from kfp_pipelines.local import run_local
    from llmpack.run.direct import run_local as run_direct

    pipe = build()
    env = _env(tmp_path)
    overrides = {"max_steps": 5, "run_group": "t", "submitted_at": 1.0}
    kfp_out = run_local(pipe, pipeline_values(pipe, {**overrides, "orchestrator": "kfp", "pipeline_run": "k"}),
                        tmp_path / "kfp", env)
    direct_out = run_direct(pipe, pipeline_values(pipe, {**overrides, "pipeline_run": "d"}), tmp_path / "direct", env)

    assert set(kfp_out) == set(direct_out) == {f"{t}.{o}" for t, task in pipe.tasks.items() for o in task.step.outputs}
    adapter = "adapter/adapter_model.safetensors"
    assert (kfp_out["finetune.model"] / adapter).is_file()
    assert _sha(kfp_out["finetune.model"] / adapter) == _sha(direct_out["finetune.model"] / adapter)
    assert (kfp_out["evaluate.metrics"] / "metrics.json").read_text() == (
        direct_out["evaluate.metrics"] / "metrics.json").read_text()
    logs = tmp_path / "kfp" / "logs"
    assert (logs / "kfp.log").is_file() and (logs / "finetune.log").is_file()
    assert "\x1b[" not in (logs / "kfp.log").read_text()
    # What ran is what was compiled: the shipped pipeline's package is the committed golden.
    assert (tmp_path / "kfp" / "pipeline.yaml").read_bytes() == PACKAGE_PATH.read_bytes()
    events = [json.loads(line)
              for line in (kfp_out["finetune.model"] / "llmpack-events.jsonl").read_text().splitlines()]
    assert {(e["orchestrator"], e["mode"], e["pipeline_run"]) for e in events} == {("kfp", "local", "k")}


@pytest.mark.slow
def test_local_run_failure_names_the_step(tmp_path: Path) -> None:
    from kfp_pipelines.local import run_local

    pipe = build()
    missing = tmp_path / "missing.jsonl"
    values = pipeline_values(pipe, {"data": str(missing), "orchestrator": "kfp"})
    with pytest.raises(RunFailed) as exc:
        run_local(pipe, values, tmp_path / "run", _env(tmp_path))
    assert exc.value.step == "prepare-data"
    assert str(missing) in str(exc.value)
    assert "llmpack: error:" in (tmp_path / "run" / "logs" / "prepare-data.log").read_text()


def test_package_ships_with_the_distribution() -> None:
    assert PACKAGE_PATH.is_file() and PACKAGE_PATH.parent.name == "kfp_pipelines"


@step(name="boom")
def boom(out: Output[Dataset], message: str = "kaput") -> None:
    """Toy step that crashes."""
    raise RuntimeError(f"boom: {message}")


@pipeline(name="boom-pipeline")
def boom_pipeline(message: str = "kaput") -> None:
    boom(message=message)


@pytest.mark.slow
def test_local_crash_reports_the_steps_last_line_like_direct(tmp_path: Path) -> None:
    from kfp_pipelines.local import run_local
    from llmpack.run.direct import run_local as run_direct

    pipe = boom_pipeline()
    # The step's module (this file) must be importable by the step processes.
    path = os.pathsep.join([str(Path(__file__).parent), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**_env(tmp_path), "PYTHONPATH": path}
    values = pipeline_values(pipe, {"message": "oh no"})
    with pytest.raises(RunFailed) as kfp_exc:
        run_local(pipe, values, tmp_path / "kfp", env)
    with pytest.raises(RunFailed) as direct_exc:
        run_direct(pipe, values, tmp_path / "direct", env)
    assert kfp_exc.value.step == direct_exc.value.step == "boom"
    assert str(kfp_exc.value) == str(direct_exc.value) == "step 'boom' failed: RuntimeError: boom: oh no"
