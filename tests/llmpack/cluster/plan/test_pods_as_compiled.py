"""``--plan`` reads pods only as ``llmpack compile`` writes them (issue 46, round 29's fix of rounds 26-28's class):
every compiled form passes, and a form the compilers never write is refused before it is understood."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from components.errors import InputError
from llmpack.cluster.plan.pods import check_pods

CONFIGS = {
    "h200": ["--gpu-type", "nvidia-h200"],
    "fuse-gpu": ["--fuse", "gpu"],
    "4-gpus-checkpoints": ["--gpus", "4", "--checkpoint-pvc", "ck", "--grace-period", "100"],
    "a100-everything": ["--gpu-type", "a100", "--cache-pvc", "hf", "--model-pvc", "m", "--data-pvc", "d",
                        "--hf-token-secret", "hf", "--image-pull-secret", "s", "--label", "team=x",
                        "--checkpoint-pvc", "ck"],
    "own-pipeline": ["--pipeline", "examples.custom_step:with_report"],
}
TYPES = {"h200": "nvidia-h200", "a100-everything": "nvidia-a100-80gb"}


def _compile(out: Path, args: list[str]) -> Path:
    from llmpack.cli import main

    res = CliRunner().invoke(main, ["compile", "--out", str(out), *args])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def h200(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _compile(tmp_path_factory.mktemp("h200") / "c", CONFIGS["h200"])


def _docs(path: Path) -> list[Any]:
    return list(yaml.safe_load_all(path.read_text()))


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIGS)
def test_every_compiled_form_passes(tmp_path: Path, config: str) -> None:
    out = _compile(tmp_path / "c", CONFIGS[config])
    gpu_type = TYPES.get(config, "nvidia-h100-80gb")
    per_pod = 4 if "4-gpus" in config else 1
    for artifact in ("argo_workflows/finetune.yaml", "kfp_pipelines/finetune.yaml"):
        check_pods(str(out / artifact), _docs(out / artifact), gpu_type, per_pod)
    check_pods(str(out / "mlflow_projects/finetune-k8s"), None, gpu_type, per_pod)


def _argo(h200: Path, edit: Any, tmp_path: Path) -> None:
    wf = _docs(h200 / "argo_workflows/finetune.yaml")
    edit(wf[0])
    check_pods(str(tmp_path / "wf.yaml"), wf, "nvidia-h200", 1)


def _template(wf: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in wf["spec"]["templates"] if t["name"] == name)


def _task(wf: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in wf["spec"]["templates"][0]["dag"]["tasks"] if t["name"] == name)


ARGO = {
    "fan-out-withItems": lambda wf: _task(wf, "finetune").update(withItems=list(range(64))),
    "fan-out-withSequence": lambda wf: _task(wf, "finetune").update(withSequence={"count": "64"}),
    "templateRef-elsewhere": lambda wf: _task(wf, "finetune").update(templateRef={"name": "x", "template": "y"}),
    "inline-template": lambda wf: _task(wf, "evaluate").update(inline={"container": {"image": "x"}}),
    "steps-template": lambda wf: wf["spec"]["templates"].append({"name": "s", "steps": [[]]}),
    "script-template": lambda wf: wf["spec"]["templates"].append({"name": "s", "script": {"image": "x"}}),
    "containerSet": lambda wf: wf["spec"]["templates"].append({"name": "s", "containerSet": {"containers": []}}),
    "templateDefaults": lambda wf: wf["spec"].update(templateDefaults={"nodeSelector": {"a": "b"}}),
    "workflow-affinity": lambda wf: wf["spec"].update(affinity={"nodeAffinity": {}}),
    "workflowTemplateRef": lambda wf: wf["spec"].update(workflowTemplateRef={"name": "x"}),
    "podSpecPatch-more-than-grace": lambda wf: _template(wf, "finetune").update(
        podSpecPatch=json.dumps({"terminationGracePeriodSeconds": 9, "nodeName": "b200-1"})),
    "another-extended-resource": lambda wf: _template(wf, "evaluate")["container"]["resources"]["limits"].update(
        {"amd.com/gpu": "8"}),
    "evaluate-unplaced": lambda wf: _template(wf, "evaluate").pop("affinity"),
    "placement-with-an-extra-term": lambda wf: _template(wf, "finetune")["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].append(
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}),
    "a-second-document": None,
}


@pytest.mark.parametrize("edit", ARGO.values(), ids=ARGO)
def test_an_argo_form_never_compiled_is_refused(h200: Path, tmp_path: Path, edit: Any) -> None:
    if edit is None:
        docs = _docs(h200 / "argo_workflows/finetune.yaml")
        with pytest.raises(InputError, match="not submitted"):
            check_pods(str(tmp_path / "wf.yaml"), [*docs, {"apiVersion": "v1", "kind": "Pod"}], "nvidia-h200", 1)
        return
    with pytest.raises(InputError, match="not submitted"):
        _argo(h200, edit, tmp_path)


def test_the_compilers_grace_period_patch_alone_passes(h200: Path, tmp_path: Path) -> None:
    _argo(h200, lambda wf: _template(wf, "finetune").update(
        podSpecPatch=json.dumps({"terminationGracePeriodSeconds": 150})), tmp_path)


def _kfp_executor(docs: list[Any], name: str) -> dict[str, Any]:
    return docs[0]["deploymentSpec"]["executors"][name]


KFP = {
    "parameterIterator": lambda d: next(iter(d[0]["root"]["dag"]["tasks"].values())).update(
        parameterIterator={"itemInput": "x", "items": {"raw": "[1,2,3]"}}),
    "importer-executor": lambda d: d[0]["deploymentSpec"]["executors"].update(x={"importer": {}}),
    "runtime-accelerator-type": lambda d: _kfp_executor(d, "exec-finetune")["container"]["resources"][
        "accelerator"].update(resourceType="{{$.inputs.parameters['t']}}"),
    "unplaced-executor": lambda d: d[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"][
        "exec-evaluate"].pop("nodeAffinity"),
    "weighted-term": lambda d: d[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-finetune"][
        "nodeAffinity"][0].update(weight=1),
    "no-platform-spec": lambda d: d.pop(1),
    "a-third-document": lambda d: d.append({"platforms": {}}),
}


@pytest.mark.parametrize("edit", KFP.values(), ids=KFP)
def test_a_kfp_form_never_compiled_is_refused(h200: Path, tmp_path: Path, edit: Any) -> None:
    docs = copy.deepcopy(_docs(h200 / "kfp_pipelines/finetune.yaml"))
    edit(docs)
    with pytest.raises(InputError, match="not submitted"):
        check_pods(str(tmp_path / "p.yaml"), docs, "nvidia-h200", 1)


def _job(project: Path, edit: Any) -> None:
    path = project / "kubernetes_job_template.yaml"
    job = yaml.safe_load(path.read_text())
    edit(job)
    path.write_text(yaml.safe_dump(job))


JOB = {
    "parallelism": lambda j: j["spec"].update(parallelism=64, completions=64),
    "init-container": lambda j: j["spec"]["template"]["spec"].update(
        initContainers=[{"name": "i", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]),
    "second-container": lambda j: j["spec"]["template"]["spec"]["containers"].append({"name": "s", "image": "x"}),
    "preferred-placement": lambda j: j["spec"]["template"]["spec"]["affinity"].update(nodeAffinity={
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]}]}}]}),
}


@pytest.mark.parametrize("edit", JOB.values(), ids=JOB)
def test_an_mlflow_job_never_compiled_is_refused(tmp_path: Path, edit: Any) -> None:
    project = _compile(tmp_path / "c", CONFIGS["h200"]) / "mlflow_projects/finetune-k8s"
    _job(project, edit)
    with pytest.raises(InputError, match="not submitted"):
        check_pods(str(project), None, "nvidia-h200", 1)


def test_an_mlflow_config_naming_another_template_is_refused(tmp_path: Path) -> None:
    project = _compile(tmp_path / "c", CONFIGS["h200"]) / "mlflow_projects/finetune-k8s"
    config = project / "kubernetes_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "kube-job-template-path": "/tmp/other.yaml"}))
    with pytest.raises(InputError, match="another Job template"):
        check_pods(str(project), None, "nvidia-h200", 1)
