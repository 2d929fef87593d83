"""The task metric in what the user reads: ``llmpack run``'s last line and the report's section."""

from __future__ import annotations

from pathlib import Path

from llmpack.report import task, write_report
from llmpack.ui.outcome import outcome_line
from tests.synthetic_runs import runs as synthetic_runs


def test_the_outcome_line_says_base_to_tuned_exact_match_and_the_gate() -> None:
    metrics = {"base_exact_match": 0.0, "tuned_exact_match": 0.17, "task_rows": 200.0, "gated_by_exact_match": 1.0,
               "eval_loss": 0.9, "base_eval_loss": 5.6}
    assert outcome_line({"metrics": metrics}) == \
        "outcome: exact match base 0.0% -> tuned 17.0% on 200 unseen prompts (gate: exact match)"
    # a record from before task evaluation: the loss, as it was gated
    assert (outcome_line({"metrics": {"eval_loss": 0.9, "base_eval_loss": 5.6}})
            == "outcome: eval loss base 5.600 -> tuned 0.900")
    assert outcome_line({"metrics": {"total_s": 3.0}}) is None  # failed before evaluate


def test_the_report_shows_each_path_base_to_tuned() -> None:
    runs = synthetic_runs(n=2, paths=("direct", "kfp"))
    runs[-1]["metrics"] = {**runs[-1]["metrics"], "tuned_exact_match": 0.2}  # one kfp run differs: shown as a spread
    lines = dict(task.task_lines(runs))
    assert lines["direct"].startswith("exact match 0.0% -> 17.0% (normalised 0.0% -> 17.0%); tuned by task: add 0.0%, "
                                      "reverse 45.2%; 200 unseen prompts; gate: exact match; 2 runs")
    assert lines["kfp"].startswith("exact match 0.0% -> 17.0%-20.0%")
    assert "## Does the tuned model do the task?" in "\n".join(task.markdown(runs))
    assert "exact match 0.0% -&gt; 17.0%" in task.html_section(runs, lambda o: o or "")
    assert task.task_lines([{**r, "metrics": {"eval_loss": 1.0}} for r in runs]) == []  # nothing scored: no section


def test_the_written_report_carries_the_task_section(tmp_path: Path) -> None:
    from llmpack.compare.comparison import comparison

    result = comparison("rg-synthetic", ["direct", "kfp", "argo", "mlflow"], synthetic_runs(n=3))
    out = write_report(result, tmp_path / "rep")
    assert "Does the tuned model do the task?" in (out / "report.md").read_text()
    assert "exact match 0.0% -&gt; 17.0%" in (out / "report.html").read_text()


def test_the_report_shows_the_registry_decision_the_run_carries() -> None:
    runs = synthetic_runs(n=1, paths=("direct", "kfp"))
    runs[0]["tags"] = {**runs[0].get("tags", {}), task.PROMOTION_TAG: "version 3 -> champion (beat v2: 0.9 < 1.1)"}
    lines = dict(task.task_lines(runs))
    assert lines["direct"].endswith("; registry: version 3 -> champion (beat v2: 0.9 < 1.1)")
    assert "registry:" not in lines["kfp"]  # a compare round registers nothing: no decision to show
