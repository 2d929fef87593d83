"""``--pipeline MODULE:NAME``: your own pipeline through run, compare and compile, from the repository root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.errors import InputError
from llmpack.run.user_pipeline import load_pipeline, step_pythonpath
from tests.conftest import llmpack

REPO = Path(__file__).resolve().parents[3]
REF = "examples.custom_step:with_report"


def test_a_pipeline_function_or_object_loads_from_the_current_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_flow.py").write_text(
        "from examples.custom_step import with_report\nPIPE = with_report()\nNOT_ONE = 3\n", encoding="utf-8")
    (tmp_path / "needs_dep.py").write_text("import not_a_package_52\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO))
    assert load_pipeline("my_flow:PIPE").name == "finetune-with-report"
    assert "data-report" in load_pipeline(REF).tasks
    assert step_pythonpath("my_flow:PIPE", {"PYTHONPATH": "/x"})["PYTHONPATH"].split(":")[:2] == [str(tmp_path), "/x"]
    assert step_pythonpath(None, {}) == {}
    for ref, why in [("my_flow:NOT_ONE", "not a @pipeline"), ("my_flow:nope", "has no nope"),
                     ("no_such_mod:x", "cannot import"), ("../etc:x", "expected MODULE:NAME"),
                     ("needs_dep:x", "it imports 'not_a_package_52', which is not installed"),
                     ("a;rm -rf:x", "expected MODULE:NAME"), ("mod", "expected MODULE:NAME")]:
        with pytest.raises(InputError, match=why):
            load_pipeline(ref)


def test_bad_pipeline_is_one_line_and_exit_2(tmp_path: Path) -> None:
    r = llmpack("run", "--pipeline", "examples.custom_step:nope", "--output-dir", str(tmp_path / "runs"), cwd=REPO)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "has no nope" in r.stderr
    assert not (tmp_path / "runs").exists()
    # --param binds against that pipeline: lr is the built-in pipeline's, not with_report's
    r = llmpack("run", "--pipeline", REF, "--param", "lr=0.1", "--output-dir", str(tmp_path / "runs"), cwd=REPO)
    assert r.returncode == 2 and "unknown pipeline parameter (known: model, data, seed, max_steps)" in r.stderr
    r = llmpack("cluster", "compare", "--pipeline", REF, cwd=REPO)
    assert r.returncode == 2 and "--pipeline: local compares only" in r.stderr


def test_compile_pipeline_plain_and_fused(tmp_path: Path) -> None:
    for fuse in ("none", "all"):
        out = tmp_path / fuse
        r = llmpack("compile", "--pipeline", REF, "--fuse", fuse, "--out", str(out), cwd=REPO)
        assert r.returncode == 0, r.stderr
        kfp = (out / "kfp_pipelines" / "finetune.yaml").read_text()
        assert "data-report" in kfp and "finetune-with-report" in kfp
        assert (out / "mlflow_projects" / "finetune" / "examples" / "custom_step.py").exists()


@pytest.mark.slow
def test_run_pipeline_from_the_repository_root(tmp_path: Path) -> None:
    """``llmpack run --pipeline examples.custom_step:with_report`` as a fresh clone types it."""
    r = llmpack("run", "--pipeline", REF, "--max-steps", "2", "--json", "--output-dir", str(tmp_path / "runs"),
                "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["status"] == "succeeded" and s["tags"]["llmpack.pipeline"] == "finetune-with-report"
    assert list(Path(s["artifacts"]["run_dir"]).rglob("data_report.json"))
