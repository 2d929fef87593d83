"""The twenty-ninth independent round's findings (helper sec29, issue 46); each test failed on 7c88c37, when
`cluster submit --plan` read a compiled file's pods by an allowlist: F1 more pods of one template (more tasks,
`onExit`, a dag calling itself), F2 values in task arguments, F3 a gang spec moved or enlarged with its pin
recomputed, F4 a bill of no GPU type, F5 retries and deadlines raised, F6 evaluate at finetune's count, F7 and F8
false refusals (a 2-GPU step of one's own; a fused file against the unfused row), F9 a token in a percent-encoded
URL in a query value. F1 to F6 are refused now by the compile's signature, before the file is read
(docs/internals/hostile-input.md, "the class of rounds 26–29")."""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tests.components.plan_submit import (
    ROW,
    compiled_artifacts,  # noqa: F401 - the `compiled` fixture
    refused,
)
from tests.components.plan_submit import finetune as _finetune
from tests.components.plan_submit import plan_file as _plan
from tests.components.plan_submit import submit as _submit

HOST = ["--host", "http://127.0.0.1:9"]
B200 = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-B200"]}]}]}}


def _refused(res: Any, what: str) -> None:
    assert res.exception is None or isinstance(res.exception, SystemExit), f"{what}: {res.exception!r}"
    refused(res, what)


def _compile(out: Path, *args: str) -> Path:
    from llmpack.cli import main

    res = CliRunner().invoke(main, ["compile", "--out", str(out), *args])
    assert res.exit_code == 0, res.output
    return out


def _plan_of(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"options": rows}))
    return plan


def _template(wf: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in wf["spec"]["templates"] if t.get("name") == name)


def _dag(wf: dict[str, Any]) -> list[dict[str, Any]]:
    return _template(wf, wf["spec"]["entrypoint"])["dag"]["tasks"]


def _task(wf: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in _dag(wf) if t["name"] == name)


def _argo_submit(compiled: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None], plan: Path) -> Any:
    wf = copy.deepcopy(yaml.safe_load((compiled / "argo_workflows/finetune.yaml").read_text()))
    edit(wf)
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(yaml.safe_dump(wf, sort_keys=False))
    return _submit(["argo", *HOST, "--workflow", str(workflow)], plan)


def _kfp_submit(compiled: Path, tmp_path: Path, edit: Callable[[list[dict[str, Any]]], None], plan: Path) -> Any:
    docs = list(yaml.safe_load_all((compiled / "kfp_pipelines/finetune.yaml").read_text()))
    edit(docs)
    package = tmp_path / "p.yaml"
    package.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return _submit(["kfp", *HOST, "--package", str(package)], plan)


def _mlflow_submit(project: Path, tmp_path: Path, plan: Path) -> Any:
    (tmp_path / "kc.yaml").write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: abcdefgh12345678}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u, namespace: default}}]\ncurrent-context: x\n")
    return _submit(["mlflow", "--kubeconfig", str(tmp_path / "kc.yaml"), "--tracking-uri",
                    f"sqlite:///{tmp_path}/m.db", "--project", str(project)], plan)


