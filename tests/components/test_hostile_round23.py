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
