"""One run on the terminal: ``llmpack run``'s live progress line and its summary table.

The consoles, the number format and the library logs are :mod:`llmpack.ui.display`'s; the words of the
legend are :mod:`llmpack.ui.glossary`'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llmpack.ui import display
from llmpack.ui.display import fmt, status_text


def measured_only(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` as ``--json`` prints it: its ``metrics`` only those the run measured (docs/cli.md).

    The run's record keeps every measure of the closing step, a null where one does not apply (no
    training: no ``perplexity``, ``eval_loss``, ``mfu``; no GPU price: no ``cost_usd``); the JSON a
    user reads leaves those out instead of listing them as null.
    """
    return {**summary, "metrics": {k: v for k, v in (summary.get("metrics") or {}).items() if v is not None}}


def run_with_progress(opts: Any, label: str | None = None, **kwargs: Any) -> dict[str, Any]:  # noqa: D401
    """Run one pipeline with a live ``backend · step · elapsed`` line on stderr.

    While the training step runs, the step part is its own ``finetune 23/60 · 1,234 tok/s · ETA 0:12``
    (see :mod:`llmpack.ui.progress`). The line never wraps: on a narrow terminal its end is cut.
    """
    from llmpack.run.local import run_pipeline
    from llmpack.ui.progress import INTERRUPTED_TEXT, LogLines, interrupt_flag

    name = label or opts.backend
    with interrupt_flag() as interrupted:  # after Ctrl-C the steps' last events are not progress ("finetune done")
        if not display.err.is_terminal:  # a log (CI): timestamped lines at step boundaries and each tenth of training
            summary = run_pipeline(opts, progress=LogLines(name, display.err, interrupted=interrupted), **kwargs)
        else:
            with display.err.status(f"[bold]{name}[/] starting", spinner="dots") as status:

                def update(step: str, done: int, elapsed: float) -> None:
                    shown = INTERRUPTED_TEXT if interrupted.is_set() else step
                    width = display.err.width - 2  # 2: the spinner and a space
                    status.update(status_text(name, shown, elapsed, width=width))

                summary = run_pipeline(opts, progress=update, **kwargs)
    mark = "[green]ok[/]" if summary["status"] == "succeeded" else "[red]failed[/]"  # why: the error line after it
    total = summary["metrics"].get("total_s")
    display.err.print(f"{name}: {mark} in {fmt(total, 1)}s →")
    # a path whole, on its own line
    display.err.print(summary["artifacts"]["run_dir"], soft_wrap=True, markup=False, highlight=False)
    return summary


RUN_COLUMNS = (
    ("spinup_s", "spin-up s"),
    ("time_to_first_step_s", "to 1st step s"),
    ("total_s", "total s"),
    ("pipeline_overhead_s", "pipeline overhead s"),
    ("tokens_per_s", "tokens/s"),
    ("eval_loss", "eval loss"),
    ("base_eval_loss", "base loss"),
    ("cost_usd", "cost"),
    ("goodput", "goodput"),
)
# The glossary terms the run summary shows, printed under it (llmpack.ui.glossary); exact match: the outcome line.
RUN_TERMS = ("spinup", "time_to_first_step", "pipeline_overhead", "eval_loss", "base_loss", "cost", "goodput",
             "exact_match")
TERM_COLUMN = {"spinup": "spinup_s", "time_to_first_step": "time_to_first_step_s",
               "pipeline_overhead": "pipeline_overhead_s", "eval_loss": "eval_loss", "base_loss": "base_eval_loss",
               "cost": "cost_usd", "goodput": "goodput"}  # the table row each term explains (exact_match: the outcome)


def packaging(summary: dict[str, Any]) -> str:
    """How the run was packaged: which steps shared a process (``--fuse``), finetune's processes
    (``--nproc-per-node``) and nodes, e.g. ``fused: prepare_data+tokenize+finetune+evaluate+register
    in 1 process``."""
    from components import fusion
    from llmpack.run.local import PIPELINE_REF_TAG
    from llmpack.run.user_pipeline import load_pipeline

    fuse = str(summary.get("fuse") or summary.get("tags", {}).get(fusion.FUSE_TAG) or "none")
    try:  # the run's own pipeline (--pipeline), else the built-in one
        pipe = load_pipeline(summary.get("tags", {}).get(PIPELINE_REF_TAG))
        groups = [g for g in fusion.groups(pipe, fuse) if len(g) > 1]
    except Exception:  # noqa: BLE001 - an unknown packaging in an old record: say it as recorded
        pipe, groups = None, []
    if groups and pipe is not None:
        parts = [f"fused: {'+'.join(t.name for t in g)} in 1 process" for g in groups]
        fused = {t.name for g in groups for t in g}
        alone = [t.name for t in pipe.task_order() if t.name not in fused]
        if alone:
            parts.append(f"{', '.join(alone)}: one process each")
        text = "; ".join(parts)
    elif fuse != "none" and pipe is not None:
        text = f"--fuse {fuse}: nothing to fuse in this pipeline, each step in its own process"
    else:
        text = "each step in its own process" if fuse == "none" else f"--fuse {fuse}"
    nproc = int((summary.get("params") or {}).get("nproc_per_node") or 1)
    nodes = int(summary.get("nodes") or 1)
    if nproc > 1 or nodes > 1:
        text += (f"; finetune: {nproc} process{'es' if nproc > 1 else ''} (ranks) per node "
                 f"on {nodes} node{'s' if nodes > 1 else ''}")
    return text


