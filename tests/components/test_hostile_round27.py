"""The twenty-seventh independent round's findings (helper sec27, issue 46); each test fails on 5fa85eb.

F1 (medium): ``--plan``'s pod check (round 26 F2) reads an MLflow project's ``pipeline.json`` only; the pods are the
    ``kubernetes_job_template.yaml`` that submit sends: 8 GPUs on B200 nodes there pass a 1 x H200 row.
F2 (medium): the check matches ``nvidia.com/gpu`` counts of digits in one container: a Kubernetes quantity
    (``8000m``, ``8e0``), an Argo ``podSpecPatch``, seven 1-GPU sidecars, KFP's older ``count``
    or a ``resourceCount`` of ``8000m`` or a runtime parameter ask for 8 GPUs and pass.
F3 (medium-low): placement read from three labels, operators ignored: ``node.kubernetes.io/instance-type`` (which
    llmpack compile itself writes), ``NotIn`` the row's product, or no placement at all put a pod on B200 nodes.
F4 (low): the walk stops after 200,000 nodes and passes: 210,000 container args ahead of the 8-GPU request hide it.
F5 (medium): the mlflow path cuts a long line at its last space: a known secret with a space in it (a passphrase as
    MLFLOW_TRACKING_PASSWORD) across the 64 KiB cut is redacted in halves, and the step log holds it whole.
F6 (low): doctor's ``pending_why`` reads StorageClasses as objects: a string, or annotations a list: traceback.
F7 (medium-low): --fuse names a member's output ``<task>_<output>``: ft's x_model and ft-x's model are one.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.components.plan_submit import compiled_artifacts  # noqa: F401 - the `compiled` fixture
from tests.components.plan_submit import finetune as _finetune
from tests.components.plan_submit import plan_file as _plan
from tests.components.plan_submit import refused as _refused
from tests.components.plan_submit import submit as _submit


def test_f1_the_mlflow_jobs_pods_are_read_where_submit_reads_them(compiled: Path, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    shutil.copytree(compiled / "mlflow_projects/finetune-k8s", project)
    template = project / "kubernetes_job_template.yaml"
    text = template.read_text()
    assert "nvidia.com/gpu: '1'" in text and "- NVIDIA-H200\n" in text
    template.write_text(text.replace("nvidia.com/gpu: '1'", "nvidia.com/gpu: '8'").replace("- NVIDIA-H200\n",
                                                                                             "- NVIDIA-B200\n"))
    (tmp_path / "kc.yaml").write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: abcdefgh12345678}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u, namespace: default}}]\ncurrent-context: x\n")
    res = _submit(["mlflow", "--kubeconfig", str(tmp_path / "kc.yaml"), "--tracking-uri",
                   f"sqlite:///{tmp_path}/m.db", "--project", str(project)], _plan(tmp_path))
    _refused(res, "an MLflow Job of 8 x B200")


def _gpus(value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(wf: dict[str, Any]) -> None:
        for kind in ("limits", "requests"):
            _finetune(wf)["container"]["resources"][kind]["nvidia.com/gpu"] = value
    return edit


def _pod_spec_patch(wf: dict[str, Any]) -> None:
    _finetune(wf)["podSpecPatch"] = json.dumps({
        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"}})


def _sidecars(wf: dict[str, Any]) -> None:
    _finetune(wf)["sidecars"] = [{"name": f"s{i}", "image": "ghcr.io/llmpack/llmpack:0.1.0",
                                  "resources": {"limits": {"nvidia.com/gpu": "1"}}} for i in range(7)]


def _placed(terms: list[dict[str, Any]]) -> Callable[[dict[str, Any]], None]:
    def edit(wf: dict[str, Any]) -> None:
        _finetune(wf)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": terms}]}
    return edit


def _unplaced(wf: dict[str, Any]) -> None:
    del _finetune(wf)["affinity"]


def _padded(wf: dict[str, Any]) -> None:
    container = _finetune(wf)["container"]
    _gpus("8")(wf)
    resources, args = container.pop("resources"), container.pop("args")
    _finetune(wf)["container"] = {"resources": resources, **container, "args": [*args, *["x"] * 210_000]}


ARGO_EDITS = {
    "quantity-8000m": _gpus("8000m"), "quantity-8e0": _gpus("8e0"),
    "podSpecPatch": _pod_spec_patch, "seven-gpu-sidecars": _sidecars,
    "instance-type-b200": _placed([{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                    "values": ["p6-b200.48xlarge"]}]),
    "product-notin-h200": _placed([{"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["NVIDIA-H200"]}]),
    "no-placement": _unplaced, "padded-past-the-walk": _padded,
}


@pytest.mark.parametrize("edit", ARGO_EDITS.values(), ids=ARGO_EDITS.keys())
def test_f2_f3_f4_an_argo_pod_asking_for_more_or_elsewhere_is_refused(compiled: Path, tmp_path: Path,
                                                                       edit: Callable[[dict[str, Any]], None]) -> None:
    wf = copy.deepcopy(yaml.safe_load((compiled / "argo_workflows/finetune.yaml").read_text()))
    edit(wf)
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(yaml.safe_dump(wf, sort_keys=False))
    res = _submit(["argo", "--host", "http://127.0.0.1:9", "--workflow", str(workflow)], _plan(tmp_path))
    _refused(res, "a finetune pod of 8 GPUs or on other nodes")


KFP_EDITS = {
    "older-count-field": ("count: '1'\n            resourceCount: '1'\n            resourceType: nvidia.com/gpu\n",
                          "count: '8'\n"),
    "resourceCount-8000m": ("resourceCount: '1'", "resourceCount: '8000m'"),
    "resourceCount-runtime-parameter": ("resourceCount: '1'",
                                        "resourceCount: '{{$.inputs.parameters[''pipelinechannel--gpus'']}}'"),
}


@pytest.mark.parametrize("old, new", KFP_EDITS.values(), ids=KFP_EDITS.keys())
def test_f2_a_kfp_accelerator_of_8_in_another_form_is_refused(compiled: Path, tmp_path: Path, old: str,
                                                              new: str) -> None:
    text = (compiled / "kfp_pipelines/finetune.yaml").read_text()
    assert old in text
    package = tmp_path / "p.yaml"
    package.write_text(re.sub(re.escape(old), lambda _: new, text, count=1))
    res = _submit(["kfp", "--host", "http://127.0.0.1:9", "--package", str(package)], _plan(tmp_path))
    _refused(res, "a KFP finetune of 8 GPUs")


PASSPHRASE = "correct horse battery staple 7"  # the user's MLFLOW_TRACKING_PASSWORD: a passphrase, spaces in it


def test_f5_a_passphrase_across_the_64k_cut_is_blanked(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import os

    from components.redaction import redact_text
    from mlflow_projects.driver_output import copy_redacted

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSPHRASE)
    assert PASSPHRASE not in redact_text(f"x{PASSPHRASE}y"), "blanked in a line of its own"
    line = b"x" * 65536 + PASSPHRASE.encode() + b"y" * 100 + b"\n"
    chunks = iter([line[:65536 + len(PASSPHRASE) + 10], line[65536 + len(PASSPHRASE) + 10:], b""])
    log = io.BytesIO()
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        copy_redacted(lambda: next(chunks), sink, log)
    finally:
        os.close(sink)
    assert PASSPHRASE.encode() not in log.getvalue(), "cut at the space inside it, each half redacted alone"


@pytest.mark.parametrize("classes", [["a string, not an object"], [{"metadata": {"annotations": ["x"]}}],
                                     [{"metadata": "a string"}]], ids=["class-a-string", "annotations-a-list",
                                                                       "metadata-a-string"])
def test_f6_a_hostile_storage_class_is_passed_over(classes: list[object]) -> None:
    from llmpack.cluster.doctor.gang import pending_why

    claim = {"metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteMany"]}}

    class Reader:
        def everywhere(self, group: str, version: str, plural: str, field_selector: str = "") -> list:
            return classes if plural == "storageclasses" else []

    said = pending_why(Reader(), claim)  # type: ignore[arg-type]
    assert said.startswith("no volume yet"), said


def test_f5_a_real_step_writing_a_passphrase_in_a_long_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    from mlflow_projects.driver_output import tee_output

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSPHRASE)
    log = tmp_path / "step.log"
    code = f"import os; os.write(1, b'x' * 65520 + b'{PASSPHRASE}\\n')"
    with tee_output(log):
        subprocess.run([sys.executable, "-c", code], check=True)
    assert PASSPHRASE.encode() not in log.read_bytes(), "a step's long line kept the passphrase in its log"


CLASH_PIPELINE = '''
    """Two GPU steps whose fused artifact names are one: ft's 'x_model' and ft-x's 'model' are both ft_x_model."""
    from pathlib import Path

    from components import Dataset, Input, Model, Output, pipeline, step
    from components.dsl import Execution, Resources
    from components.fusion import fused_steps

    GPU = Execution(resources=Resources(cpu=1, memory="1Gi", gpu_type="nvidia-h100-80gb", gpus=1))


    @step(name="ft", execution=GPU)
    def ft(x_model: Output[Model]) -> None:
        (Path(x_model.path) / "w").write_text("honest")


    @step(name="ft-x", execution=GPU)
    def ftx(base: Input[Model], model: Output[Model]) -> None:
        (Path(model.path) / "w").write_text("other")


    @step(name="use", execution=GPU)
    def use(m: Input[Model], n: Input[Model], report: Output[Dataset]) -> None:
        (Path(report.path) / "r").write_text((Path(m.path) / "w").read_text() + "," + (Path(n.path) / "w").read_text())


    @pipeline(name="clash")
    def clash(seed: int = 0) -> None:
        a = ft()
        b = ftx(base=a.outputs["x_model"])
        use(m=a.outputs["x_model"], n=b.outputs["model"])


    __getattr__ = fused_steps(clash)
'''


def test_f7_two_members_outputs_never_share_a_fused_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from components import fusion
    from components.errors import InputError

    (tmp_path / "clash_r27.py").write_text(textwrap.dedent(CLASH_PIPELINE))
    monkeypatch.syspath_prepend(str(tmp_path))
    pipe = importlib.import_module("clash_r27").clash()
    try:
        fused = fusion.fuse(pipe, "gpu")
    except InputError:
        return  # refused in one line: fine
    outputs = [name for task in fused.tasks.values() for name in task.step.outputs]
    assert len(outputs) == 3, f"ft's x_model and ft-x's model became one fused output (the run reads other,other, " \
                              f"unfused honest,other): {outputs}"