def _exit_tasks(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return docs[0]["components"]["comp-exit-handler-1"]["dag"]["tasks"]


# F1: more pods of the compiled templates ------------------------------------------------------------------------

def _eight_finetune_tasks(wf: dict[str, Any]) -> None:
    for i in range(7):
        _dag(wf).append({**copy.deepcopy(_task(wf, "finetune")), "name": f"finetune-{i}"})


def _on_exit_runs_the_pipeline_again(wf: dict[str, Any]) -> None:
    wf["spec"]["onExit"] = wf["spec"]["entrypoint"]


def _dag_calls_itself(wf: dict[str, Any]) -> None:
    _dag(wf).append({"name": "again", "template": wf["spec"]["entrypoint"], "dependencies": ["register"]})


ARGO_MORE_PODS = {"eight-finetune-tasks": _eight_finetune_tasks,
                  "on-exit-runs-the-pipeline-again": _on_exit_runs_the_pipeline_again,
                  "dag-calls-itself": _dag_calls_itself}


@pytest.mark.parametrize("edit", ARGO_MORE_PODS.values(), ids=ARGO_MORE_PODS.keys())
def test_f1_an_argo_file_that_runs_the_gpu_template_more_times_is_refused(compiled: Path, tmp_path: Path,
                                                                          edit: Callable[[dict[str, Any]], None]
                                                                          ) -> None:
    _refused(_argo_submit(compiled, tmp_path, edit, _plan(tmp_path)), "8 (or 2, or unbounded) finetune pods")


def _kfp_eight_finetune_tasks(docs: list[dict[str, Any]]) -> None:
    tasks = _exit_tasks(docs)
    for i in range(7):
        tasks[f"finetune-{i}"] = {**copy.deepcopy(tasks["finetune"]), "taskInfo": {"name": f"finetune-{i}"}}


def _kfp_pipeline_twice(docs: list[dict[str, Any]]) -> None:
    root = docs[0]["root"]["dag"]["tasks"]
    root["again"] = {**copy.deepcopy(root["exit-handler-1"]), "taskInfo": {"name": "again"}}


KFP_MORE_PODS = {"eight-finetune-tasks": _kfp_eight_finetune_tasks, "pipeline-twice": _kfp_pipeline_twice}


@pytest.mark.parametrize("edit", KFP_MORE_PODS.values(), ids=KFP_MORE_PODS.keys())
def test_f1_a_kfp_package_that_runs_the_gpu_executor_more_times_is_refused(compiled: Path, tmp_path: Path,
                                                                           edit: Callable[[list[dict[str, Any]]],
                                                                                          None]) -> None:
    _refused(_kfp_submit(compiled, tmp_path, edit, _plan(tmp_path)), "8 or 2 KFP finetune pods")


# F2: the values a pod runs with ----------------------------------------------------------------------------------

def test_f2_an_argo_task_argument_of_10m_steps_is_checked(compiled: Path, tmp_path: Path) -> None:
    def edit(wf: dict[str, Any]) -> None:
        for p in _task(wf, "finetune")["arguments"]["parameters"]:
            if p["name"] == "max_steps":
                p["value"] = "10000000"

    _refused(_argo_submit(compiled, tmp_path, edit, _plan(tmp_path)), "a finetune task of 10^7 steps")


def test_f2_a_kfp_task_input_constant_of_10m_steps_is_checked(compiled: Path, tmp_path: Path) -> None:
    def edit(docs: list[dict[str, Any]]) -> None:
        _exit_tasks(docs)["finetune"]["inputs"]["parameters"]["max_steps"] = {
            "runtimeValue": {"constant": 10000000}}

    _refused(_kfp_submit(compiled, tmp_path, edit, _plan(tmp_path)), "a KFP finetune task of 10^7 steps")


def test_f2_an_mlproject_command_with_a_literal_of_10m_steps_is_checked(compiled: Path, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    shutil.copytree(compiled / "mlflow_projects/finetune-k8s", project)
    mlproject = project / "MLproject"
    text = mlproject.read_text()
    assert "--param=max_steps={max_steps}" in text
    mlproject.write_text(text.replace("--param=max_steps={max_steps}", "--param=max_steps=10000000", 1))
    _refused(_mlflow_submit(project, tmp_path, _plan(tmp_path)), "an MLflow main of 10^7 steps")


# F3: a gang's TrainJob ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", name="gang")
def gang_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _compile(tmp_path_factory.mktemp("g") / "g", "--nodes", "2", "--gpus", "4", "--cache-pvc", "shared",
                    "--gpu-type", "nvidia-h200")


def _gang_plan(tmp_path: Path) -> Path:
    return _plan_of(tmp_path, [{**ROW, "path": "argo", "nodes": 2, "gpus": 8}])


def _pin(wf: dict[str, Any], text: str) -> None:
    """The launcher's pin, recomputed as anyone can: a plain sha256 of the spec's canonical JSON."""
    from components.trainjob.gang import GangSpec, spec_digest

    for entry in _finetune(wf)["container"]["env"]:
        if entry["name"] == "LLMPACK_GANG_SPECS":
            entry["value"] = spec_digest(GangSpec.from_json(text, "edit"))


def _default(wf: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in wf["spec"]["arguments"]["parameters"] if p["name"] == name)


def _gang_on_b200(wf: dict[str, Any]) -> None:
    param = _default(wf, "trainjob")
    spec = json.loads(param["value"])
    spec["node_affinity"] = B200  # gpu_type stays nvidia-h200: the row checked is the H200's
    param["value"] = json.dumps(spec)
    _pin(wf, param["value"])


def _gang_64_by_8_b200_in_task_arguments(wf: dict[str, Any]) -> None:
    spec = json.loads(_default(wf, "trainjob")["value"])
    spec.update(gpus_per_node=8, gpu_type="nvidia-b200", node_affinity=B200)
    text = json.dumps(spec)
    _pin(wf, text)
    for p in _task(wf, "finetune")["arguments"]["parameters"]:
        if p["name"] == "trainjob":
            p["value"] = text
        if p["name"] == "nnodes":
            p["value"] = "64"


GANG_EDITS = {"spec-node-affinity-b200": _gang_on_b200,
              "task-arguments-64-x-8-b200": _gang_64_by_8_b200_in_task_arguments}


@pytest.mark.parametrize("edit", GANG_EDITS.values(), ids=GANG_EDITS.keys())
def test_f3_a_gang_whose_trainjob_is_elsewhere_or_larger_is_refused(gang: Path, tmp_path: Path,
                                                                    edit: Callable[[dict[str, Any]], None]) -> None:
    _refused(_argo_submit(gang, tmp_path, edit, _gang_plan(tmp_path)), "a TrainJob on B200 / of 64 x 8")


def test_f3_the_edited_gang_is_what_the_launcher_would_build(gang: Path) -> None:
    """The control: the edit of F3 passes the launcher's own check and builds 64 nodes x 8 GPUs on B200 nodes."""
    from components.trainjob.gang import GangSpec, build_trainjob, check_compiled

    wf = copy.deepcopy(yaml.safe_load((gang / "argo_workflows/finetune.yaml").read_text()))
    _gang_64_by_8_b200_in_task_arguments(wf)
    env = {e["name"]: e["value"] for e in _finetune(wf)["container"]["env"] if "value" in e}
    args = {p["name"]: p["value"] for p in _task(wf, "finetune")["arguments"]["parameters"]}
    spec = GangSpec.from_json(args["trainjob"], "launcher")
    check_compiled(spec, "launcher", env)  # accepted
    job = json.dumps(build_trainjob(spec, name="n", namespace="ns", nodes=int(args["nnodes"]), command=["x"],
                                    labels={}, env={}))
    assert '"numNodes": 64' in job and '"nvidia.com/gpu": "8"' in job and "NVIDIA-B200" in job


# F4: a bill without a GPU type -----------------------------------------------------------------------------------

def test_f4_a_bill_without_a_gpu_type_is_never_checked_against_another_types_row(compiled: Path,
                                                                                tmp_path: Path) -> None:
    rows = [{**ROW, "path": "argo", "gpu_type": "nvidia-l4"},  # chosen, $2 at most
            {**ROW, "path": "argo", "chosen": False, "cost_usd": {"total": {"value": 10.0, "ci": [8.0, 20.0]}}}]
    text = (compiled / "argo_workflows/finetune.yaml").read_text()
    assert text.count('"gpu_type":"nvidia-h200",') >= 2
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(text.replace('"gpu_type":"nvidia-h200",', ""))  # the H200 pods and affinity untouched
    res = _submit(["argo", *HOST, "--workflow", str(workflow)], _plan_of(tmp_path, rows))
    _refused(res, "H200 pods under the L4 row ($2), the H200 row being $20")


# F5: retries and deadlines ---------------------------------------------------------------------------------------

def _retry_forever(wf: dict[str, Any]) -> None:
    _finetune(wf)["retryStrategy"] = {"limit": "100000", "retryPolicy": "Always"}


def _deadline_1e9(wf: dict[str, Any]) -> None:
    wf["spec"]["activeDeadlineSeconds"] = 10**9
    _finetune(wf)["activeDeadlineSeconds"] = str(10**9)


@pytest.mark.parametrize("edit", [_retry_forever, _deadline_1e9], ids=["retry-100000", "deadline-1e9"])
def test_f5_an_argo_gpu_pod_retried_or_kept_without_bound_is_refused(compiled: Path, tmp_path: Path,
                                                                      edit: Callable[[dict[str, Any]], None]) -> None:
    _refused(_argo_submit(compiled, tmp_path, edit, _plan(tmp_path)), "a finetune pod retried 10^5 times / 31 years")


def test_f5_a_kfp_finetune_retried_a_million_times_is_refused(compiled: Path, tmp_path: Path) -> None:
    def edit(docs: list[dict[str, Any]]) -> None:
        _exit_tasks(docs)["finetune"]["retryPolicy"] = {"maxRetryCount": 1000000, "backoffDuration": "0s"}

    _refused(_kfp_submit(compiled, tmp_path, edit, _plan(tmp_path)), "a KFP finetune retried 10^6 times")


def test_f5_an_mlflow_job_retried_a_million_times_is_refused(compiled: Path, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    shutil.copytree(compiled / "mlflow_projects/finetune-k8s", project)
    template = project / "kubernetes_job_template.yaml"
    job = yaml.safe_load(template.read_text())
    job["spec"]["backoffLimit"] = 1000000
    del job["spec"]["podFailurePolicy"]
    template.write_text(yaml.safe_dump(job))
    _refused(_mlflow_submit(project, tmp_path, _plan(tmp_path)), "an MLflow Job retried 10^6 times")


# F6: every GPU pod held to finetune's count ----------------------------------------------------------------------

def test_f6_evaluate_raised_to_finetunes_gpus_is_refused(tmp_path: Path) -> None:
    eight = _compile(tmp_path / "c8", "--gpus", "8", "--gpu-type", "nvidia-h200")

    def edit(wf: dict[str, Any]) -> None:
        for kind in ("limits", "requests"):
            _template(wf, "evaluate")["container"]["resources"][kind]["nvidia.com/gpu"] = "8"

    res = _argo_submit(eight, tmp_path, edit, _plan_of(tmp_path, [{**ROW, "path": "argo", "gpus": 8}]))
    _refused(res, "evaluate of 8 GPUs, billed 1")


# F7, F8: false refusals of files exactly as compiled --------------------------------------------------------------

PIPELINE = '''
from components import Dataset, Input, Metrics, Output, pipeline, step
from components.dsl import Execution, Resources
from components.steps.finetune import finetune
from components.steps.prepare_data import prepare_data
from components.steps.tokenize import tokenize


@step(execution=Execution(resources=Resources(cpu=8, memory="64Gi", gpu_type="nvidia-h200", gpus=2)))
def big_check(dataset: Input[Dataset], report: Output[Metrics]) -> None:
    pass


@pipeline(name="with-big-check")
def p(model: str = "tiny", data: str = "builtin", seed: int = 0, max_steps: int = 30) -> None:
    prepared = prepare_data(data=data, seed=seed)
    big_check(dataset=prepared.outputs["dataset"])
    tokens = tokenize(dataset=prepared.outputs["dataset"], model=model)
    finetune(tokens=tokens.outputs["tokens"], base_model=model, max_steps=max_steps, seed=seed)
'''


def test_f7_a_pipeline_with_a_larger_gpu_step_as_compiled_is_not_refused(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "round29_big_check.py").write_text(PIPELINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    out = _compile(tmp_path / "out", "--pipeline", "round29_big_check:p", "--gpu-type", "nvidia-h200")
    uses = re.search(r"--uses=(\[[^\n]*\])", (out / "argo_workflows/finetune.yaml").read_text())
    assert uses and '"gpus":2,"step":"big-check"' in uses.group(1), "the 2-GPU step is in the bill"
    res = _submit(["argo", *HOST, "--workflow", str(out / "argo_workflows/finetune.yaml")], _plan(tmp_path))
    assert "not as llmpack compile wrote it" not in res.output, res.output[-400:]
    assert "unreachable" in res.output, res.output[-400:]


def test_f8_a_fused_file_is_checked_against_the_fused_paths_row(tmp_path: Path) -> None:
    fused = _compile(tmp_path / "fused", "--fuse", "gpu", "--gpu-type", "nvidia-h200")
    rows = [{**ROW, "path": "argo+fuse-gpu"},
            {**ROW, "path": "argo", "chosen": False, "cost_usd": {"total": {"value": 10.0, "ci": [8.0, 20.0]}}}]
    res = _submit(["argo", *HOST, "--workflow", str(fused / "argo_workflows/finetune.yaml")],
                  _plan_of(tmp_path, rows))
    assert "unreachable" in res.output, f"the fused file checked against the unfused row: {res.output[-400:]}"


# F9: a URL percent-encoded inside a query value ------------------------------------------------------------------

NESTED = {
    "redirect-access-token": "http://sso/login?next=https%3A%2F%2Fmlflow%2Fcb%3Faccess_token%3D{s}%26x%3D1",
    "redirect-userinfo": "http://sso/login?r=https%3A%2F%2Fbob%3A{s}%40mlflow%2F",
    "double-encoded-token": "http://sso/?r=https%253A%252F%252Fmlflow%252F%253Ftoken%253D{s}",
}


@pytest.mark.parametrize("text", NESTED.values(), ids=NESTED.keys())
def test_f9_a_token_in_a_percent_encoded_url_inside_a_query_is_blanked(text: str) -> None:
    """F9 (low): an OAuth-style ``next=``/``redirect_uri=`` value carries a whole URL percent-encoded; its
    ``access_token``/``token`` and userinfo password (short: the 20-character rule does not catch it) stay whole."""
    from components.redaction import redact_text

    secret = "Zq7Xv3Lm"
    assert secret not in redact_text(text.format(s=secret))
