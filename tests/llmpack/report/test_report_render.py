"""The report and the terminal on synthetic runs: the first glance tells the truth, and nothing is cut off."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from llmpack.compare.comparison import comparison
from llmpack.compare.table import compare_table
from llmpack.report import chart_timeline, cost_split, gpu_steps, write_report
from llmpack.ui.display import library_logs_to
from tests.synthetic_runs import runs

PATHS = ["direct", "kfp", "argo", "mlflow"]


def _result(**kw: object) -> dict:
    return comparison("rg-synthetic", PATHS, runs({"argo": 3.0}, **kw))


def test_report_html_states_price_source_gpu_mode_and_the_verdicts(tmp_path: Path) -> None:
    out = write_report(_result(), tmp_path / "rep", {"kfp": 450.0, "argo": 120.0})
    page = (out / "report.html").read_text()
    for fact in ("6.88/GPU-hour", "shipped@2025-01-01", "nvidia-h100-80gb", "mode <b>local</b>", "cost is a projection",
                 "baseline <b>direct</b>"):
        assert fact in page, fact
    assert "argo is slower than direct on time to first step by" in page  # the summary sentence
    assert "kfp ≈ direct on time to first step" in page and "mlflow ≈ direct on time to first step" in page
    assert page.count("n=5") >= 16 and "95% CI [" in page  # every card row: value, Δ with CI, n
    assert "What the money went on" in page and "least pipeline overhead" not in page


def test_gang_and_queue_waits_appear_only_when_measured(tmp_path: Path) -> None:
    """A multi-node cluster run's gang and Kueue waits get their own table in report.html and report.md."""
    plain = write_report(_result(), tmp_path / "plain")
    assert "Gang and queue" not in (plain / "report.html").read_text() + (plain / "report.md").read_text()
    rs = runs({"argo": 3.0})
    for i, r in enumerate(rs):
        if r["orchestrator"] in ("kfp", "argo"):
            r["metrics"].update(gang_ready_s=40.0 + i, quota_wait_s=12.5, admission_checks_s=None)
    out = write_report(comparison("rg-synthetic", PATHS, rs), tmp_path / "gang")
    md = (out / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| Kueue quota wait"))
    assert row.count("12.5 / 12.5 (5)") == 2 and row.count("| -") == 2, row  # kfp, argo measured; direct, mlflow not
    assert "admission checks" not in md  # measured by no path: no row
    page = (out / "report.html").read_text()
    assert "<h2>Gang and queue</h2>" in page and "gang ready (last TrainJob node pod started, from submit)" in page


def test_summary_names_a_spinup_difference_that_time_to_first_step_hides() -> None:
    """A delay planted before the finetune start, with the work after it noisy: spin-up shows it, ttfs may not."""
    from llmpack.report import summary_sentence

    planted = runs({"argo": 3.0})
    noise = iter([-9.0, 7.0, 0.0, 11.0, -4.0, 6.0, -8.0, 3.0, 9.0, -6.0] * 4)
    for r in planted:  # bury time to first step in noise (seconds, like step imports under load), kept >= 0:
        r["metrics"]["time_to_first_step_s"] += 10.0 + next(noise)  # a negative one is excluded (report/screen.py)
    text = summary_sentence(comparison("rg-synthetic", ["direct", "argo"], planted), None)
    assert "Undecided (more rounds would decide): time to first step for argo" in text, text
    assert "argo is slower than direct on spin-up by 2.87 s" in text, text


def test_cost_splits_into_compute_and_overhead_that_add_up() -> None:
    run = runs(n=1, paths=("kfp",))[0]
    split = cost_split(run, gpu_steps())
    assert split is not None and split["compute_usd"] > 0 and split["overhead_usd"] > 0
    assert split["compute_usd"] + split["overhead_usd"] == pytest.approx(run["metrics"]["cost_usd"])


def _legend_labels(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    import matplotlib.axes

    labels: list[str] = []
    original = matplotlib.axes.Axes.legend

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        labels.extend(h.get_label() for h in kwargs.get("handles", []))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "legend", spy)
    return labels


def test_timeline_names_every_step_and_lists_only_phases_that_occur(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    labels = _legend_labels(monkeypatch)
    chart_timeline(runs(n=1, paths=("direct",)), tmp_path / "t.png")
    # the step legend, in run order
    assert labels[:5] == ["prepare_data", "tokenize", "finetune", "evaluate", "register"]
    assert "to first step" in labels and any(lbl.startswith("working") for lbl in labels)
    assert "queue" not in labels and "provision" not in labels and "pull + container start" not in labels


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_boxes_only_from_three_runs_dots_always(n: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below n=3 a box collapses onto its dots and reads as an error bar: dots only."""
    import matplotlib.axes

    from llmpack.report import chart_boxes

    boxed: list[int] = []
    dots: list[int] = []
    box, scatter = matplotlib.axes.Axes.boxplot, matplotlib.axes.Axes.scatter
    monkeypatch.setattr(matplotlib.axes.Axes, "boxplot",
                        lambda self, data, **kw: boxed.append(len(data)) or box(self, data, **kw))
    monkeypatch.setattr(matplotlib.axes.Axes, "scatter",
                        lambda self, x, y, **kw: dots.append(len(y)) or scatter(self, x, y, **kw))
    chart_boxes(runs(n=n), tmp_path / "b.png")
    assert boxed == ([4, 4] if n >= 3 else [])  # both panels, every path
    assert dots == [n] * 8


def test_cost_chart_legend_is_never_empty_with_retried_runs(tmp_path: Path) -> None:
    """A run with no cost split (a retried attempt that left no finish) drawn first made an empty legend."""
    import warnings

    from llmpack.report import chart_cost

    rs = runs(n=2)
    splits: dict = {r["pipeline_run"]: cost_split(r, gpu_steps()) for r in rs}
    cheapest = min(rs, key=lambda r: r["metrics"]["cost_usd"])
    splits[cheapest["pipeline_run"]] = None
    cheapest["retried_attempts"] = [{"step": "finetune", "attempt": 0, "billed_s": None, "gpu_hours": 0.0,
                                     "cost_usd": 0.0}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chart_cost(rs, tmp_path / "c.png", splits)


def test_report_tables_do_not_wrap_and_money_has_one_format(tmp_path: Path) -> None:
    out = write_report(comparison("rg-synthetic", PATHS, runs({"argo": 3.0}, n=2)), tmp_path / "rep")
    page, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    assert "white-space:nowrap" in page.split("table.num td,table.num th")[1].split("}")[0]
    assert "tokens/s" in page and "900 / 900" in page and "900.000" not in page  # 3 significant figures
    assert "$0.0" in page and "0.047" not in page.replace("$0.047", "")  # dollars always with their sign, one format
    from llmpack.report.render import COST_FORMULA

    assert COST_FORMULA in md and html_escape(COST_FORMULA) in page  # the cost formula in both
    assert "billed non-compute" in page and "pipeline overhead" in page and ">overhead s<" not in page


def html_escape(text: str) -> str:
    import html

    return html.escape(text)


def test_every_term_the_report_uses_is_defined_from_the_glossary(tmp_path: Path) -> None:
    from llmpack.report.render import REPORT_TERMS
    from llmpack.ui import glossary

    out = write_report(_result(), tmp_path / "rep")
    page, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    for key in REPORT_TERMS:
        t = glossary.term(key)
        assert f"**{t.name}**: {t.short}" in md, key
        assert f"<dt>{html_escape(t.name)}</dt><dd>{html_escape(t.short)}</dd>" in page, key


def _all_failed(gpu: bool) -> dict:
    """Every run of two paths failed in a step, as a real failed run records it: no figures but total."""
    rs = []
    for r in runs(n=2, paths=("direct", "argo")):
        tags = r["tags"] if gpu else {**r["tags"], "llmpack.gpu_count": "0", "llmpack.gpu_type": "none"}
        rs.append({**r, "status": "failed", "error": "step 'strict-check' failed: RuntimeError: too many rows",
                   "metrics": {"total_s": 1.8, "pipeline_overhead_s": 0.7}, "tags": tags})
    return comparison("rg-failed", ["direct", "argo"], rs)


@pytest.mark.parametrize("gpu", [False, True])
def test_a_report_with_no_run_succeeded_defines_no_term_it_does_not_show(tmp_path: Path, gpu: bool) -> None:
    """newcomer5: every run failed, and "Terms" still defined Δ, CI, baseline and p50 / p90, which the page (its
    failures and a timeline) never shows. Now only the cost terms of its money section, if any; else no section."""
    out = write_report(_all_failed(gpu), tmp_path / "rep")
    page, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    assert "step 'strict-check' failed" in md and "## Failed runs" in md
    for name in ("p50 / p90", "**n**", "**baseline**", "**Δ**", "**CI**", "**total**", "**step compute**"):
        assert name not in md, (name, md)
    assert ("<h2>Terms</h2>" in page) == gpu and ("## Terms" in md) == gpu
    if gpu:
        assert "- **GPU compute**:" in md and "<dt>GPU compute</dt>" in page  # the cost formula's words
    assert md.endswith("\n") and not md.endswith("\n\n")


@pytest.mark.parametrize("kind", ["planted", "one run", "failed path"])
def test_the_compare_table_fits_80_columns_without_truncation(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    if kind == "planted":
        result = _result()
    elif kind == "one run":
        result = comparison("rg-synthetic", PATHS, runs({"argo": 3.0}, n=1))
    else:
        rs = runs(n=2)
        for r in rs:
            if r["orchestrator"] == "mlflow":
                r["status"], r["error"] = "failed", "finetune: exited 1 with a rather long error message that wraps"
        result = comparison("rg-synthetic", PATHS, rs)
    buf = io.StringIO()
    console = Console(width=80, file=buf, force_terminal=False)
    compare_table(result, console=console)
    text = buf.getvalue()
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80, text
    for orch in PATHS:
        assert orch in text
    if kind == "planted":
        assert "8.01 s ▲" in text or "▲" in text


def test_library_info_lines_and_warnings_go_to_the_log_file(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    import warnings

    log = tmp_path / "runs" / "llmpack-client.log"
    with library_logs_to(log):
        logging.getLogger("mlflow.store.db.utils").info("Creating initial MLflow database tables...")
        warnings.warn("a library deprecation", DeprecationWarning, stacklevel=1)
    captured = capfd.readouterr()
    assert "Creating initial" not in captured.err + captured.out and "deprecation" not in captured.err
    text = log.read_text()
    assert "Creating initial MLflow database tables" in text and "a library deprecation" in text


@pytest.mark.skipif(not os.environ.get("LLMPACK_SCREENSHOT"), reason="make report-screenshot (needs Chromium)")
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    """Not in CI (Chromium is ~300 MB); `make report-screenshot` runs it."""
    from PIL import Image

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    assert browser, "install Chromium (apt-get install -y chromium)"
    out = write_report(_result(), tmp_path / "rep", {"kfp": 450.0, "argo": 120.0})
    png = Path(os.environ.get("LLMPACK_SCREENSHOT_OUT", tmp_path / "report.png"))
    png.parent.mkdir(parents=True, exist_ok=True)  # Chromium writes no screenshot into a missing folder
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
                    "--window-size=1280,2000", (out / "report.html").as_uri()], check=True, capture_output=True,
                   timeout=120)
    img = Image.open(png).convert("L")
    lo, hi = img.getextrema()
    assert hi - lo > 100, "the screenshot is blank"
    colours = len(set(img.resize((128, 200)).getdata()))
    assert colours > 20, "the screenshot is nearly uniform"


def test_a_node_billed_run_keeps_its_own_cost_split() -> None:
    """A cluster run billed by node carries cost_compute_usd / cost_overhead_usd: the report uses them."""
    run = runs(n=1, paths=("kfp",))[0]
    run["metrics"].update(cost_usd=11.08, cost_compute_usd=0.04, cost_overhead_usd=11.04)
    assert cost_split(run, gpu_steps()) == {"compute_usd": 0.04, "overhead_usd": 11.04}


def test_until_decided_cards_say_not_judged_for_one_run_headlines(tmp_path: Path) -> None:
    """Total and cost from one whole run per path read "not judged" on the cards, as in the sentence."""
    from llmpack.compare.comparison import HEADLINES

    result = _result()
    result["design"] = {"max_rounds": 7, "first_look": 3}
    one_run = [h.metric for h in HEADLINES if not h.startup]
    for metric in one_run:
        for orch, e in result["verdicts"][metric].items():
            if orch != "direct":
                e.update(verdict="undecided", n=1)
    page = (write_report(result, tmp_path / "rep", {}) / "report.html").read_text()
    assert page.count(">not judged<") == len(one_run) * (len(PATHS) - 1)
    assert ">undecided<" not in page


def test_the_report_carries_every_run_as_an_otlp_trace(tmp_path: Path) -> None:
    """traces.otlp.json beside report.html: one trace per run, its spans at the run's own event times."""
    from components.record.trace import from_otlp, trace_id_of

    result = _result()
    body = json.loads((write_report(result, tmp_path / "rep", {}) / "traces.otlp.json").read_text())
    spans = from_otlp(body)
    assert {s["traceId"] for s in spans} == {trace_id_of(r["pipeline_run"]) for r in result["runs"]}
    run = result["runs"][0]
    training = [s for s in spans if s["traceId"] == trace_id_of(run["pipeline_run"]) and s["name"] == "training"]
    assert ([int(s["startTimeUnixNano"]) / 1e9 for s in training]
            == pytest.approx([run["events"]["finetune"]["first_step"]]))


def _checkpointed_runs() -> tuple[list[dict], list[dict]]:
    """Synthetic runs, three of argo's with a measured checkpoint write: fits, does not fit, no grace compiled."""
    rs = runs({"argo": 3.0})
    argo = [r for r in rs if r["orchestrator"] == "argo"]
    argo[0]["metrics"].update(checkpoint_save_s=12.0, grace_period_s=150.0)
    argo[1]["metrics"].update(checkpoint_save_s=40.0, grace_period_s=15.0)
    argo[2]["metrics"].update(checkpoint_save_s=3.5)
    return rs, argo


def test_the_measured_checkpoint_write_is_shown_against_the_grace_period() -> None:
    """Preemption: finetune's longest write (``checkpoint_save_s``) beside its pod's grace period."""
    from llmpack.report import markdown, report_facts

    plain = _result()
    assert "Checkpoint write" not in markdown(plain, report_facts(plain), "", None, {})
    rs, argo = _checkpointed_runs()
    result = comparison("rg-synthetic", PATHS, rs)
    md = markdown(result, report_facts(result), "", None, {})
    section = md.split("## Checkpoint write vs grace period\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section == [
        f"- **argo** {argo[0]['pipeline_run']}: longest checkpoint write 12.00 s, fits the 150 s grace period",
        f"- **argo** {argo[1]['pipeline_run']}: longest checkpoint write 40.00 s, does NOT fit the 15 s grace period: "
        "a preempted pod loses the steps since its last checkpoint \\(raise --grace-period, or bound them with "
        "--checkpoint-minutes\\)",
        f"- **argo** {argo[2]['pipeline_run']}: longest checkpoint write 3.50 s, no grace period compiled in "
        "\\(Kubernetes' default: 30 s\\)"], section  # escaped: the text holds a store's names


@pytest.mark.slow  # a whole report, charts and all
def test_the_checkpoint_section_is_in_the_written_report(tmp_path: Path) -> None:
    out = write_report(comparison("rg-synthetic", PATHS, _checkpointed_runs()[0]), tmp_path / "ckpt")
    page = (out / "report.html").read_text()
    assert "<h2>Checkpoint write vs grace period</h2>" in page and "does NOT fit the 15 s grace period" in page
    assert "## Checkpoint write vs grace period" in (out / "report.md").read_text()


def test_the_report_counts_n_as_compare_does_start_up_rounds_included(tmp_path: Path) -> None:
    """Six rounds, five of them start-up rounds: compare's table says n=6 (spin-up has six figures); the report's
    table said n=1 (the one whole run behind total)."""
    rs = runs(n=6, paths=("direct", "argo"))
    for r in rs[:10]:  # the first five rounds of each path: start-up rounds
        r["startup"] = True
    result = comparison("rg-synthetic", ["direct", "argo"], rs)
    assert result["summary"]["direct"]["total_s"]["n"] == 1 and result["summary"]["direct"]["spinup_s"]["n"] == 6
    md_text = (write_report(result, tmp_path / "rep") / "report.md").read_text()
    rows = [line for line in md_text.splitlines() if line.startswith(("| direct | ", "| argo | "))]
    assert rows and all(line.split(" | ")[1] == "6" for line in rows), rows
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<td>6</td>" in page and "<td>1</td>" not in page


def test_retried_attempts_say_billed_only_when_one_held_a_gpu() -> None:
    """Trial 7: "Every attempt is billed" was printed over retries of a step that held no GPU."""
    from llmpack.report.facts import retry_note

    rs = runs(n=1)
    rs[0]["retried_attempts"] = [{"step": "boom", "attempt": 0, "billed_s": 1.5, "gpu_hours": 0.0, "cost_usd": 0.0}]
    assert retry_note(rs) == "These attempts held no GPU: they are in the runs' times, not in any bill."
    rs[0]["retried_attempts"][0]["gpu_hours"] = 0.01
    assert retry_note(rs).startswith("Every attempt is billed")


def test_the_timeline_draws_a_retried_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trial 7: a retried step's first attempt was an unexplained gap; it is a faded, hatched band now."""
    from matplotlib.axes import Axes

    rs = runs(n=1)
    start = min(rs[0]["events"]["finetune"].values())
    rs[0]["retried_attempts"] = [{"step": "finetune", "attempt": 0, "billed_s": 1.0, "gpu_hours": 0.0,
                                  "cost_usd": 0.0, "started_at": start - 1.5, "ended_at": start - 0.5}]
    hatched: list[tuple[float, float]] = []
    barh = Axes.barh
    monkeypatch.setattr(Axes, "barh", lambda self, y, w, **kw: (kw.get("hatch") == "//" and hatched.append(
        (kw["left"], w))) or barh(self, y, w, **kw))
    chart_timeline(rs, tmp_path / "t.png")
    t0 = rs[0]["submitted_at"]
    assert hatched == [(pytest.approx(start - 1.5 - t0), pytest.approx(1.0))]