def cost_text(summary: dict[str, Any]) -> str:
    """The run's cost in the one money format, ``projected`` when it was run locally (priced as if on
    the spec's GPU type; no GPU was billed)."""
    from llmpack.ui.numbers import money

    usd = summary["metrics"].get("cost_usd")
    if usd is None:
        return "-"
    return money(usd) + (" projected" if summary.get("mode", summary["tags"].get("llmpack.mode")) == "local" else "")


def summary_table(summaries: list[dict[str, Any]]) -> None:
    """One column per run, one row per measure: narrow enough for 80 columns whatever the values;
    then per run what was run (packaging, GPUs, price) and the terms the table uses."""
    from llmpack.ui import glossary
    from llmpack.ui.numbers import figure
    from llmpack.ui.outcome import task_text

    table = Table(title="llmpack run", title_justify="left")
    table.add_column("measure")
    for s in summaries:
        table.add_column(s["orchestrator"], justify="right")
    table.add_row("status", *[s["status"] for s in summaries])
    shown: set[str] = set()
    for key, header in RUN_COLUMNS:
        if key == "cost_usd":
            cells = [cost_text(s) for s in summaries]
        else:
            cells = [fmt(s["metrics"].get(key), 3) if "loss" in key else figure(s["metrics"].get(key))
                     for s in summaries]
        if key != "total_s" and all(c == "-" for c in cells):
            continue  # a measure no run has (a pipeline without training: no tokens/s, no eval loss): no row
        shown.add(key)
        table.add_row(header, *cells)
    display.out.print(table)
    from components.record.cost import NOT_PRICED

    for s in summaries:
        tags = s["tags"]
        local = s.get("mode", tags.get("llmpack.mode")) == "local"
        if str(tags.get("llmpack.gpu_count") or "0") in ("0", "None") or tags.get("llmpack.gpu_type") in (None, "none"):
            priced = f"no step asks for a GPU: price {NOT_PRICED}, no cost"
        else:
            gpus = (f"{tags.get('llmpack.gpu_count')}x {tags.get('llmpack.gpu_type')} "
                    f"at ${tags.get('llmpack.price_per_gpu_hour')}/GPU-h ({tags.get('llmpack.price_source')})")
            priced = f"cost projected as if on {gpus}; no GPU was billed" if local else f"billed on {gpus}"
        model = s["artifacts"].get("model_dir")
        display.out.print(f"[dim]{escape(s['pipeline_run'])}: {escape(packaging(s))}; {escape(priced)}"
                          + (f"; model: {escape(str(model))}" if model else "") + "[/]")
    print_retry_lines(summaries, display.out)
    terms = [term for term in RUN_TERMS if term != "cost" and (TERM_COLUMN.get(term) in shown or term == "exact_match"
                                                               and any(task_text(s["metrics"]) for s in summaries))]
    if "cost_usd" in shown:
        terms.append("projected" if any(s.get("mode") == "local" for s in summaries) else "cost")
    from llmpack.compare.comparison import untrained

    if untrained(summaries):  # a pipeline of one's own without finetune: its spin-up is its first step's start
        terms = ["spinup_first" if t == "spinup" else t for t in terms]
    for line in glossary.legend(terms):
        display.out.print(f"[dim]{escape(line)}[/]")


def print_retry_lines(runs: list[dict[str, Any]], console: Console) -> None:
    """Retried attempts and what they cost (every attempt is billed: they are in the cost and goodput)."""
    from llmpack.report import retry_lines

    for path, text in retry_lines(runs):
        console.print(f"[yellow]{escape(path)} retried:[/] {escape(text)}")


_LOG_TAIL_BYTES = 8192


def failed_step_log(summary: dict[str, Any]) -> Path | None:
    """The failed step's own log in the kept run directory, every local path writes one: ``logs/<step>.log``,
    on the mlflow path the driver's ``artifacts/<pipeline_run>/logs/<step>.log``; else the runner's
    (``logs/mlflow.log``: ``mlflow run`` failed before the step wrote its own)."""
    import re

    def name(value: Any) -> bool:
        return isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", value) is not None and \
            value not in (".", "..")

    step, run_dir = summary.get("failed_step"), (summary.get("artifacts") or {}).get("run_dir")
    if not name(step) or not run_dir:
        return None
    found = [Path(run_dir) / "logs" / f"{step}.log"]
    if name(summary.get("pipeline_run")):
        found.append(Path(run_dir) / "artifacts" / summary["pipeline_run"] / "logs" / f"{step}.log")
    found.append(Path(run_dir) / "logs" / f"{summary.get('orchestrator')}.log")
    for log in found:
        if log.is_file() and not log.is_symlink():
            return log
    return None


def print_log_tail(log: Path) -> None:
    """The last lines of a step's log on stderr (``--debug``), redacted, escape bytes shown as '?'."""
    from components import bounded
    from components.redaction import redact_text

    with os.fdopen(bounded.open_regular(log), "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - _LOG_TAIL_BYTES))
        tail = fh.read(_LOG_TAIL_BYTES).decode("utf-8", "replace")
    lines = tail.splitlines()[1 if size > _LOG_TAIL_BYTES else 0:][-40:]
    display.err.print(f"the end of {log}:", markup=False, highlight=False, soft_wrap=True)
    for line in redact_text("\n".join(lines)).splitlines():
        display.err.print("  " + "".join(c if c.isprintable() else "?" for c in line), markup=False,
                          highlight=False, soft_wrap=True)
