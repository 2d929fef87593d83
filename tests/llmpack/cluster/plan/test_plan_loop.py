"""The loop closed, without a cluster: a plan's row as the run's tags, ``--max-cost`` refusing before
anything is sent, the report's estimate-vs-actual section, and ``plan --calibration``'s counts.

On the loopback cluster end to end: tests/llmpack/cluster/plan/test_plan_cluster.py (slow)."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from components.errors import InputError
from llmpack.cli import main
from llmpack.cluster.plan import calibration, record, run
from llmpack.cluster.plan.history import samples_of_runs
from llmpack.report import estimate as section
from tests.llmpack.cluster.plan.plan_runs import gang_run
from tests.llmpack.cluster.plan.plan_runs import history as make_history

TODAY = dt.date(2026, 12, 5)


@pytest.fixture(scope="module")
def plan_json() -> dict:
    samples = samples_of_runs(make_history({("argo", "nvidia-h200"): {"provision": (20.0, 40.0), "price": 7.9},
                                            ("kfp", "nvidia-h200"): {"provision": (20.0, 40.0), "price": 7.9}}))
    # one node: the size `cluster submit` of the committed artifacts (or compiled for --gpu-type) runs
    return run.plan(samples, run.PlanInputs(capacities=("on-demand",), nodes=1), today=TODAY).as_json()


def _file(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_the_row_becomes_tags_that_read_back_as_value_low_high(plan_json: dict) -> None:
    row = record.row_for(plan_json, "argo", "nvidia-h200")
    tags = record.tags_of_row(row, plan_json)
    assert tags["llmpack.plan.option"] == "argo nvidia-h200 on-demand" and tags["llmpack.plan.history_runs"] == "20"
    v, lo, hi = section.parse_triple(tags["llmpack.plan.first_step_s.p90"])
    want = row["times_s"]["first_step_s"]["p90"]
    assert v == pytest.approx(want["value"], rel=1e-3) and lo <= v <= hi
    assert section.parse_triple(tags["llmpack.plan.cost_usd"])[2] == pytest.approx(row["cost_usd"]["total"]["ci"][1],
                                                                                  rel=1e-3)
    with pytest.raises(InputError, match=r"^--plan: the plan has no estimate for mlflow on nvidia-h200; plan it "):
        record.row_for(plan_json, "mlflow", "nvidia-h200")


def test_max_cost_refuses_submit_in_one_line_before_anything_is_sent(plan_json: dict, tmp_path: Path) -> None:
    high = plan_json["options"][0]["cost_usd"]["total"]["ci"][1]
    plan = _file(tmp_path, plan_json)
    # Port 9 answers nothing: had the refusal come after submitting, the error would be a connection's.
    args = ["cluster", "submit", "argo", "--host", "http://127.0.0.1:9", "--plan", plan]
    res = CliRunner().invoke(main, [*args, "--gpu-type", "nvidia-h200", "--max-cost", "0.01"])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == (f"llmpack: error: --max-cost 0.01: the estimate for argo nvidia-h200 on-demand "
                                  f"is up to ${high:.2f} a run "
                                  f"(${plan_json['options'][0]['cost_usd']['total']['value']:.2f}, "
                                  "95% interval upper bound); not submitted")
    res = CliRunner().invoke(main, ["cluster", "compare", "--backends", "argo,kfp", "--gpu-type", "nvidia-h200",
                                    "--plan", plan, "--max-cost", "0.01"])
    assert res.exit_code == 2 and "--max-cost 0.01: the estimate for argo nvidia-h200" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1
    for argv, message in ((["compare", "--plan", plan], "plan options are `llmpack cluster compare`"),
                          ([*args[:5], "--max-cost", "5"], "--max-cost: only with --plan FILE"),
                          ([*args[:5], "--plan", str(tmp_path / "none.json")], "--plan " + str(tmp_path / "none.json")
                           + ": cannot read it"),
                          ([*args[:5], "--plan", _file(tmp_path, {"rows": []})], "not a plan (no 'options' list)")):
        res = CliRunner().invoke(main, argv)
        assert res.exit_code == 2 and message in res.output and len(res.output.strip().splitlines()) == 1, res.output


def _planned_run(i: int, plan_json: dict, *, slow: float = 0.0) -> dict:
    """A run at the middle of what was measured (or ``slow`` seconds later to provision each node)."""
    rec = gang_run("argo", "nvidia-h200", 100 + i, random.Random(i), provision=(30.0 + slow,) * 2, pull=(10.0, 10.0),
                   overhead=(6.0, 6.0), load=(12.0, 12.0), price=7.9)
    rec["tags"].update(record.tags_of_row(record.row_for(plan_json, "argo", "nvidia-h200"), plan_json))
    return rec


def test_the_report_section_says_where_each_actual_fell(plan_json: dict) -> None:
    runs = [_planned_run(0, plan_json), _planned_run(1, plan_json, slow=400.0),
            gang_run("kfp", "x", 9, random.Random(1), provision=(1, 2))]
    found = section.rows(runs)
    assert {r[0] for r in found} == {"argo-nvidia-h200-100", "argo-nvidia-h200-101"}  # the unplanned run has none
    slow = {r[1]: r for r in found if r[0] == "argo-nvidia-h200-101"}
    assert slow["spin-up"][5] == "above p90" and slow["first step"][5] == "above p90"
    fast = {r[1]: r[5] for r in found if r[0] == "argo-nvidia-h200-100"}
    assert fast["spin-up"] in ("<= p50", "<= p90") and set(fast) == {"spin-up", "first step", "total", "cost"}
    md = "\n".join(section.markdown(runs))
    assert "## Estimate vs actual" in md and "| argo-nvidia-h200-101 | spin-up |" in md
    assert "<h2>Estimate vs actual</h2>" in section.html_section(runs) and section.markdown(runs[2:]) == []


def test_calibration_counts_how_often_each_quantile_held(plan_json: dict) -> None:
    runs = ([_planned_run(i, plan_json) for i in range(8)]
            + [_planned_run(20 + i, plan_json, slow=400.0) for i in range(2)])
    report = calibration.calibration(samples_of_runs(runs))
    first = report["headlines"]["first_step_s"]
    assert report["planned_runs"] == 10 and first["runs"] == 10
    assert first["held"] == {"p50": 8, "p90": 8} and not first["ok"]  # the two slow ones are above p90: 8 of 10 < 90%
    assert report["headlines"]["spin_up_s"]["held"]["p90"] == 8
    text = calibration.text(report)
    assert "p90 held 8 of 10 (stated 90%)" in text and max(len(ln) for ln in text.splitlines()) <= 80
    assert "no planned runs in the history" in calibration.text(calibration.calibration(samples_of_runs(runs[:0])))
