"""Issue 46, items 8 and 14: a store's texts are shown inert in report.md, report.html and the terminal,
and a store's impossible values (a future time, NaN/inf, a negative duration) are excluded with a
reason: never a traceback, never in a verdict."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmpack.compare import comparison as cmp
from llmpack.report import facts, preemption, write_report
from llmpack.report.render import markdown
from llmpack.report.task import PROMOTION_TAG

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from synthetic_runs import run  # noqa: E402

OSC52 = "\x1b]52;c;ZWNobyBvd25lZA==\x07"  # writes the terminal's clipboard
CSI_C1 = "\x9b31m"  # the one-byte CSI of C1
BIDI = "\u202eevil\u202c\u2066"
IMG = "<img src=x onerror=alert(1)>"
HOSTILE = f"{IMG} {OSC52} {CSI_C1} {BIDI} [x](javascript:y) ![i](http://e/) | *b* _i_ `c` \\ # h"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u202c", "\u2066")


def _runs() -> list[dict[str, Any]]:
    runs = [run("kfp", i, ttfs=30 + i, spinup=10, total=100 + i) for i in range(3)]
    runs += [run("argo", i, ttfs=32 + i, spinup=11, total=101 + i) for i in range(3)]
    for r in runs:
        r["tags"][PROMOTION_TAG] = HOSTILE  # the register step's decision, as a planted run would write it
    failed = run("argo", 7, ttfs=30, spinup=10, total=100, status="failed")
    failed["error"] = HOSTILE
    return [*runs, failed]


def _pages(runs: list[dict[str, Any]], tmp_path: Path) -> tuple[str, str]:
    result = cmp.comparison("rg-hostile", ["kfp", "argo"], runs)
    out = write_report(result, tmp_path / "report")
    return (out / "report.md").read_text(encoding="utf-8"), (out / "report.html").read_text(encoding="utf-8")


def test_store_texts_are_inert_in_report_md_and_html(tmp_path: Path) -> None:
    md, page = _pages(_runs(), tmp_path)
    for text in (md, page):
        assert "<img src=x" not in text and "onerror=alert(1)>" not in text
        assert not [c for c in RAW if c in text], [hex(ord(c)) for c in RAW if c in text]
        assert "onerror" in text  # shown, as its characters
    assert "registry: &lt;img src=x onerror=alert\\(1\\)&gt;" in md  # the promotion tag, escaped
    assert "\\\\x1b\\]52;c;" in md and "\\\\u202eevil" in md  # the escape bytes shown, visibly
    assert "\\[x\\]\\(javascript:y\\)" in md and "\\!\\[i\\]" in md and "\\| \\*b\\* \\_i\\_ \\`c\\`" in md
    assert "](" not in md.split("## Charts")[0]  # no link or image before the report's own charts
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "\\x1b]52;c;" in page


def test_the_one_helper_shows_every_controlling_character() -> None:
    from llmpack.report import escape

    for c in [*map(chr, range(0x20)), "\x7f", *map(chr, range(0x80, 0xA0)), "\u200e", "\u2028", "\u202a", "\u202e",
              "\u2066", "\u2069", "\ufeff"]:
        for shown in (escape.inert(f"a{c}b"), escape.md(f"a{c}b"), escape.html_text(f"a{c}b"),
                      escape.terminal(f"a{c}b")):
            assert c not in shown and shown.startswith("a") and shown.endswith("b"), (hex(ord(c)), shown)
    assert escape.md("<b>|[x](y)!*_`\\#") == "&lt;b&gt;\\|\\[x\\]\\(y\\)\\!\\*\\_\\`\\\\\\#"
    assert escape.html_text('"<a>') == "&quot;&lt;a&gt;"
    assert escape.terminal("[bold red]x") == "\\[bold red]x"  # rich markup shown, not obeyed


def test_terminal_lines_of_the_report_carry_no_escape_bytes() -> None:
    hostile = run("argo", 1, ttfs=30, spinup=10, total=100)
    hostile["orchestrator"] = f"argo{OSC52}{CSI_C1}"
    hostile["metrics"].update(preemptions=1, time_to_recover_s=9.0, preemption_waste_gpu_hours=0.1)
    lines = preemption.terminal_lines({"runs": [hostile]})
    assert lines and not [c for c in RAW for line in lines if c in line], lines


# --------------------------------------------------------------------------- item 14: impossible values

PLANTS = {
    "future submitted_at": lambda r: r.update(submitted_at=time.time() + 10 * 365 * 86400),
    "NaN total": lambda r: r["metrics"].update(total_s=math.nan),
    "inf cost": lambda r: r["metrics"].update(cost_usd=math.inf),
    "negative durations": lambda r: r["metrics"].update(total_s=-5000.0, time_to_first_step_s=-4000.0),
    "NaN submitted_at": lambda r: r.update(submitted_at=math.nan),
    "an event in the future": lambda r: r["events"]["finetune"].update(finished=time.time() + 86400 * 400),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_an_impossible_run_is_excluded_with_its_reason_never_a_traceback(plant: str, tmp_path: Path) -> None:
    runs = [run("kfp", i, ttfs=30 + i, spinup=10, total=100 + i) for i in range(3)]
    runs += [run("argo", i, ttfs=32 + i, spinup=11, total=101 + i) for i in range(3)]
    planted = run("argo", 9, ttfs=1, spinup=1, total=2)  # would pull argo's medians down, were it counted
    PLANTS[plant](planted)
    result = cmp.comparison("rg-planted", ["kfp", "argo"], [*runs, planted])
    assert [e["pipeline_run"] for e in result["excluded"]] == ["argo-run-009"]
    assert planted not in result["runs"]
    assert result["summary"]["argo"]["total_s"]["n"] == 3  # not in the statistics
    assert all(e["n"] == 3 for per_path in result["verdicts"].values() for e in per_path.values()
               if "n" in e), result["verdicts"]  # nor in any verdict
    out = write_report(result, tmp_path / "report")
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "## Excluded runs" in md and "argo-run-009" in md.split("## Excluded runs")[1]
    assert "<h2>Excluded runs</h2>" in (out / "report.html").read_text(encoding="utf-8")


def test_a_submitted_at_that_is_not_a_number_is_excluded_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.record import tracking

    def record(run_id: str, submitted_at: str) -> SimpleNamespace:
        tags = {"llmpack.run_group": "rg-x", "llmpack.pipeline_run": run_id, "llmpack.orchestrator": "kfp",
                "llmpack.mode": "local", "llmpack.status": "succeeded"}
        return SimpleNamespace(data=SimpleNamespace(tags=tags, metrics={"total_s": 100.0},
                                                    params={"submitted_at": submitted_at}),
                               info=SimpleNamespace(run_id=run_id, status="FINISHED", start_time=1_700_000_000_000))

    mc = SimpleNamespace(search_runs=lambda *a, **k: [record("kfp-1", "1700000000"), record("kfp-2", "soon")],
                         tracking_uri="sqlite:///x.db")
    monkeypatch.setattr(tracking, "experiment_id", lambda *a, **k: "0")
    runs = facts.runs_from_mlflow(mc, "rg-x")
    result = cmp.comparison("rg-x", ["kfp"], runs)
    assert [e["pipeline_run"] for e in result["excluded"]] == ["kfp-2"]
    assert "submitted_at nan is not a time" in result["excluded"][0]["reason"]


def test_markdown_and_html_of_an_excluded_run_escape_its_names() -> None:
    planted = run("argo", 9, ttfs=1, spinup=1, total=2)
    planted["pipeline_run"], planted["metrics"]["total_s"] = f"x{OSC52}{IMG}", math.nan
    result = cmp.comparison("rg-x", ["kfp", "argo"], [run("kfp", 1, ttfs=30, spinup=10, total=100),
                                                      run("argo", 1, ttfs=30, spinup=10, total=100), planted])
    md = markdown(result, facts.report_facts(result), "", None, {})
    assert "<img" not in md and "\x1b" not in md and "metric total\\_s is nan" in md
    assert "&lt;img" in md.split("## Excluded runs")[1]
