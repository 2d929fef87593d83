"""A user's own step runs on the MLflow path as it does on KFP and Argo: the project carries its module.

``mlflow run`` starts every entry point in the project directory, where ``examples.custom_step``
could not be imported ("cannot import (No module named 'examples')"). The compiler copies each
step module outside the pack into the project at its package path. These tests run the real
``mlflow run`` from a directory outside the repository, with a ``PYTHONPATH`` on which the pack's
packages are found but ``examples`` is not, so the only copy of the step to be found is the
project's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components import fusion
from mlflow_projects.compiler import render_local_project, write_project
from tests.conftest import REPO

PACK = ("components", "kfp_pipelines", "argo_workflows", "mlflow_projects", "llmpack")
MLFLOW_CLI = str(Path(sys.executable).with_name("mlflow"))


def _with_report():  # imported here: the module is the user's, found from the repository root as its docs say
    sys.path.insert(0, str(REPO))
    try:
        from examples.custom_step import with_report
    finally:
        sys.path.remove(str(REPO))
    return with_report()


def _pack_only_path(tmp_path: Path) -> str:
    """This run's PYTHONPATH with every entry that holds ``examples/`` replaced by the pack's packages alone."""
    entries = []
    for entry in filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if (Path(entry) / "examples").is_dir():
            shadow = tmp_path / "pack-only"
            shadow.mkdir(exist_ok=True)
            for name in PACK:
                if not (shadow / name).exists():
                    (shadow / name).symlink_to(Path(entry) / name)
            entry = str(shadow)
        entries.append(entry)
    return os.pathsep.join(entries)


def test_the_project_carries_the_users_step_module_and_not_the_packs() -> None:
    files = render_local_project(_with_report())
    assert files["examples/custom_step.py"] == (REPO / "examples" / "custom_step.py").read_text(encoding="utf-8")
    assert not [f for f in files if f.split("/")[0] in PACK]  # the pack is installed wherever llmpack runs


@pytest.mark.slow  # the whole custom pipeline through the real `mlflow run`, plain and fused (~1 min)
@pytest.mark.parametrize("mode", ["none", "all"])
def test_the_custom_step_runs_through_mlflow_run(mode: str, tmp_path: Path) -> None:
    pipe = fusion.fuse(_with_report(), mode)
    project = write_project(pipe, tmp_path / "mlflow_projects")["local"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": _pack_only_path(tmp_path), "HF_HUB_OFFLINE": "1",  # the venv active, as a user's
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    probe = subprocess.run([sys.executable, "-c", "import examples.custom_step"], cwd=elsewhere, env=env,
                           capture_output=True, text=True)
    assert probe.returncode != 0, "examples is importable here: the test would prove nothing"
    r = subprocess.run([MLFLOW_CLI, "run", str(project), "--env-manager", "local", "-P", "max_steps=2",
                        "-P", f"artifacts_dir={tmp_path / 'artifacts'}", "-P", f"pipeline_run=custom-{mode}"],
                       cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (report,) = (tmp_path / "artifacts").rglob("data_report.json")
    assert json.loads(report.read_text())["meta"]["rows"] > 0
