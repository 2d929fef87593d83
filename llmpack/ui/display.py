"""Terminal output: a live status line on stderr while a run goes, and summary tables."""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text


class _PipedStdout(io.TextIOBase):
    """``sys.stdout`` (looked up at each write, as rich does) with each line's trailing spaces cut.

    Rich pads table rows and titles to the table's width; in a terminal that is invisible, in a pipe or
    a file it leaves every row ending in spaces.
    """

    def __init__(self) -> None:
        self._pending = ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        if lines:
            sys.stdout.write("".join(line.rstrip() + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            sys.stdout.write(self._pending)
            self._pending = ""
        sys.stdout.flush()


err = Console(stderr=True)
# A terminal gets its own width. A pipe gets no trailing spaces, and unless COLUMNS names a width to wrap
# at, 160 columns for tables and lines never wrapped (a verdict is one line, for grep).
_PIPED = not sys.stdout.isatty()
_UNWRAPPED = _PIPED and not os.environ.get("COLUMNS")
out = Console(width=160 if _UNWRAPPED else None, soft_wrap=_UNWRAPPED, file=_PipedStdout() if _PIPED else None)

# Libraries that log INFO lines or warn at the client (MLflow's database set-up, alembic, kfp, hera).
LIBRARY_LOGGERS = ("mlflow", "alembic", "sqlalchemy", "huey", "kfp", "hera", "urllib3", "git", "py.warnings")


class _LazyFileHandler(logging.FileHandler):
    """A log file created at the first line, so input refused before any run leaves nothing behind."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8", delay=True)

    def _open(self) -> Any:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


@contextmanager
def library_logs_to(path: Path | None) -> Iterator[None]:
    """Library log lines and Python warnings go to ``path`` (appended), not the terminal.

    MLflow installs its own stderr handler when imported, so it is imported first and its
    handlers are taken over; everything is restored afterwards. ``path=None``: only WARNING and
    above reach stderr.
    """
    import warnings

    import mlflow  # noqa: F401 - configures its loggers on import; take them over after that

    from llmpack.ui.terminal import quiet_library_warnings

    if path is not None:
        handler: logging.Handler = _LazyFileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
    saved = {}
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = (logger.handlers[:], logger.propagate)
        logger.handlers, logger.propagate = [handler], False
    logging.captureWarnings(True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            quiet_library_warnings()  # libraries' own deprecations are theirs to fix, not the user's to read
            yield
    finally:
        logging.captureWarnings(False)
        for name, (handlers, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
        handler.close()


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != 0 and abs(value) < 10 ** -digits:
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return str(value)


def status_text(name: str, step: str, elapsed: float, width: int) -> Text:
    """``kfp · finetune 23/60 · 1,234 tok/s · ETA 0:12 ·  41.2s``, cut to ``width`` columns, never wrapped.

    Cut here because rich wraps a ``Text(no_wrap=True)`` anyway: ``Console.print`` passes its own
    ``no_wrap=False``, which wins.
    """
    line = Text.assemble((name, "bold"), f" · {step} · {elapsed:5.1f}s")
    line.truncate(width, overflow="ellipsis")
    return line


def run_with_progress(opts: Any, label: str | None = None, **kwargs: Any) -> dict[str, Any]:  # noqa: D401
    """Run one pipeline with a live ``backend · step · elapsed`` line on stderr.

    While the training step runs, the step part is its own ``finetune 23/60 · 1,234 tok/s · ETA 0:12``
    (see :mod:`llmpack.ui.progress`). The line never wraps: on a narrow terminal its end is cut.
    """
    from llmpack.run.local import run_pipeline
    from llmpack.ui.progress import INTERRUPTED_TEXT, LogLines, interrupt_flag

    name = label or opts.backend
    with interrupt_flag() as interrupted:  # after Ctrl-C the steps' last events are not progress ("finetune done")
        if not err.is_terminal:  # a log (CI): timestamped lines at step boundaries and each tenth of training
            summary = run_pipeline(opts, progress=LogLines(name, err, interrupted=interrupted), **kwargs)
        else:
            with err.status(f"[bold]{name}[/] starting", spinner="dots") as status:

                def update(step: str, done: int, elapsed: float) -> None:
                    shown = INTERRUPTED_TEXT if interrupted.is_set() else step
                    status.update(status_text(name, shown, elapsed, width=err.width - 2))  # 2: the spinner and a space

                summary = run_pipeline(opts, progress=update, **kwargs)
    mark = "[green]ok[/]" if summary["status"] == "succeeded" else f"[red]failed[/] ({summary['error']})"
    total = summary["metrics"].get("total_s")
    err.print(f"{name}: {mark} in {fmt(total, 1)}s →")
    # a path whole, on its own line
    err.print(summary["artifacts"]["run_dir"], soft_wrap=True, markup=False, highlight=False)
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


def packaging(summary: dict[str, Any]) -> str:
    """How the run was packaged: which steps shared a process (``--fuse``), finetune's processes
    (``--nproc-per-node``) and nodes, e.g. ``fused: prepare_data+tokenize+finetune+evaluate+register
    in 1 process``."""
    from components import fusion
    from components.finetune_pipeline import build

    fuse = str(summary.get("fuse") or summary.get("tags", {}).get(fusion.FUSE_TAG) or "none")
    try:
        groups = fusion.groups(build(), fuse)
    except Exception:  # noqa: BLE001 - an unknown packaging in an old record: say it as recorded
        groups = []
    if groups:
        parts = [f"fused: {'+'.join(t.name for t in g)} in 1 process" for g in groups]
        fused = {t.name for g in groups for t in g}
        alone = [t.name for t in build().task_order() if t.name not in fused]
        if alone:
            parts.append(f"{', '.join(alone)}: one process each")
        text = "; ".join(parts)
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

    table = Table(title="llmpack run", title_justify="left")
    table.add_column("measure")
    for s in summaries:
        table.add_column(s["orchestrator"], justify="right")
    table.add_row("status", *[s["status"] for s in summaries])
    for key, header in RUN_COLUMNS:
        if key == "cost_usd":
            table.add_row(header, *[cost_text(s) for s in summaries])
        else:
            table.add_row(header, *[fmt(s["metrics"].get(key), 3) if "loss" in key else figure(s["metrics"].get(key))
                                    for s in summaries])
    out.print(table)
    for s in summaries:
        tags = s["tags"]
        gpus = (f"{tags.get('llmpack.gpu_count')}x {tags.get('llmpack.gpu_type')} "
                f"at ${tags.get('llmpack.price_per_gpu_hour')}/GPU-h ({tags.get('llmpack.price_source')})")
        local = s.get("mode", tags.get("llmpack.mode")) == "local"
        priced = f"cost projected as if on {gpus}; no GPU was billed" if local else f"billed on {gpus}"
        out.print(f"[dim]{escape(s['pipeline_run'])}: {escape(packaging(s))}; {escape(priced)}; "
                  f"model: {escape(str(s['artifacts'].get('model_dir', '-')))}[/]")
    _retry_lines(summaries, out)
    terms = [k for k in RUN_TERMS if k != "cost"] + (["projected"] if any(s.get("mode") == "local" for s in summaries)
                                                     else ["cost"])
    for line in glossary.legend(terms):
        out.print(f"[dim]{escape(line)}[/]")


COMPARE_COLUMNS = (
    ("spinup_s", "spin-up s"),
    ("time_to_first_step_s", "to 1st step s"),
    ("total_s", "total s"),
)
SINGLE_COLUMNS = (
    ("pipeline_overhead_s", "pipeline overhead s"),
    ("tokens_per_s", "tokens/s"),
    ("cost_usd", "cost"),
    ("usd_per_1m_tokens", "$/1M tok"),
    ("goodput", "goodput"),
)


def compare_table(result: dict[str, Any], *, wide: bool = False, console: Console | None = None) -> None:
    """The medians of the headline measures in 80 columns, then one verdict line per path; ``wide``: every column."""
    console = console or out
    if wide:
        _wide_table(result, console)
    else:
        _narrow_table(result, console)
    _verdict_lines(result, console)
    _unjudged_block(result, console)
    console.print(f"[dim]percentiles: {result['percentile_method']}; p99 needs n >= 10 runs per path.[/]")
    for f in result["failed"]:
        console.print(f"[red]{f['orchestrator']} {f['pipeline_run']} failed:[/] {f['error']}")
    _gang_lines(result, console)
    _retry_lines(result["runs"], console)
    from llmpack.report import beside

    beside.terminal(result["runs"], console)  # compare --cluster: Argo's and OpenCost's figures beside ours
    from llmpack.report.preemption import terminal_lines

    for line in terminal_lines(result):
        console.print(f"[yellow]{escape(line)}[/]")
    recommendation_lines(result, console)


def recommendation_lines(result: dict[str, Any], console: Console) -> None:
    """The compare's last word: which path and why, or the command that would decide (llmpack.compare.recommend)."""
    from llmpack.compare.recommend import recommend

    rec = recommend(result)
    console.print(Text(rec.text, style="bold"))
    if rec.caveat:
        console.print(Text(f"  caveat: {rec.caveat}"))
    if rec.command:
        console.print(Text("  to decide: ") + Text(rec.command, style="bold"))
        if rec.why_command:
            console.print(Text(f"  ({rec.why_command})"))


def unjudged_metrics(result: dict[str, Any]) -> list[str]:
    """The headlines no path could be judged on (one run each): shown apart and dimmed, never as a headline."""
    from llmpack.compare.comparison import HEADLINES
    from llmpack.compare.recommend import judged

    verdicts = result.get("verdicts", {})
    if not result.get("baseline"):
        return []
    return [h.metric for h in HEADLINES if h.metric in verdicts
            and not any(judged(e) for o, e in verdicts[h.metric].items() if o != result["baseline"])]


def _unjudged_block(result: dict[str, Any], console: Console) -> None:
    """``not judged (one run per path): total direct 45.2 s · kfp 50.1 s`` in dim, apart from the verdicts."""
    from llmpack.compare.comparison import HEADLINES, quantity

    metrics = unjudged_metrics(result)
    if not metrics:
        return
    console.print("[dim]not judged (one run per path: single noisy figures, not verdicts; --repeats 5 judges them):[/]")
    for h in HEADLINES:
        if h.metric in metrics:
            per_path = result["verdicts"][h.metric]
            cells = " · ".join(f"{o} {quantity(e.get('value'), h.unit)}" for o, e in per_path.items())
            console.print(Text(f"  {h.label}: {cells}", style="dim"))


def _gang_lines(result: dict[str, Any], console: Console) -> None:
    """``compare --cluster --nodes N``: when each path's finetune gang was all up, and Kueue's waits (p50)."""
    from llmpack.compare.comparison import gang_rows

    for label, per_path in gang_rows(result):
        parts = [f"{escape(path)} {fmt(e['p50'], 1)} s (n={e['n']})" for path, e in per_path.items()]
        console.print(f"{label} p50: " + ", ".join(parts))


def _retry_lines(runs: list[dict[str, Any]], console: Console) -> None:
    """Retried attempts and what they cost (every attempt is billed: they are in the cost and goodput)."""
    from llmpack.report import retry_lines

    for path, text in retry_lines(runs):
        console.print(f"[yellow]{escape(path)} retried:[/] {escape(text)}")


def _narrow_table(result: dict[str, Any], console: Console) -> None:
    from llmpack.compare.comparison import HEADLINES, quantity

    table = Table(title=f"llmpack compare · {result['run_group']}", title_justify="left", box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=False)
    table.add_column("path", no_wrap=True)
    table.add_column("n", justify="right", no_wrap=True)
    short = {"time_to_first_step_s": "to 1st step", "spinup_s": "spin-up", "total_s": "total", "cost_usd": "cost/run"}
    unjudged = unjudged_metrics(result)
    shown = [h for h in HEADLINES if h.metric not in unjudged]  # the rest: apart, dimmed (_unjudged_block)
    for h in shown:
        table.add_column(f"{short[h.metric]}\np50", justify="right", no_wrap=True)
    verdicts = result.get("verdicts", {})
    for orch in result["backends"]:
        # rounds it ran, start-up included
        n = result["summary"].get(orch, {}).get("time_to_first_step_s", {}).get("n", 0)
        if n == 0:
            table.add_row(orch, "0", "[red]failed[/]", *[""] * (len(shown) - 1))
            continue
        cells = []
        for h in shown:
            e = verdicts.get(h.metric, {}).get(orch, {})
            mark = {h.lower: " ▼", h.higher: " ▲", "equivalent": " ≈"}.get(e.get("verdict", ""), "")
            cells.append(quantity(e.get("value"), h.unit) + mark)
        table.add_row(orch, str(n), *cells)
    console.print(table)
    if result.get("baseline"):
        console.print(f"[dim]▼/▲ decidedly lower/higher than {result['baseline']} · ≈ equivalent · no mark: "
                      "undecided[/]")
    compare_legend(result, console)


# The glossary terms compare's table shows, printed under it (llmpack.ui.glossary).
COMPARE_TERMS = ("spinup", "time_to_first_step", "total", "cost")


def compare_legend(result: dict[str, Any], console: Console) -> None:
    """What the table's measures are, from the one glossary; ``projected`` when a run was local."""
    from llmpack.ui import glossary

    local = any(r.get("mode") == "local" for r in result.get("runs", ()))
    for line in glossary.legend([*COMPARE_TERMS, *(["projected"] if local else [])]):
        console.print(f"[dim]{escape(line)}[/]")


def _verdict_lines(result: dict[str, Any], console: Console) -> None:
    """Per path, each headline's verdict against the baseline in words (llmpack.compare.comparison words them all)."""
    from llmpack.compare.comparison import HEADLINES

    baseline = result.get("baseline")
    if not baseline:
        console.print("no baseline: no path is named faster or cheaper (name one with --baseline PATH).")
        return
    verdicts = result.get("verdicts", {})
    unjudged = unjudged_metrics(result)
    if result.get("design"):
        why = {"decided": "every start-up verdict decided", "budget": "the --budget ran out",
               "max rounds": "the design's last round",
               "failed": "the baseline, or every other path, failed its whole run"}.get(result.get("stopped", ""),
                                                                                        result.get("stopped", ""))
        rounds = int(result.get("rounds") or 0)
        console.print(f"{rounds} round{'' if rounds == 1 else 's'} ({why}):")
        if (result.get("budget_adapted") or {}).get("text"):
            console.print(Text(f"  {result['budget_adapted']['text']}", style="yellow"))
    for orch in result["backends"]:
        if orch == baseline:
            continue
        for h in HEADLINES:
            e = verdicts.get(h.metric, {}).get(orch)
            if e is None or not e.get("text"):
                continue
            if h.metric in unjudged:
                continue  # one run each: in the dimmed block below, not among the verdicts
            console.print(Text(f"  {e['text']}"))  # no Padding: a pipe would get the line padded with spaces


def _wide_table(result: dict[str, Any], console: Console) -> None:
    from llmpack.ui.numbers import figure, money

    table = Table(title=f"llmpack compare · run group {result['run_group']}", title_justify="left")
    table.add_column("orchestrator")
    table.add_column("n", justify="right")
    for _, header in COMPARE_COLUMNS:
        table.add_column(f"{header}\np50/p90/p99", justify="right")
    for _, header in SINGLE_COLUMNS:
        table.add_column(f"{header}\np50", justify="right")
    failed = {f["orchestrator"]: f["error"] for f in result["failed"]}
    for orch in result["backends"]:
        stats = result["summary"].get(orch, {})
        n = stats.get("total_s", {}).get("n", 0)
        if n == 0:
            table.add_row(orch, "0", f"[red]failed: {failed.get(orch, 'no run')}[/]",
                          *[""] * (len(COMPARE_COLUMNS) + len(SINGLE_COLUMNS) - 1))
            continue
        cells = []
        for key, _ in COMPARE_COLUMNS:
            s = stats[key]
            p99 = fmt(s["p99"]) if s["p99"] is not None else "n<10"
            cells.append(f"{fmt(s['p50'])}/{fmt(s['p90'])}/{p99}")
        for key, _ in SINGLE_COLUMNS:
            cells.append(money(stats[key]["p50"]) if key in ("cost_usd", "usd_per_1m_tokens")
                         else figure(stats[key]["p50"]))
        table.add_row(orch, str(n), *cells)
    console.print(table)
