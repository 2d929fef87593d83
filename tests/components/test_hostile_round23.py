"""The twenty-third independent round's findings (helper-51, issue 46): a sqlite tracking store that is a FIFO hung
`llmpack run` and `llmpack report` for ever (a directory was already one line)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_fifo_as_the_sqlite_store_is_one_line_for_run_and_report(tmp_path: Path) -> None:
    fifo = tmp_path / "store.db"
    os.mkfifo(fifo)
    for args, says in ((["run", "--max-steps", "1", "--output-dir", str(tmp_path / "out")], "not a regular file"),
                       (["report", "--run-group", "rg-x", "--out", str(tmp_path / "rep")], "no such database")):
        r = subprocess.run([sys.executable, "-m", "llmpack", *args, "--tracking-uri", f"sqlite:///{fifo}"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert says in r.stderr.strip().splitlines()[-1], r.stderr


def test_max_cost_must_be_a_finite_amount() -> None:
    """F3: `--max-cost inf` passed any estimate; `nan` was taken and then refused with an odd line."""
    for args in (["cluster", "plan"], ["cluster", "submit", "argo", "--plan", "x.json"]):
        for value in ("inf", "nan"):
            r = subprocess.run([sys.executable, "-m", "llmpack", *args, "--max-cost", value], capture_output=True,
                               text=True, timeout=60)
            assert r.returncode == 2 and r.stderr.strip().endswith(f"{value}: not a finite amount of USD"), r.stderr


def _row(gpu_type: str, cost: float, *, chosen: bool) -> dict:
    return {"path": "argo", "gpu_type": gpu_type, "capacity": "on-demand", "estimated": True, "chosen": chosen,
            "times_s": {}, "nodes": 1, "gpus": 1, "cost_usd": {"total": {"value": cost, "ci": [cost / 2, cost]}}}


def test_max_cost_checks_the_gpu_type_the_submitted_file_asks_for(tmp_path: Path) -> None:
    """F1: without --gpu-type, --max-cost checked the plan's chosen row (a cheap H200 here) while the committed
    Workflow asks for an H100 the plan prices at $90: a run over budget went out. The row is now the file's type."""
    import json

    from click.testing import CliRunner

    from llmpack.cli import main

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"options": [_row("nvidia-h200", 3.0, chosen=True),
                                            _row("nvidia-h100-80gb", 90.0, chosen=False)], "history_runs": 3}))
    # Port 9 answers nothing: a run the gate let through fails later, on the connection, not in the gate's line.
    args = ["cluster", "submit", "argo", "--host", "http://127.0.0.1:9", "--plan", str(plan), "--max-cost", "10"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert res.output.strip() == ("llmpack: error: --max-cost 10: the estimate for argo nvidia-h100-80gb on-demand is "
                                  "up to $90.00 a run ($90.00, 95% interval upper bound); not submitted"), res.output
    res = CliRunner().invoke(main, ["compile", "--gpu-type", "nvidia-h200", "--out", str(tmp_path / "h200")])
    assert res.exit_code == 0, res.output  # a Workflow compiled for the H200
    res = CliRunner().invoke(main, [*args, "--workflow", str(tmp_path / "h200/argo_workflows/finetune.yaml")])
    assert "Argo Server at http://127.0.0.1:9 is unreachable" in res.output, res.output  # the H200's $3 passed the gate


def test_max_steps_is_bounded() -> None:
    """F4: `--max-steps 10**23` was taken (a run that never ends); now one line, exit 2, on run and submit."""
    for args in (["run"], ["cluster", "submit", "argo", "--host", "http://127.0.0.1:9"]):
        r = subprocess.run([sys.executable, "-m", "llmpack", *args, "--max-steps", str(10**23)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "at most 10,000,000" in r.stderr.strip().splitlines()[-1], r.stderr
