"""The comparison report: report.md, a self-contained report.html, report.json and PNG charts.

A report is built from run records (the ``llmpack run --json`` summaries, or the same rebuilt
from MLflow alone by :func:`runs_from_mlflow`, so cluster runs logged from anywhere can be
reported). Someone who opens the HTML sees which path reached training first and which cost
least from the headline and the charts, without reading a number.

Three rooms: :mod:`llmpack.report.facts` (what is computed from runs: rebuild from MLflow,
retries, economics), :mod:`llmpack.report.charts` (matplotlib) and :mod:`llmpack.report.render`
(markdown, HTML, JSON and the report directories). The names the CLI and display use are
re-exported here.
"""

from __future__ import annotations

from llmpack.report.charts import chart_boxes, chart_cost, chart_timeline
from llmpack.report.facts import (
    break_even,
    check_control_plane,
    cost_split,
    gpu_steps,
    parse_control_plane,
    report_facts,
    retried_attempts,
    retry_lines,
    runs_from_mlflow,
    summary_sentence,
)
from llmpack.report.render import html_page, markdown, write_report
from llmpack.report.target import check_report_parent, link_latest, new_report_dir

__all__ = [
    "break_even",
    "chart_boxes",
    "chart_cost",
    "chart_timeline",
    "check_control_plane",
    "check_report_parent",
    "cost_split",
    "gpu_steps",
    "html_page",
    "link_latest",
    "markdown",
    "new_report_dir",
    "parse_control_plane",
    "report_facts",
    "retried_attempts",
    "retry_lines",
    "runs_from_mlflow",
    "summary_sentence",
    "write_report",
]
