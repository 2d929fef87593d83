"""The words a user reads: tasks vs optimizer steps, plurals, Ctrl-C, piped lines, the glossary's terms."""

from __future__ import annotations

import io
import re
import threading

from rich.console import Console

from llmpack.ui.progress import INTERRUPTED_TEXT, LogLines, Snapshot, tasks_done


def test_pipeline_tasks_are_never_called_steps() -> None:
    """``finetune 0/60`` counts optimizer steps; the pipeline's own progress counts tasks."""
    from llmpack.cluster.compare.session import describe

    assert tasks_done(1) == "1 task done" and tasks_done(2) == "2 tasks done" and tasks_done(0) == "0 tasks done"
    rows = [{"step": "prepare-data", "pod": "a", "phase": "Succeeded", "created": 1.0},
            {"step": "tokenize", "pod": "b", "phase": "Succeeded", "created": 2.0},
            {"step": "finetune", "pod": "c", "phase": "Running", "created": 3.0, "container_started": 3.5}]
    assert describe(rows) == "finetune · running · 2 tasks done"


def test_after_ctrl_c_the_live_line_does_not_say_done() -> None:
    """A step stopped by the interrupt still writes ``finished``: that is not progress to show."""
    buf = io.StringIO()
    flag = threading.Event()
    lines = LogLines("kfp", Console(file=buf, width=200), interrupted=flag, clock=lambda: 0.0)
    lines.observe(Snapshot(text="finetune 3/60", done=2, running="finetune", train=None), 1.0)
    flag.set()
    lines.observe(Snapshot(text="finetune done", done=3, running=None, train=None), 2.0)
    lines.observe(Snapshot(text="evaluate · 3 tasks done", done=3, running="evaluate", train=None), 2.5)
    out = buf.getvalue()
    assert "finetune done" not in out and "evaluate" not in out and out.count(INTERRUPTED_TEXT) == 1


def _result(rounds: int) -> dict:
    from llmpack.compare.comparison import comparison
    from tests.synthetic_runs import runs

    result = comparison("rg-w", ["direct", "kfp", "argo"], runs({"argo": 3.0}, n=5, paths=("direct", "kfp", "argo")))
    result.update(design={"max_rounds": 5, "first_look": 3, "alpha": 0.05, "rho": 2.0}, rounds=rounds,
                  stopped="budget")
    return result


def test_plurals_and_piped_lines_without_trailing_spaces() -> None:
    from llmpack.compare.table import compare_table

    for rounds, word in ((1, "1 round ("), (5, "5 rounds (")):
        buf = io.StringIO()
        compare_table(_result(rounds), console=Console(file=buf, width=160, force_terminal=False))
        out = buf.getvalue()
        assert word in out and "1 rounds" not in out
        said = [line for line in out.splitlines() if " than direct" in line or "≈ direct" in line or
                line.startswith(("use ", "no recommendation", "  caveat", "  to decide"))]
        assert said and [line for line in said if line != line.rstrip()] == []


def test_eval_loss_and_base_loss_are_in_the_glossary() -> None:
    from llmpack.ui import glossary

    assert glossary.term("eval_loss").name == "eval loss" and glossary.term("base_loss").name == "base loss"
    assert glossary.term("not_judged").short


def _flags(help_text: str) -> set[str]:
    """The options a help text lists (each at the start of its line)."""
    return set(re.findall(r"^  (?:-\w, )?(--[\w-]+)", help_text, re.M))


def test_compare_help_is_local_and_cluster_compare_lists_the_cluster_options_under_their_heading() -> None:
    from click.testing import CliRunner

    from llmpack.cli import main

    local = CliRunner().invoke(main, ["compare", "--help"], prog_name="llmpack", terminal_width=80).output
    out = CliRunner().invoke(main, ["cluster", "compare", "--help"], prog_name="llmpack", terminal_width=80).output
    shared, _, cluster = (_flags(part) for part in out.partition("Cluster options:"))
    assert {"--max-steps", "--budget", "--pipeline"} <= _flags(local)
    assert "--max-steps" in shared and "--budget" not in shared | cluster  # local-only: hidden on a cluster
    for flag in ("--kubeconfig", "--namespace", "--opencost", "--preempt", "--concurrency", "--image", "--plan"):
        assert flag in cluster and flag not in shared and flag not in _flags(local), flag
    assert max(len(line) for line in (*out.splitlines(), *local.splitlines())) <= 80


def test_piped_stdout_keeps_a_long_verdict_on_one_line_and_cuts_table_padding(monkeypatch) -> None:
    from rich.table import Table

    from llmpack.ui.display import _PipedStdout

    buf = io.StringIO()
    monkeypatch.setattr("sys.stdout", buf)
    console = Console(file=_PipedStdout(), width=160, soft_wrap=True, force_terminal=False)
    table = Table(title="llmpack compare · a long title")
    table.add_column("path")
    table.add_column("p50", justify="right")
    table.add_row("direct", "8.86 s")
    console.print(table)
    verdict = "kfp vs direct on time to first step: undecided after 3 rounds, " + "Δ +5.82 s " * 20
    console.print(verdict.rstrip())
    console.file.flush()
    lines = buf.getvalue().splitlines()
    assert verdict.rstrip() in lines  # whole, not wrapped at 160 columns
    assert [line for line in lines if line != line.rstrip()] == []
