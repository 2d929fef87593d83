"""``llmpack compile``: all three native artifacts from the one pipeline object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from components.dsl import Dataset, Input, Metrics, Output, pipeline, step
from components.finetune_pipeline import finetune_pipeline
from llmpack.compile.artifacts import DEFAULT_OUT, compile_all
from tests.conftest import REPO, llmpack


@step()
def toy_audit(dataset: Input[Dataset], report: Output[Metrics], threshold: float = 0.5) -> None:
    """A toy extra step that audits the prepared data."""


def test_a_toy_extra_step_appears_in_all_three_outputs(tmp_path: Path) -> None:
    base = finetune_pipeline()

    @pipeline(name="llm-finetune-audit")
    def with_audit(model: str = "tiny", data: str = "builtin", seed: int = 0) -> None:
        from components.steps.prepare_data import prepare_data

        prepared = prepare_data(data=data, seed=seed)
        toy_audit(dataset=prepared.outputs["dataset"], threshold=0.9)

    pipe = with_audit()
    assert "toy-audit" not in base.tasks
    compile_all(tmp_path, pipe)
    kfp = list(yaml.safe_load_all((tmp_path / "kfp_pipelines/finetune.yaml").read_text()))[0]
    # The steps run inside the KFP exit handler (close-record runs after them, whatever happened).
    assert "toy-audit" in kfp["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    argo = yaml.safe_load((tmp_path / "argo_workflows/finetune.yaml").read_text())
    dag = next(t for t in argo["spec"]["templates"] if "dag" in t)
    assert "toy-audit" in [t["name"] for t in dag["dag"]["tasks"]]
    mlproject = yaml.safe_load((tmp_path / "mlflow_projects/finetune/MLproject").read_text())
    assert "toy_audit" in mlproject["entry_points"]
    # An absolute --out: the config names no directory of the compiling machine, only the path from where
    # compile ran (and `mlflow run` is typed) to the template.
    config = json.loads((tmp_path / "mlflow_projects/finetune-k8s/kubernetes_config.json").read_text())
    typed = config["kube-job-template-path"]
    assert not Path(typed).is_absolute()
    assert (Path.cwd() / typed).resolve() == tmp_path / "mlflow_projects/finetune-k8s/kubernetes_job_template.yaml"
    spec = json.loads((tmp_path / "mlflow_projects/finetune/pipeline.json").read_text())
    assert "toy-audit" in json.dumps(spec)


def test_compile_writes_to_build_by_default_and_leaves_the_golden_files_alone(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`llmpack compile --image X` as the walkthrough types it: build/llmpack/, never the committed copies."""
    from mlflow.projects import _parse_kubernetes_config

    r = llmpack("compile", "--image", "registry.example/team/llmpack:9", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / DEFAULT_OUT
    assert DEFAULT_OUT == Path("build/llmpack") and "build/" in (REPO / ".gitignore").read_text().split()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build"]
    assert "registry.example/team/llmpack:9" in (out / "argo_workflows/finetune.yaml").read_text()
    assert "registry.example/team/llmpack:9" in (out / "kfp_pipelines/finetune.yaml").read_text()
    # MLflow opens the job template relative to where `mlflow run` is typed: here, as `llmpack compile` was.
    config_file = "build/llmpack/mlflow_projects/finetune-k8s/kubernetes_config.json"
    config = json.loads((tmp_path / config_file).read_text())
    assert config["kube-job-template-path"] == "build/llmpack/mlflow_projects/finetune-k8s/kubernetes_job_template.yaml"
    assert f"--backend-config {config_file}" in (out / "mlflow_projects/finetune-k8s/MLproject").read_text()
    monkeypatch.chdir(tmp_path)
    assert _parse_kubernetes_config(config)["kube-job-template"]["kind"] == "Job"


def test_compile_out_onto_a_file_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("keep")
    r = llmpack("compile", "--out", str(f), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == f"llmpack: error: --out {f}: exists and is not a directory"
    assert f.read_text() == "keep"


def test_compile_out_unwritable_is_one_line(tmp_path: Path) -> None:
    r = llmpack("compile", "--out", "/sys/llmpack-out", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--out /sys/llmpack-out" in lines[0] and "Traceback" not in r.stderr


def test_the_custom_step_example_compiles_everywhere(tmp_path: Path) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(REPO / "examples" / "custom_step.py"), str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "data-report" in (tmp_path / "kfp_pipelines/finetune.yaml").read_text()
    assert "data-report" in (tmp_path / "argo_workflows/finetune.yaml").read_text()
    assert "data_report" in (tmp_path / "mlflow_projects/finetune/MLproject").read_text()
