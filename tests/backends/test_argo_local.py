"""The Argo local executor: it runs the compiled YAML's DAG, honours retryStrategy, and refuses
what it does not support with one clear line, before anything runs.

Fast: a toy pipeline of stdlib-only steps, importable by the step subprocesses through PYTHONPATH.
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from argo_workflows.local import load_workflow, run_local, run_workflow_yaml
from argo_workflows.workflow import build_workflow
from components.commands import pipeline_values
from components.dsl import Pipeline, pipeline
from components.errors import InputError, RunFailed

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "argo_workflows" / "finetune.yaml"

TOY_STEPS = '''
from pathlib import Path

from components.dsl import Dataset, Execution, Input, Output, Resources, Retry, step
from components.errors import InputError


@step(name="toy-make", execution=Execution(resources=Resources(cpu=0.5, memory="128Mi")))
def toy_make(out: Output[Dataset], text: str = "hello") -> None:
    """Write the text."""
    (Path(out.path) / "data.txt").write_text(text)


@step(name="toy-shout", execution=Execution(retry=Retry(limit=2, backoff_s=5, factor=2, max_backoff_s=5)))
def toy_shout(data: Input[Dataset], out: Output[Dataset], fail_times: int = 0, bad_input: bool = False) -> None:
    """Upper-case the text; fails ``fail_times`` times first, or with bad input."""
    if bad_input:
        raise InputError("toy: the input is bad")
    counter = Path(out.path) / "attempts"
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    if n < fail_times:
        raise RuntimeError(f"toy: planned failure {n + 1}")
    (Path(out.path) / "data.txt").write_text((Path(data.path) / "data.txt").read_text().upper())
'''


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("toy")
    (root / "llmpack_argo_toy_steps.py").write_text(textwrap.dedent(TOY_STEPS), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def toy_pipe(toy_dir: Path) -> Pipeline:
    sys.path.insert(0, str(toy_dir))
    try:
        mod = importlib.import_module("llmpack_argo_toy_steps")
    finally:
        sys.path.remove(str(toy_dir))

    @pipeline(name="toy")
    def toy(text: str = "hello", fail_times: int = 0, bad_input: bool = False):
        made = mod.toy_make(text=text)
        mod.toy_shout(data=made.outputs["out"], fail_times=fail_times, bad_input=bad_input)

    return toy()


@pytest.fixture()
def toy_env(toy_dir: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(toy_dir), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "LLMPACK_MLFLOW_LOGGING": "0"}


def _attempts(log: Path) -> int:
    return sum(1 for line in log.read_text().splitlines() if line.startswith("$ "))


# --------------------------------------------------------------------------- running


def test_runs_the_dag_from_the_yaml_it_wrote(toy_pipe: Pipeline, toy_env: dict[str, str], tmp_path: Path):
    out = run_local(toy_pipe, pipeline_values(toy_pipe, {"text": "abc", "orchestrator": "argo"}), tmp_path, toy_env)
    assert set(out) == {"toy-make.out", "toy-shout.out"}
    assert out["toy-make.out"] == tmp_path / "toy-make" / "out"
    assert (out["toy-shout.out"] / "data.txt").read_text() == "ABC"
    assert (tmp_path / "workflow.yaml").read_text() == build_workflow(toy_pipe).to_yaml()
    log = (tmp_path / "logs" / "toy-shout.log").read_text()
    assert log.startswith(f"$ {sys.executable} -m components.run llmpack_argo_toy_steps:toy_shout ")
    assert f"--input=data={tmp_path / 'toy-make' / 'out'}" in log
    assert "--param=orchestrator=argo" in log


def test_executes_the_yaml_text_not_the_python_objects(toy_pipe: Pipeline, toy_env: dict[str, str], tmp_path: Path):
    text = build_workflow(toy_pipe).to_yaml()
    edited = text.replace("value: hello", "value: edited yaml")
    assert edited != text
    out = run_workflow_yaml(edited, {}, tmp_path, toy_env)  # no arguments: the YAML's defaults
    assert (out["toy-shout.out"] / "data.txt").read_text() == "EDITED YAML"


def test_retry_strategy_retries_failures(toy_pipe: Pipeline, toy_env: dict[str, str], tmp_path: Path):
    out = run_local(toy_pipe, pipeline_values(toy_pipe, {"fail_times": 2}), tmp_path, toy_env)
    assert (out["toy-shout.out"] / "attempts").read_text() == "3"
    assert _attempts(tmp_path / "logs" / "toy-shout.log") == 3


def test_retries_run_out_and_the_task_fails_with_its_error_line(toy_pipe: Pipeline, toy_env: dict[str, str],
                                                                tmp_path: Path):
    with pytest.raises(RunFailed) as err:
        run_local(toy_pipe, pipeline_values(toy_pipe, {"fail_times": 9}), tmp_path, toy_env)
    assert err.value.step == "toy-shout"
    assert "RuntimeError: toy: planned failure 3" in str(err.value)
    assert _attempts(tmp_path / "logs" / "toy-shout.log") == 3  # limit 2: three attempts


def test_bad_input_is_not_retried(toy_pipe: Pipeline, toy_env: dict[str, str], tmp_path: Path):
    with pytest.raises(RunFailed, match="toy: the input is bad"):
        run_local(toy_pipe, pipeline_values(toy_pipe, {"bad_input": True}), tmp_path, toy_env)
    assert _attempts(tmp_path / "logs" / "toy-shout.log") == 1  # expression: asInt(lastRetry.exitCode) != 2


def test_unknown_workflow_argument_is_refused(toy_pipe: Pipeline, tmp_path: Path):
    with pytest.raises(InputError, match="unknown workflow parameter 'nope'"):
        run_workflow_yaml(build_workflow(toy_pipe).to_yaml(), {"nope": "1"}, tmp_path, {})


def test_retry_strategy_of_the_committed_yaml():
    wf = load_workflow(GOLDEN)
    retry = wf.templates["finetune"].retry
    assert retry.limit == 2
    assert retry.should_retry(0, 1) and retry.should_retry(1, 137) and not retry.should_retry(2, 1)
    assert not retry.should_retry(0, 2)
    assert retry.delay(0) <= 1.0
    assert [t.name for t in wf.order] == ["prepare-data", "tokenize", "finetune", "evaluate", "register"]
    assert wf.templates["prepare-data"].retry.limit == 0


# --------------------------------------------------------------------------- refusals


def _golden() -> dict:
    return yaml.safe_load(GOLDEN.read_text(encoding="utf-8"))


def _tmpl(doc: dict, name: str) -> dict:
    return next(t for t in doc["spec"]["templates"] if t["name"] == name)


def _task(doc: dict, name: str) -> dict:
    return next(t for t in _tmpl(doc, "llm-finetune")["dag"]["tasks"] if t["name"] == name)


def _steps_template(doc):
    doc["spec"]["templates"].append({"name": "loop", "steps": [[{"name": "a", "template": "prepare-data"}]]})


def _script_template(doc):
    t = _tmpl(doc, "register")
    t["script"] = {"image": "python:3.11", "command": ["python"], "source": "print(1)"}
    del t["container"]


def _resource_template(doc):
    doc["spec"]["templates"].append({"name": "make-cm", "resource": {"action": "create", "manifest": "{}"}})


def _suspend_template(doc):
    doc["spec"]["templates"].append({"name": "wait", "suspend": {}})


def _with_items(doc):
    _task(doc, "prepare-data")["withItems"] = ["a", "b"]


def _with_param(doc):
    _task(doc, "prepare-data")["withParam"] = "[1, 2]"


def _when(doc):
    _task(doc, "register")["when"] = "{{tasks.evaluate.status}} == Succeeded"


def _depends(doc):
    _task(doc, "register")["depends"] = "evaluate.Succeeded"


def _exit_handler(doc):
    doc["spec"]["onExit"] = "register"


def _placeholder(doc):
    _tmpl(doc, "register")["container"]["args"].append("--param=model_name={{workflow.namespace}}")


def _output_parameter_reference(doc):
    params = _task(doc, "register")["arguments"]["parameters"]
    params[0]["value"] = "{{tasks.evaluate.outputs.parameters.name}}"


def _expression_placeholder(doc):
    _tmpl(doc, "tokenize")["container"]["args"][-1] = "--param=mode={{=sprig.upper('x')}}"


def _retry_expression(doc):
    _tmpl(doc, "finetune")["retryStrategy"]["expression"] = "lastRetry.status == 'Error'"


def _shell_command(doc):
    _tmpl(doc, "tokenize")["container"]["command"] = ["bash", "-c"]


def _volumes(doc):
    _tmpl(doc, "finetune")["container"]["volumeMounts"] = [{"name": "cache", "mountPath": "/cache"}]


def _template_ref(doc):
    task = _task(doc, "register")
    del task["template"]
    task["templateRef"] = {"name": "shared", "template": "register"}


def _workflow_template(doc):
    doc["kind"] = "WorkflowTemplate"


REFUSALS = [
    (_steps_template, "unsupported feature steps templates at templates[7].steps"),
    (_script_template, "unsupported feature script templates at templates[5].script"),
    (_resource_template, "unsupported feature resource templates at templates[7].resource"),
    (_suspend_template, "unsupported feature suspend templates at templates[7].suspend"),
    (_with_items, "unsupported feature withItems loops at templates[0].dag.tasks[0].withItems"),
    (_with_param, "unsupported feature withParam loops at templates[0].dag.tasks[0].withParam"),
    (_when, "unsupported feature when-conditions at templates[0].dag.tasks[4].when"),
    (_depends, "unsupported feature depends expressions at templates[0].dag.tasks[4].depends"),
    (_exit_handler, "unsupported feature an exit handler template with inputs ('register') at spec.onExit"),
    (_placeholder, "unsupported feature placeholder {{workflow.namespace}} at templates[5].container.args["),
    (_output_parameter_reference, "unsupported feature placeholder {{tasks.evaluate.outputs.parameters.name}}"),
    (_expression_placeholder, "unsupported feature expression placeholder"),
    (_retry_expression, "unsupported feature retry expression"),
    (_shell_command, "unsupported feature container command 'bash'"),
    (_volumes, "unsupported feature volume mounts at templates[3].container.volumeMounts"),
    (_template_ref, "unsupported feature templateRef at templates[0].dag.tasks[4].templateRef"),
    (_workflow_template, "unsupported feature kind 'WorkflowTemplate'"),
]


@pytest.mark.parametrize(("mutate", "message"), REFUSALS, ids=[m.__name__.strip("_") for m, _ in REFUSALS])
def test_unsupported_features_are_refused_before_anything_runs(mutate, message: str, tmp_path: Path):
    doc = copy.deepcopy(_golden())
    mutate(doc)
    with pytest.raises(InputError) as err:
        run_workflow_yaml(yaml.safe_dump(doc, sort_keys=False), {}, tmp_path, dict(os.environ))
    text = str(err.value)
    assert text.startswith("argo local executor: ")
    assert message in text
    assert "\n" not in text
    assert not (tmp_path / "logs").exists()  # refused up front, nothing ran


def test_invalid_workflow_by_argo_schema_is_refused(tmp_path: Path):
    doc = _golden()
    _tmpl(doc, "finetune")["activeDeadlineSeconds"] = {"not": "a number"}
    with pytest.raises(InputError, match="not a valid Argo Workflow at spec.templates"):
        run_workflow_yaml(yaml.safe_dump(doc), {}, tmp_path, {})


def test_unparseable_yaml_and_missing_file_are_refused(tmp_path: Path):
    with pytest.raises(InputError, match="cannot parse the Workflow YAML"):
        run_workflow_yaml("spec: [\n  - {", {}, tmp_path, {})
    with pytest.raises(InputError, match="does not exist"):
        run_workflow_yaml(tmp_path / "missing.yaml", {}, tmp_path, {})
    with pytest.raises(InputError, match="does not exist"):
        run_workflow_yaml(str(tmp_path / "missing.yaml"), {}, tmp_path, {})


def test_the_command_line_names_the_failed_steps_log(toy_pipe: Pipeline, toy_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """Trial 7: `python -m argo_workflows.local` on a failed step said one line with no log to read."""
    from argo_workflows.local import main

    wf = tmp_path / "toy.yaml"
    wf.write_text(build_workflow(toy_pipe).to_yaml())
    monkeypatch.chdir(toy_dir)  # the steps import what `python -m` imports here: the current directory first
    monkeypatch.setenv("LLMPACK_MLFLOW_LOGGING", "0")
    assert main([str(wf), "-p", "bad_input=true", "--workdir", str(tmp_path / "w")]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    log = tmp_path / "w" / "logs" / "toy-shout.log"
    assert line.startswith("llmpack: error: step 'toy-shout' failed: ") and line.endswith(f"(its log: {log})"), line
    assert log.is_file()
