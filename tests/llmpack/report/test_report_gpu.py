"""The report's GPU utilisation table: shown where runs sampled a GPU, absent on CPU runs.

report.md and report.html rendered from their facts without the charts (what the table shows does
not depend on them; tests/llmpack/report/test_report_render.py writes whole reports).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from llmpack.compare.comparison import comparison, gpu_rows
from llmpack.report.facts import report_facts
from llmpack.report.render import html_page, markdown
from tests.synthetic_runs import runs

PATHS = ["direct", "kfp", "argo", "mlflow"]


def _pages(result: dict[str, Any], tmp_path: Path) -> tuple[str, str]:
    charts = {name: tmp_path / f"{name}.png" for name in ("timeline", "spinup_boxplot", "cost_per_run")}
    for path in charts.values():
        path.write_bytes(b"\x89PNG")
    facts = report_facts(result)
    return markdown(result, facts, "", None, {}), html_page(result, facts, "", None, charts, {})


def test_gpu_idle_and_utilisation_shown_per_path_only_where_sampled(tmp_path: Path) -> None:
    rs = runs({"argo": 3.0})
    idle = {"direct": [2.0, 4.0, 6.0, 8.0, 10.0], "argo": [20.0, 21.0, 22.0, 23.0, 24.0]}
    for r in rs:
        if r["orchestrator"] in idle:
            r["metrics"].update(gpu_idle_before_first_step_s=idle[r["orchestrator"]].pop(0), gpu_util_mean_pct=61.0)
    failed = next(r for r in rs if r["orchestrator"] == "direct")
    failed["status"] = "failed"  # a failed run's figures are not in the percentiles
    result = comparison("rg-synthetic", PATHS, rs)
    rows = dict(gpu_rows(result))
    assert set(rows["GPU idle before the first step (s)"]) == {"direct", "argo"}
    assert rows["GPU idle before the first step (s)"]["direct"] == {"n": 4, "p50": 7.0, "p90": 9.4}
    md, page = _pages(result, tmp_path)
    row = next(line for line in md.splitlines() if line.startswith("| GPU idle before the first step"))
    assert "7.00 / 9.40 (4)" in row and "22.0 / 23.6 (5)" in row and row.count("| -") == 2, row  # kfp, mlflow: none
    assert "## GPU utilisation" in md and md.index("## GPU utilisation") < md.index("## What the money went on")
    assert "<h2>GPU utilisation</h2>" in page and "GPU utilisation during finetune (mean %)" in page

    # the same runs on CPUs: no GPU metric on any run, no table
    cpu = copy.deepcopy(result)
    for r in cpu["runs"]:
        r["metrics"].pop("gpu_idle_before_first_step_s", None)
        r["metrics"].pop("gpu_util_mean_pct", None)
    assert gpu_rows(cpu) == []
    assert "GPU utilisation" not in "".join(_pages(cpu, tmp_path))
