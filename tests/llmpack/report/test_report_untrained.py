"""The report of a pipeline of one's own without training or GPU, and of a compare where every run failed:
it shows what was measured and names what was not, never an empty column, card, chart or "$unknown"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmpack.compare.comparison import comparison
from llmpack.compare.recommend import recommend
from llmpack.report import write_report
from tests.synthetic_runs import run

UNTRAINED_METRICS = ("time_to_first_step_s", "cost_usd", "tokens_per_s", "usd_per_1m_tokens", "goodput", "train_s",
                     "gpu_hours")


def _untrained(orch: str, i: int, spinup: float, *, status: str = "succeeded") -> dict[str, Any]:
    """A run of a two-step pipeline without finetune and without GPU, as ``llmpack run --pipeline`` records it."""
    r = run(orch, i, ttfs=spinup, spinup=spinup, total=spinup + 0.5, status=status)
    t0 = r["submitted_at"]
    r["events"] = {"prepare_data": {"process_started": t0 + spinup, "finished": t0 + spinup + 0.2},
                   "count_rows": {"process_started": t0 + spinup + 0.25, "finished": t0 + spinup + 0.45}}
    for k in UNTRAINED_METRICS:
        r["metrics"].pop(k)
    r["tags"] = {"llmpack.gpu_count": "0", "llmpack.gpu_type": "none", "llmpack.price_per_gpu_hour": "unknown",
                 "llmpack.price_source": "unknown"}
    return r


def _runs(status: str = "succeeded") -> list[dict[str, Any]]:
    return [_untrained(o, 2 * i + j, (0.05 if o == "direct" else 0.7) + 0.01 * i, status=status)
            for i in range(3) for j, o in enumerate(("direct", "kfp"))]


def test_a_pipeline_without_training_or_gpu_reports_only_what_it_measured(tmp_path: Path) -> None:
    out = write_report(comparison("rg-untrained", ["direct", "kfp"], _runs()), tmp_path / "rep")
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    for text in (md, page):
        assert "$unknown" not in text and "0x none" not in text and "0&times; none" not in text
        assert "GPU: none" in text or "GPU <b>none</b>" in text
        assert "price: n/a" in text or "price <b>n/a</b>" in text  # the glossary's one word (issue 52)
        assert "Not measured by these runs: time to first step, cost per run" in text
        assert "no finetune step" in text and "spin-up (no finetune)" in text
        assert "first optimizer step" not in text and "What the money went on" not in text
        assert "cost is a projection" not in text and "Break-even" not in text
    header = next(line for line in md.splitlines() if line.startswith("| orchestrator"))
    assert header == "| orchestrator | n | spin-up (s) | total (s) | pipeline overhead (s) |"
    assert "time to first step not measured" not in md  # not listed as "not judged" either
    assert not (out / "cost_per_run.png").exists() and "cost_per_run" not in md + page
    assert "![spin-up](spinup_boxplot.png)" in md


def test_a_compare_where_every_run_failed_shows_the_failures_not_empty_verdicts(tmp_path: Path) -> None:
    result = comparison("rg-failed", ["direct", "kfp"], _runs(status="failed"))
    assert recommend(result).text.startswith("no recommendation: every run of every path failed")
    out = write_report(result, tmp_path / "rep")
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    for text in (md, page):
        assert "Verdicts against the baseline" not in text and "Numbers" not in text and "Not judged" not in text
        assert "Failed runs" in text and "every run of every path failed" in text
    assert not (out / "spinup_boxplot.png").exists() and "| orchestrator" not in md


def test_a_run_group_of_one_path_reports_its_medians_and_no_empty_verdicts(tmp_path: Path) -> None:
    """The fifth trial: `llmpack report` on one `llmpack run`'s group said "against direct: ." above an empty
    Verdicts section, and "--repeats 5 judges them" when nothing could be judged."""
    runs = [r for r in _runs() if r["orchestrator"] == "direct"]
    result = comparison("rg-one", ["direct"], runs)
    assert recommend(result).text.startswith("no recommendation: one path only (direct)")
    out = write_report(result, tmp_path / "rep")
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    for text in (md, page):
        assert "only direct ran in this run group" in text and "against direct: ." not in text
        assert "Verdicts against the baseline" not in text and "judges them" not in text and "Δ" not in text
    assert "| direct | 3 |" in md


def test_compare_refuses_one_path_without_variants() -> None:
    from click.testing import CliRunner

    from llmpack.cli import main

    r = CliRunner().invoke(main, ["compare", "--backends", "direct", "--repeats", "2"])
    assert r.exit_code == 2 and "a compare needs two paths" in r.output


def test_the_report_shows_the_metrics_ones_own_steps_log(tmp_path: Path) -> None:
    """The fifth trial: `mean_prompt_words` reached MLflow and `--json` but neither report.md nor report.html."""
    from llmpack.report.own_metrics import from_mlflow_metrics

    runs = _runs()
    for i, r in enumerate(runs):
        r["step_metrics"] = {"count-rows": {"mean_prompt_words": 10.0 + i}, "prepare-data": {"rows": 40.0}}
    out = write_report(comparison("rg-own", ["direct", "kfp"], runs), tmp_path / "rep")
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "| count-rows.mean\\_prompt\\_words | 12.0 (3) | 13.0 (3) |" in md, md
    assert "count-rows.mean_prompt_words" in page and "prepare-data.rows" not in md + page  # shipped steps' aside
    assert from_mlflow_metrics({"metric.count-rows.n": 3.0, "total_s": 1.0, "event.x.finished": 2.0}) == \
        {"count-rows": {"n": 3.0}}


def test_the_timeline_marks_the_step_that_failed() -> None:
    """The fifth trial: in an all-failed compare's timeline the failing step looked like a successful one."""
    from llmpack.report.charts import failed_step

    assert failed_step({"status": "failed", "failed_step": "boom"}) == "boom"
    assert failed_step({"status": "failed", "error": "step 'strict-check' failed: ValueError: x"}) == "strict-check"
    assert failed_step({"status": "succeeded", "error": "step 'x' failed"}) is None
    assert failed_step({"status": "killed", "error": "the llmpack client died"}) is None


def test_a_retried_steps_own_metrics_are_its_last_attempts_and_step_failed_is_not_yours() -> None:
    """Trial 9: a step that succeeded on its retry showed `picky.step_failed 1.00` among "your steps' own metrics",
    and the rebuilt report named its metric `rows_checked.attempt1`."""
    from llmpack.report import own_metrics

    got = own_metrics.from_mlflow_metrics({"metric.picky.rows_checked": 10.0, "metric.picky.step_failed": 1.0,
                                           "metric.picky.rows_checked.attempt1": 36.0, "event.picky.finished": 5.0})
    assert got == {"picky": {"rows_checked": 36.0, "step_failed": 1.0}}
    runs = [{"status": "succeeded", "orchestrator": "direct", "fuse": "none", "step_metrics": got}]
    assert [key for key, _ in own_metrics.table(runs)[1]] == ["picky.rows_checked"]
