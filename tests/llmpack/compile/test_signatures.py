"""What ``llmpack compile`` wrote is signed with the user's key, and ``cluster submit --plan`` reads only files that
verify (issue 46, rounds 26 to 29: every reading of a hand-edited file missed some form; a signature leaves none)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmpack.compile.signatures import SIGNATURES
from tests.components.plan_submit import ROW, compiled_artifacts, refused, submit  # noqa: F401 - `compiled` fixture
from tests.components.plan_submit import plan_file as _plan

SENT = "unreachable"  # the submit got past every check and met the closed port
ARTIFACTS = {"argo": ("--workflow", "argo_workflows/finetune.yaml"),
             "kfp": ("--package", "kfp_pipelines/finetune.yaml"),
             "mlflow": ("--project", "mlflow_projects/finetune-k8s")}
HOSTS = {"argo": ["--host", "http://127.0.0.1:9"], "kfp": ["--host", "http://127.0.0.1:9"],
         "mlflow": ["--kubeconfig", "/nonexistent/kubeconfig"]}


def _submit(path: str, artifact: Path, plan: Path) -> Any:
    flag = ARTIFACTS[path][0]
    return submit([path, *HOSTS[path], flag, str(artifact)], plan)


def test_compile_signs_every_artifact_a_submit_takes(compiled: Path) -> None:
    signed = json.loads((compiled / SIGNATURES).read_text())["artifacts"]
    for _flag, name in ARTIFACTS.values():
        assert signed[name].startswith("hmac-sha256:"), name


@pytest.mark.parametrize("path", ARTIFACTS)
def test_a_file_as_compiled_is_checked_against_the_plan_and_sent(compiled: Path, tmp_path: Path, path: str) -> None:
    res = _submit(path, compiled / ARTIFACTS[path][1], _plan(tmp_path))
    assert "not submitted" not in res.output, res.output[-600:]
    if path != "mlflow":  # mlflow meets the missing kubeconfig instead of a closed port: also past --plan
        assert SENT in res.output, res.output[-600:]


def _copy(compiled: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(compiled, out)
    return out


def _append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


@pytest.mark.parametrize("path", ARTIFACTS)
def test_a_file_changed_by_one_comment_is_refused(compiled: Path, tmp_path: Path, path: str) -> None:
    out = _copy(compiled, tmp_path)
    artifact = out / ARTIFACTS[path][1]
    _append(artifact / "kubernetes_job_template.yaml" if artifact.is_dir() else artifact, "# edited\n")
    res = _submit(path, artifact, _plan(tmp_path))
    refused(res, f"{path} edited")
    assert "changed since, or signed with another key" in res.output


def test_a_file_added_to_an_mlflow_project_is_refused(compiled: Path, tmp_path: Path) -> None:
    out = _copy(compiled, tmp_path)
    (out / ARTIFACTS["mlflow"][1] / "sitecustomize.py").write_text("import os\n")
    refused(_submit("mlflow", out / ARTIFACTS["mlflow"][1], _plan(tmp_path)), "a file added to the project")


def test_a_file_moved_out_of_its_compile_is_refused(compiled: Path, tmp_path: Path) -> None:
    moved = tmp_path / "wf.yaml"
    shutil.copy(compiled / ARTIFACTS["argo"][1], moved)
    res = _submit("argo", moved, _plan(tmp_path))
    refused(res, "moved")
    assert SIGNATURES in res.output


def test_a_signature_file_of_anothers_key_is_refused(compiled: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMPACK_SIGNING_KEY", "ab" * 32)  # the planter's key signed this compile
    out = tmp_path / "theirs"
    from llmpack.cli import main

    assert CliRunner().invoke(main, ["compile", "--out", str(out), "--gpu-type", "nvidia-h200"]).exit_code == 0
    monkeypatch.delenv("LLMPACK_SIGNING_KEY")  # the user's own key from here
    refused(_submit("argo", out / ARTIFACTS["argo"][1], _plan(tmp_path)), "another key")


def test_a_listing_swapped_between_two_artifacts_is_refused(compiled: Path, tmp_path: Path) -> None:
    out = _copy(compiled, tmp_path)
    sigs = json.loads((out / SIGNATURES).read_text())
    a, k = ARTIFACTS["argo"][1], ARTIFACTS["kfp"][1]
    sigs["artifacts"][a], sigs["artifacts"][k] = sigs["artifacts"][k], sigs["artifacts"][a]
    (out / SIGNATURES).write_text(json.dumps(sigs))
    refused(_submit("argo", out / a, _plan(tmp_path)), "a swapped signature")


@pytest.mark.parametrize("payload", ["[]", "{", "x" * (9 << 20)], ids=["list", "broken", "9-MiB"])
def test_a_hostile_signature_file_is_one_line(compiled: Path, tmp_path: Path, payload: str) -> None:
    out = _copy(compiled, tmp_path)
    (out / SIGNATURES).write_text(payload)
    res = _submit("argo", out / ARTIFACTS["argo"][1], _plan(tmp_path))
    refused(res, "a hostile signature file")
    assert "Traceback" not in res.output


def test_a_fused_file_is_checked_against_its_own_paths_row(tmp_path: Path) -> None:
    """Round 29 F8: a --fuse gpu file was checked against the unfused path's row (or 'no estimate')."""
    from llmpack.cli import main

    out = tmp_path / "fused"
    assert CliRunner().invoke(main, ["compile", "--out", str(out), "--fuse", "gpu", "--gpu-type",
                                     "nvidia-h200"]).exit_code == 0
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"options": [{**ROW, "path": "argo+fuse-gpu"}, {**ROW, "path": "argo", "cost_usd": {
        "total": {"value": 20.0, "ci": [15.0, 25.0]}}}]}))
    res = _submit("argo", out / ARTIFACTS["argo"][1], plan)
    assert SENT in res.output and "not submitted" not in res.output, res.output[-600:]
