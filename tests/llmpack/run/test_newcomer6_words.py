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


@pytest.mark.parametrize("rows", [1, 3])
def test_too_few_distinct_prompts_is_one_line_exit_2_before_any_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     rows: int) -> None:
    """A 1-row ``--data`` (or rows of one prompt) failed prepare_data's split: exit 1, a step failed, where a
    malformed file is exit 2 before anything runs. The split's need (2 distinct prompts) is checked up front."""
    import json

    from click.testing import CliRunner

    from llmpack.cli import main

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "one.jsonl"
    data.write_text("".join(json.dumps({"prompt": "same", "response": f"r{i}"}) + "\n" for i in range(rows)))
    result = CliRunner().invoke(main, ["run", "--data", str(data), "--output-dir", str(tmp_path / "runs")],
                                prog_name="llmpack")
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"llmpack: error: --data {data}: need at least 2 distinct prompts to split into train and eval, got 1 "
        f"({rows} row{'' if rows == 1 else 's'})"]
    assert not (tmp_path / "runs").exists()


def test_gpu_type_for_a_pipeline_without_a_gpu_step_is_refused_as_gpus_is() -> None:
    """Trial 7: `compile --gpu-type h200` of a pipeline whose steps ask for no GPU was accepted silently (placing and
    pricing nothing) while `--gpus 2` was refused."""
    import pytest

    from components.dsl import pipeline
    from components.errors import InputError
    from components.steps.prepare_data import prepare_data
    from components.steps.tokenize import tokenize
    from llmpack.compile.gpus import apply_gpu_overrides

    @pipeline(name="no-gpu-7")
    def no_gpu(seed: int = 0) -> None:
        tokenize(dataset=prepare_data(seed=seed).outputs["dataset"])

    with pytest.raises(InputError, match="--gpu-type nvidia-h200: pipeline 'no-gpu-7' has no step that asks for a GPU"):
        apply_gpu_overrides(no_gpu(), "nvidia-h200", None)
    from components.finetune_pipeline import build

    assert apply_gpu_overrides(build(), "nvidia-h200", None).tasks["finetune"].step.execution.resources.gpu_type \
        == "nvidia-h200"
