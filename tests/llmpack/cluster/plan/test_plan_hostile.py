"""Issue 46, item 13: ``--max-cost`` never passes a NaN, infinite or negative upper bound, and a plan file
with missing keys or deep nesting is one line, exit 2 (read bounded: :mod:`components.bounded`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from llmpack.cli import main
from llmpack.cluster.plan import choice


def _plan(cost: Any = None, **row: Any) -> dict[str, Any]:
    option = {"path": "argo", "gpu_type": "nvidia-h100-80gb", "capacity": "on-demand", "estimated": True,
              "chosen": True, "times_s": {}, "nodes": 1, "gpus": 1,
              "cost_usd": {"total": cost if cost is not None else {"value": 2.0, "ci": [1.0, 3.0]}}}
    return {"options": [{**option, **row}], "history_runs": 3}


def _submit(tmp_path: Path, text: str, max_cost: str = "5") -> Any:
    path = tmp_path / "plan.json"
    path.write_text(text)
    # Port 9 answers nothing: a plan the gate let through would fail later, on the connection, not in one line.
    return CliRunner().invoke(main, ["cluster", "submit", "argo", "--host", "http://127.0.0.1:9", "--plan", str(path),
                                     "--max-cost", max_cost])


@pytest.mark.parametrize(("ci", "value"), [([1.0, math.nan], 2.0), ([1.0, -3.0], -3.0), ([-9.0, -1.0], -5.0),
                                           ([1.0, math.inf], 2.0), ([1.0, 3.0], math.nan)])
def test_a_nan_infinite_or_negative_bound_fails_the_gate(tmp_path: Path, ci: list[float], value: float) -> None:
    res = _submit(tmp_path, json.dumps(_plan({"value": value, "ci": ci})))  # NaN/Infinity as Python writes them
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert "is not an interval of finite numbers >= 0" in res.output, res.output


def test_a_huge_number_for_infinity_fails_the_gate(tmp_path: Path) -> None:
    res = _submit(tmp_path, json.dumps(_plan()).replace("3.0]", "1e999]"))
    assert res.exit_code == 2 and "is not an interval of finite numbers >= 0" in res.output, res.output


@pytest.mark.parametrize("row", [{"path": "argo", "gpu_type": None}, {"cost_usd": {"total": {"value": 1.0}}},
                                 {"cost_usd": {"total": {"value": 1.0, "ci": "cheap"}}}, {"times_s": [1]},
                                 {"times_s": {"total_s": {"p90": {"value": "x", "ci": [1, 2]}}}},
                                 {"borrowed": 7}, {"capacity": ["on-demand"]}])
def test_a_plan_with_missing_or_mistyped_keys_is_one_line(tmp_path: Path, row: dict[str, Any]) -> None:
    res = _submit(tmp_path, json.dumps(_plan(**row)))
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert res.output.startswith("llmpack: error: --plan"), res.output


def test_a_deeply_nested_plan_is_one_line(tmp_path: Path) -> None:
    res = _submit(tmp_path, '{"options": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert res.exit_code == 2 and "nested deeper than 64 levels" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_plan_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    res = CliRunner().invoke(main, ["cluster", "submit", "argo", "--host", "http://127.0.0.1:9", "--plan", str(link)])
    assert res.exit_code == 2 and "not a regular file" in res.output, res.output


def _row(label: str, p90: float, high: float, value: float) -> Any:
    e = SimpleNamespace
    return e(estimated=True, samples=e(option=e(label=label)), times={"total_s": {"p50": e(value=p90),
                                                                                  "p90": e(value=p90)}},
             cost={"total": e(value=value, high=high)})


@pytest.mark.parametrize(("p90", "high", "value"), [(100.0, math.nan, 1.0), (100.0, -1.0, -2.0),
                                                    (math.nan, 1.0, 1.0), (100.0, 1.0, math.nan)])
def test_plan_never_chooses_an_option_whose_estimate_is_not_a_finite_number(p90: float, high: float,
                                                                            value: float) -> None:
    picked = choice.choose([_row("argo nvidia-h200 spot", p90, high, value)], objective="cost",
                           deadline_s=3600.0, max_cost=5.0)
    assert picked.chosen is None and "no finite estimate" in picked.why, picked.why
    sane = _row("kfp nvidia-h200 on-demand", 100.0, 3.0, 2.0)
    picked = choice.choose([_row("argo nvidia-h200 spot", p90, high, value), sane], objective="cost")
    assert picked.chosen is sane, picked.why
