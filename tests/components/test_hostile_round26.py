"""The twenty-sixth independent round's findings (helper sec26, issue 46); each test fails on b94ce57.

F1 (medium): the mlflow path's copy of a step's output cuts a line with no end at 64 KiB and holds back only a raw
    known secret's start: a URI's password, a known secret's base64 or percent form across the cut is logged whole.
F2 (medium): ``--plan``'s size and GPU-type check reads the close task's ``--uses`` billing list only: a Workflow whose
    finetune pod asks for 8 GPUs on B200 nodes is sent under a plan's 1 x H200 row and its ``--max-cost``.
F3 (medium-low): an MLflow project's size is read from ``pipeline.json``'s defaults, but ``mlflow run`` fills the
    run's values from ``MLproject``'s: ``max_steps`` 10^7 and ``nnodes`` 64 there pass a 2-node, 120-step row.
F4 (low): ``--plan`` with ``--param trainjob=`` nested 100,000 deep (RecursionError) or a gang spec whose ``gpu_type``
    is a list (TypeError): a traceback, exit 1.
F5 (medium-low): ``--fuse gpu`` names the fused task ``finetune-evaluate``; a step of one's own of that name is
    silently replaced by it: compiled and run without the step, exit 0.
F6 (low): spin-up ends at the first attempt that has a ``process_started``, not at the first attempt's: an attempt 0
    preempted before its process started counts the whole retry as spin-up.
F7 (low): doctor's ``_available_pv``: a PersistentVolume that is a string, a list spec, a string claimRef: traceback.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import textwrap
import urllib.parse
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.components.test_hostile_round25 import _compiled, _plan

URI_PASSWORD = "Vq8Lm3Rt7Xz2"


KNOWN = "Zq7p/W2x+K9vLm"  # the user's MLFLOW_TRACKING_PASSWORD


@pytest.mark.parametrize("form, hidden", [
    (f"https://bob:{URI_PASSWORD}@registry.example/v2/".encode(), URI_PASSWORD.encode()),
    (base64.b64encode(f"alice:{KNOWN}".encode()), base64.b64encode(f"alice:{KNOWN}".encode())),
    (urllib.parse.quote(KNOWN, safe="").encode(), urllib.parse.quote(KNOWN, safe="").encode()),
], ids=["uri-userinfo", "known-secret-base64", "known-secret-percent-encoded"])
def test_f1_a_secret_form_across_the_64k_cut_is_blanked(monkeypatch: pytest.MonkeyPatch, form: bytes,
                                                        hidden: bytes) -> None:
    from components.redaction import redact_text
    from mlflow_projects.driver_output import copy_redacted

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", KNOWN)
    assert hidden.decode() not in redact_text(f"x{form.decode()}y"), "blanked in a line of its own"
    line = b"x" * (65536 - len(form) // 2) + form + b"\n"
    chunks = iter([line[:65536], line[65536:], b""])
    log = io.BytesIO()
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        copy_redacted(lambda: next(chunks), sink, log)
    finally:
        os.close(sink)
    assert hidden not in log.getvalue(), "split by the 64 KiB cut, it is in the log whole"


def test_f1_a_real_step_writing_a_long_line_with_a_uri_password(tmp_path: Path) -> None:
    import subprocess
    import sys

    from mlflow_projects.driver_output import tee_output

    log = tmp_path / "step.log"
    code = f"import os; os.write(1, b'x' * 65520 + b'https://bob:{URI_PASSWORD}@registry.example/v2/\\n')"
    with tee_output(log):
        subprocess.run([sys.executable, "-c", code], check=True)
    assert URI_PASSWORD.encode() not in log.read_bytes(), "a step's long line kept a URI's password in its log"


def test_f2_the_size_check_reads_the_pods_gpus_not_only_the_billing_list(tmp_path: Path) -> None:
    from llmpack.cli import main

    out = tmp_path / "c"
    res = CliRunner().invoke(main, ["compile", "--out", str(out), "--gpu-type", "nvidia-h200"])
    assert res.exit_code == 0, res.output
    row = {"path": "argo", "gpu_type": "nvidia-h200", "capacity": "on-demand", "estimated": True, "chosen": True,
           "nodes": 1, "gpus": 1, "cost_usd": {"total": {"value": 1.0, "ci": [0.5, 2.0]}}}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"options": [row]}))
    text = (out / "argo_workflows/finetune.yaml").read_text()
    assert "nvidia.com/gpu: '1'" in text and "nvidia-h200-141gb" in text
    workflow = tmp_path / "wf.yaml"  # the finetune pod: 8 GPUs on B200 nodes; its --uses still says 1 x H200
    workflow.write_text(text.replace("nvidia.com/gpu: '1'", "nvidia.com/gpu: '8'").replace("nvidia-h200-141gb",
                                                                                             "NVIDIA-B200"))
    res = CliRunner().invoke(main, ["cluster", "submit", "argo", "--host", "http://127.0.0.1:9", "--workflow",
                                    str(workflow), "--plan", str(plan), "--max-cost", "3"])
    assert "unreachable" not in res.output, f"8 x B200 sent under a 1 x H200 row: {res.output.strip()}"
    assert res.exit_code == 2 and "not submitted" in res.output, res.output


def test_f3_an_mlflow_projects_size_is_read_where_mlflow_run_reads_it(tmp_path: Path) -> None:
    from llmpack.cli import main

    plan, high = _plan(tmp_path, "mlflow")
    project = tmp_path / "proj"
    shutil.copytree(_compiled(tmp_path) / "mlflow_projects/finetune-k8s", project)
    text = (project / "MLproject").read_text()
    text = re.sub(r"(max_steps:\n\s*type: int\n\s*default: )\d+", r"\g<1>10000000", text)
    text = re.sub(r"(nnodes:\n\s*type: int\n\s*default: )\d+", r"\g<1>64", text)
    (project / "MLproject").write_text(text)  # pipeline.json left as compiled: 2 nodes, 120 steps
    (tmp_path / "kc.yaml").write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: abcdefgh12345678}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u, namespace: default}}]\ncurrent-context: x\n")
    res = CliRunner().invoke(main, ["cluster", "submit", "mlflow", "--kubeconfig", str(tmp_path / "kc.yaml"),
                                    "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--project", str(project),
                                    "--plan", str(plan), "--max-cost", f"{high * 1.1:.2f}"])
    assert "unreachable" not in res.output, f"64 nodes, 10^7 steps sent under a 2-node row: {res.output.strip()}"
    assert res.exit_code == 2 and "not submitted" in res.output, res.output


@pytest.mark.parametrize("trainjob", ["[" * 100_000, '{"gpus_per_node": 1, "gpu_type": ["nvidia-h200"]}'],
                         ids=["nested-100k", "gpu-type-a-list"])
def test_f4_a_hostile_gang_spec_with_plan_is_one_line(tmp_path: Path, trainjob: str) -> None:
    from llmpack.cli import main

    plan, high = _plan(tmp_path, "argo")
    res = CliRunner().invoke(main, ["cluster", "submit", "argo", "--host", "http://127.0.0.1:9", "--workflow",
                                    str(_compiled(tmp_path) / "argo_workflows/finetune.yaml"), "--plan", str(plan),
                                    "--max-cost", f"{high * 1.1:.2f}", "--param", f"trainjob={trainjob}"])
    assert not isinstance(res.exception, (RecursionError, TypeError)), f"{type(res.exception).__name__}"
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output[-600:]


GATE_PIPELINE = '''
    """A pipeline whose own data gate is named as --fuse gpu names its fused task."""
    from pathlib import Path

    from components import Dataset, Input, Metrics, Output, pipeline, step
    from components.fusion import fused_steps
    from components.steps.evaluate import evaluate
    from components.steps.finetune import finetune
    from components.steps.prepare_data import prepare_data
    from components.steps.tokenize import tokenize


    @step(name="finetune-evaluate")
    def gate(dataset: Input[Dataset], report: Output[Metrics]) -> None:
        """A data gate that must run."""
        (Path(report.path) / "gate.json").write_text("{}")


    @pipeline(name="gated")
    def gated(model: str = "tiny", data: str = "builtin", seed: int = 0, max_steps: int = 2) -> None:
        prepared = prepare_data(data=data, seed=seed)
        gate(dataset=prepared.outputs["dataset"])
        tokens = tokenize(dataset=prepared.outputs["dataset"], model=model)
        tuned = finetune(tokens=tokens.outputs["tokens"], base_model=model, max_steps=max_steps, seed=seed)
        evaluate(model=tuned.outputs["model"], tokens=tokens.outputs["tokens"])


    __getattr__ = fused_steps(gated)
'''


def test_f5_a_step_named_as_the_fused_task_is_never_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from components import fusion
    from components.errors import InputError

    (tmp_path / "gated_r26.py").write_text(textwrap.dedent(GATE_PIPELINE))
    monkeypatch.syspath_prepend(str(tmp_path))
    pipe = importlib.import_module("gated_r26").gated()
    assert "finetune-evaluate" in pipe.tasks and pipe.tasks["finetune-evaluate"].step.ref == "gated_r26:gate"
    try:
        fused = fusion.fuse(pipe, "gpu")
    except InputError:
        return  # refused in one line: fine
    refs = [t.step.ref for t in fused.tasks.values()]
    assert "gated_r26:gate" in refs, f"the gate step vanished from the fused pipeline: {refs}"


def test_f6_spin_up_ends_at_the_first_attempts_process_start() -> None:
    from components.record.telemetry import Record, derive_metrics, group_by_step, record_key

    def event(name: str, value: float, attempt: int) -> Record:
        return Record(key=record_key("p", "finetune", "event", name, attempt), kind="event", step="finetune",
                      name=name, value=value, run_group="g", pipeline_run="p", orchestrator="argo", mode="cluster",
                      attempt=attempt)

    # attempt 0's container started 10 s after submit and was preempted before its process started
    records = [event("container_started", 110.0, 0), event("container_started", 490.0, 1),
               event("process_started", 500.0, 1), event("finished", 600.0, 1)]
    spinup = derive_metrics(group_by_step(records), submitted_at=100.0)["spinup_s"]
    assert spinup == 10.0, f"spin-up {spinup} s: the first attempt and the retry's wait counted as spin-up"


@pytest.mark.parametrize("volume", [
    "a string, not an object",
    {"metadata": {"name": "v"}, "status": {"phase": "Available"}, "spec": ["not", "an", "object"]},
    {"metadata": {"name": "v"}, "status": {"phase": "Available"}, "spec": {"claimRef": "someone"}},
    {"metadata": {"name": "v"}, "status": {"phase": "Available"},
     "spec": {"storageClassName": "", "accessModes": [{"ReadWriteMany": 1}]}},
], ids=["item-a-string", "spec-a-list", "claimref-a-string", "access-modes-objects"])
def test_f7_a_hostile_persistent_volume_is_passed_over(volume: object) -> None:
    from llmpack.cluster.doctor.gang import pending_why

    claim = {"metadata": {"name": "c"}, "spec": {"storageClassName": "", "accessModes": ["ReadWriteMany"]}}

    class Reader:
        def everywhere(self, group: str, version: str, plural: str, field_selector: str = "") -> list:
            return [volume] if plural == "persistentvolumes" else []

    said = pending_why(Reader(), claim)  # type: ignore[arg-type]
    assert said.startswith("no volume yet"), said
