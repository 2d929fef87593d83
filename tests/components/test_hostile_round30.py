"""The thirtieth independent round's findings (helper sec30, issue 46); each test fails on 9eb1c25.

F1 a run's per-step work (``grad_accum``, ``seq_len``, ``batch_size``, ``model``, ``builtin_size``) set at submit
time passes ``--plan --max-cost`` unchecked; F2 the signed file is read again after it verified, so a file swapped
between the check and the send is what is sent; F3 an own pipeline whose step count is not named ``max_steps`` is
never size-checked; F4 a file exactly as compiled, named relative to its own folder, is falsely refused; F5 a
token in a URL percent-encoded in a path segment is printed whole; F6 the signed project's walk lists and sorts
every skipped (``__pycache__``) entry, never counted."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tests.components.plan_submit import (
    capture_argo,
    compiled_artifacts,  # noqa: F401 - the `compiled` fixture
    finetune_gpus,
    plan_file,
    refused,
    submit,
)
from tests.components.plan_submit import finetune as _finetune

HOST = ["--host", "http://127.0.0.1:9"]


# F1: what each step does, set at submit time ------------------------------------------------------------------------

@pytest.mark.parametrize("param", [
    "grad_accum=100000",  # 100,000 micro-batches a step: the same 120 steps, 10^5 times the GPU time
    "seq_len=131072",
    "batch_size=4096",
    "model=meta-llama/Llama-3.1-405B",  # another model than the measured runs trained
    "builtin_size=1000000000",
])
def test_f1_a_runs_per_step_work_set_at_submit_is_checked_against_the_row(compiled: Path, tmp_path: Path,
                                                                         param: str) -> None:
    res = submit(["argo", *HOST, "--workflow", str(compiled / "argo_workflows/finetune.yaml"), "--param", param],
                 plan_file(tmp_path))
    refused(res, f"--param {param} under a plan row measured on the defaults")


# F2: the file swapped after it verified, before it is sent ---------------------------------------------------------

def test_f2_the_file_sent_is_the_file_that_verified(compiled: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer of the compile's folder swaps the file once ``--plan`` has checked it (a real renameat2 flipper got
    2 of 12 submits through with 8 GPUs a pod). Shown here at one point of that window: after the row's cost."""
    from llmpack.cluster.plan import record

    out = tmp_path / "c"
    shutil.copytree(compiled, out)
    target = out / "argo_workflows/finetune.yaml"
    wf = yaml.safe_load(target.read_text())
    for kind in ("requests", "limits"):
        _finetune(wf)["container"]["resources"][kind]["nvidia.com/gpu"] = "8"
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(wf, sort_keys=False))

    real_check = record.check_max_cost

    def check_then_swap(*args: Any, **kwargs: Any) -> None:
        real_check(*args, **kwargs)
        edited.replace(target)  # the concurrent writer's rename lands here

    sent = capture_argo(monkeypatch)
    monkeypatch.setattr(record, "check_max_cost", check_then_swap)
    submit(["argo", *HOST, "--workflow", str(target)], plan_file(tmp_path))
    gpus = finetune_gpus(sent)
    assert not sent or gpus == ["1"], f"a file that never verified was sent: finetune asks for {gpus} GPUs"


# F3: an own pipeline's step count under another name ----------------------------------------------------------------

OWN = '''
from components import pipeline
from components.steps.finetune import finetune
from components.steps.prepare_data import prepare_data
from components.steps.tokenize import tokenize


@pipeline(name="own-steps")
def p(model: str = "tiny", data: str = "builtin", seed: int = 0, steps: int = 30) -> None:
    prepared = prepare_data(data=data, seed=seed)
    tokens = tokenize(dataset=prepared.outputs["dataset"], model=model)
    finetune(tokens=tokens.outputs["tokens"], base_model=model, max_steps=steps, seed=seed)
'''


@pytest.mark.parametrize("backend,flag,path", [("argo", "--workflow", "argo_workflows/finetune.yaml"),
                                               ("kfp", "--package", "kfp_pipelines/finetune.yaml")])
def test_f3_an_own_pipelines_step_count_is_checked_whatever_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     backend: str, flag: str, path: str) -> None:
    from llmpack.cli import main

    (tmp_path / "round30_own.py").write_text(OWN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["compile", "--out", str(out), "--pipeline", "round30_own:p",
                                    "--gpu-type", "nvidia-h200"])
    assert res.exit_code == 0, res.output
    res = submit([backend, *HOST, flag, str(out / path), "--param", "steps=1000000000000"], plan_file(tmp_path))
    refused(res, "finetune's max_steps of 10^12 through the pipeline's own 'steps' parameter")


# F4: a false refusal of a file exactly as compiled -----------------------------------------------------------------

def test_f4_a_compiled_file_named_from_its_own_folder_verifies(compiled: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_file(tmp_path)
    monkeypatch.chdir(compiled / "argo_workflows")
    res = submit(["argo", *HOST, "--workflow", "finetune.yaml"], plan)
    assert "unreachable" in res.output, f"the file as compiled refused: {res.output[-300:]}"


# F5: a URL percent-encoded in a path segment (round 29's F9 looked in query values only) ---------------------------

@pytest.mark.parametrize("text", [
    "https://sso.example/login/https%3A%2F%2Fbob%3A{s}%40mlflow.example%2F",
    "https://sso.example/login/next%3Dhttps%3A%2F%2Fmlflow.example%2F%3Ftoken%3D{s}",
])
def test_f5_a_token_in_a_percent_encoded_url_in_a_path_segment_is_blanked(text: str) -> None:
    from components.redaction import redact_data, redact_text

    secret = "Zq7Xv3Lm"
    assert secret not in redact_text(text.format(s=secret), ())
    assert secret not in str(redact_data({"url": text.format(s=secret)}))


# F6: the signed project's walk is bounded by what it skips too -----------------------------------------------------

def test_f6_a_project_directory_full_of_skipped_entries_is_refused_not_walked(compiled: Path, tmp_path: Path) -> None:
    """200,000 files planted in the signed MLflow project's ``__pycache__``: all listed and sorted (4.8 s, 145 MiB),
    never counted against MAX_FILES (skipped), and the project verified; 2M files is a minute and a GiB."""
    from components.errors import InputError
    from llmpack.compile import signatures

    out = tmp_path / "c"
    shutil.copytree(compiled, out)
    cache = out / "mlflow_projects/finetune-k8s/__pycache__"
    cache.mkdir()
    for i in range(signatures.MAX_FILES * 3):
        (cache / f"f{i}").touch()
    with pytest.raises(InputError, match="more than"):
        signatures.verify(str(out / "mlflow_projects/finetune-k8s"))
