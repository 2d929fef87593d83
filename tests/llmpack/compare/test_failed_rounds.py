"""A compare whose every path fails the same way stops after that round (newcomer5: a pipeline whose second step
raised ran all its rounds, 62.9 s of runs failing alike), says so in one line, and keeps the failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmpack.compare.rounds import compare
from llmpack.run.local import RunOptions
from tests.synthetic_runs import run

ERROR = "step 'strict-check' failed: RuntimeError: too many rows"


def _compare(tmp_path: Path, fails: Any, repeats: int = 3, warmup: int | None = None) -> tuple[dict, list, list]:
    labels: list[str] = []
    said: list[str] = []

    def run_one(o: RunOptions, label: str, **kw: Any) -> dict[str, Any]:
        labels.append(label)
        failed, error = fails(len(labels), o.backend)
        r = run(o.backend, len(labels), ttfs=3.0, spinup=1.0, total=10.0, status="failed" if failed else "succeeded")
        return {**r, "run_group": o.run_group, "error": error if failed else None,
                "failed_step": "strict-check" if failed else None}

    opts = RunOptions(backend="direct", output_dir=tmp_path)
    result = compare(opts, ["direct", "argo"], repeats, run_one=run_one, warmup=warmup, say=said.append)
    return result, labels, said


def test_every_path_failing_the_warm_up_alike_runs_no_counted_round(tmp_path: Path) -> None:
    result, labels, said = _compare(tmp_path, lambda n, b: (True, ERROR))
    assert labels == ["direct (warm-up, not counted)", "argo (warm-up, not counted)"]
    assert len(said) == 1 and said[0].startswith("stopped: every path failed the same way in the warm-up round")
    assert ERROR in said[0] and "-warmup" in said[0]
    assert "llmpack report --run-group rg-" in said[0] and said[0].rstrip(")").endswith("-warmup")  # trial 7
    assert result["stopped"] == "failed" and [f["error"] for f in result["failed"]] == [ERROR, ERROR]
    assert result["run_group"].endswith("-warmup")  # the report's header names the group that holds the runs


def test_every_path_failing_a_counted_round_alike_ends_the_rounds(tmp_path: Path) -> None:
    result, labels, said = _compare(tmp_path, lambda n, b: (n > 2, ERROR))  # the warm-up succeeded, round 1 not
    assert labels[2:] == ["direct (1/3)", "argo (1/3)"] and len(labels) == 4
    assert said == [f"stopped: every path failed the same way in round 1 of 3 ({ERROR}); no further rounds run; "
                    "the report lists the failures"]
    assert result["rounds"] == 1 and len(result["failed"]) == 2 and len(result["runs"]) == 2


@pytest.mark.parametrize("fails", [
    lambda n, b: (b == "argo", ERROR),  # one path fails: the others are still measured
    lambda n, b: (True, f"{b}: its own failure"),  # each its own way: not "the same way"
])
def test_failures_not_alike_on_every_path_run_every_round(tmp_path: Path, fails: Any) -> None:
    result, labels, said = _compare(tmp_path, fails)
    assert len(labels) == 2 + 3 * 2 and said == [] and "stopped" not in result
