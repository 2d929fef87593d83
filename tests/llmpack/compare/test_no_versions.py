"""``llmpack compare`` registers no model version (docs/serving.md): every round it runs, through the command's own
runner too (its live status line), has ``register_version=False`` (issue 48: the command's rounds did register)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmpack.compare.plan import ComparePlan
from llmpack.compare.rounds import begin
from llmpack.run.local import RunOptions


def test_every_round_of_a_compare_registers_no_version(tmp_path: Path) -> None:
    got: list[RunOptions] = []

    def run_one(o: RunOptions, label: str, **kw: Any) -> dict[str, Any]:
        got.append(o)
        return {"label": label, **kw}

    opts = RunOptions(backend="direct", output_dir=tmp_path)
    assert opts.register_version  # a plain `llmpack run` registers
    _, group, run = begin(opts, ComparePlan(backends=("direct",)), "default", None, run_one)
    assert run(opts, "direct", tags={"a": "b"}) == {"label": "direct", "tags": {"a": "b"}}
    assert group and [o.register_version for o in got] == [False]
