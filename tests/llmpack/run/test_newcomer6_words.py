"""Issue 52 (newcomer6, item 10): the small words of a local run's end ("1 steps", "1 tasks done")."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from components import pipeline
from components.steps.prepare_data import prepare_data

REPO = Path(__file__).resolve().parents[3]


@pipeline(name="one-task")
def one_task(data: str = "builtin", seed: int = 0) -> None:
    prepare_data(data=data, seed=seed)


def test_a_one_task_direct_run_says_1_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmpack.run import direct

    monkeypatch.setattr(direct, "_run_steps", lambda *a, **k: {})
    monkeypatch.setattr(direct, "run_logged", lambda *a, **k: None)
    pipe, log = one_task(), io.StringIO()
    direct.run_local(pipe, {k: "" for k in pipe.all_params}, tmp_path, {}, log=log)
    assert log.getvalue().startswith("direct: 1 step done in ")


@pytest.mark.parametrize("module", ["llmpack/run/direct.py", "kfp_pipelines/local.py", "argo_workflows/local.py",
                                    "mlflow_projects/local.py"])
def test_every_local_paths_end_line_counts_in_the_singular_too(module: str) -> None:
    text = (REPO / module).read_text(encoding="utf-8")
    assert not re.search(r"\{len\([^)]*\)\} (steps|tasks) done", text)
    assert re.search(r"\{len\(([^)]*)\)\} (step|task)\{'' if len\(\1\) == 1 else 's'\} done", text)
