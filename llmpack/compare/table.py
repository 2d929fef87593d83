"""A comparison on the terminal: the medians table (80 columns, or ``--wide``), one verdict per path,
the unjudged measures, the gangs, retries, the accounts beside ours, and the recommendation.

The consoles and the number format are :mod:`llmpack.ui.display`'s.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from llmpack.compare.comparison import runs_counted
from llmpack.run.show import print_retry_lines
from llmpack.ui import display
from llmpack.ui.display import fmt

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
    console = console or display.out
    if wide:
        _wide_table(result, console)
    else:
        _narrow_table(result, console)
    _verdict_lines(result, console)
    _unjudged_block(result, console)
    if any(r.get("status") == "succeeded" for r in result.get("runs", ())):  # else no figure to explain
        console.print(f"[dim]percentiles: {result['percentile_method']}; p99 needs n >= 10 runs per path.[/]")
    for f in result["failed"]:
        console.print(f"[red]{f['orchestrator']} {f['pipeline_run']} failed:[/] {f['error']}")
    _gang_lines(result, console)
    print_retry_lines(result["runs"], console)
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
    if rec.command:  # commands to copy: never wrapped inside (display.print_unbroken)
        display.print_unbroken(console, "  to decide: ", Text(rec.command, style="bold"))
        if rec.why_command:
            display.print_unbroken(console, f"  ({rec.why_command})")
        if rec.not_compared:  # the paths the command leaves out: a note, wrapped to the terminal
            console.print(Text(f"  {rec.not_compared}"))


def unjudged_metrics(result: dict[str, Any]) -> list[str]:
    """The headlines no path could be judged on (one run each): shown apart and dimmed, never as a headline."""
    from llmpack.compare.comparison import HEADLINES, measured
    from llmpack.compare.recommend import judged

    verdicts = result.get("verdicts", {})
    if not result.get("baseline"):
        return []
    return [h.metric for h in HEADLINES if h.metric in verdicts and measured(verdicts[h.metric])
            and not any(judged(e) for o, e in verdicts[h.metric].items() if o != result["baseline"])]


def measured_metrics(result: dict[str, Any]) -> list[str]:
    """The headlines some run measured (a pipeline without finetune has no time to first step): the others are
    never shown, not even as a dash."""
    from llmpack.compare.comparison import HEADLINES, measured

    verdicts = result.get("verdicts", {})
    return [h.metric for h in HEADLINES if h.metric not in verdicts or measured(verdicts[h.metric])]



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


def _narrow_table(result: dict[str, Any], console: Console) -> None:
    from llmpack.compare.comparison import HEADLINES, quantity

    table = Table(title=f"llmpack compare · {result['run_group']}", title_justify="left", box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=False)
    table.add_column("path", no_wrap=True)
    table.add_column("n", justify="right", no_wrap=True)
    short = {"time_to_first_step_s": "to 1st step", "spinup_s": "spin-up", "total_s": "total", "cost_usd": "cost/run"}
    unjudged = unjudged_metrics(result)
    have = measured_metrics(result)
    # the rest: apart, dimmed (_unjudged_block); a headline no run measured: not at all
    shown = [h for h in HEADLINES if h.metric not in unjudged and h.metric in have]
    if not shown:  # nothing judged yet (one run per path): a line, not a table of two columns under a wrapped title
        counts = " · ".join(
            f"{orch} {n}" if (n := runs_counted(result["summary"].get(orch, {}), have)) else f"{orch} failed"
            for orch in result["backends"])
        console.print(Text(f"llmpack compare · {result['run_group']} · runs per path: {counts}"))
        return  # no table: no legend of its columns either
    for h in shown:
        table.add_column(f"{short[h.metric]}\np50", justify="right", no_wrap=True)
    verdicts = result.get("verdicts", {})
    for orch in result["backends"]:
        n = runs_counted(result["summary"].get(orch, {}), have)  # rounds it ran, start-up included
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
    from llmpack.compare.comparison import HEADLINES

    unmeasured = {h.metric for h in HEADLINES} - set(measured_metrics(result))  # not under the table either
    from llmpack.compare.comparison import untrained

    terms = [t for t in COMPARE_TERMS if glossary.term(t).metric not in unmeasured]
    if untrained(list(result.get("runs", ()))):  # without finetune: spin-up is the first step's start
        terms = ["spinup_first" if t == "spinup" else t for t in terms]
    costed = "cost_usd" not in unmeasured
    for line in glossary.legend([*terms, *(["projected"] if local and costed else [])]):
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
    have = measured_metrics(result)
    if result.get("design"):
        why = {"decided": "every start-up verdict decided", "budget": "the --budget ran out",
               "max rounds": "the most rounds it plans",
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
            if h.metric in unjudged or h.metric not in have:
                continue  # one run each: in the dimmed block below, not among the verdicts; no run: nowhere
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
        n = runs_counted(stats, [key for key, _ in COMPARE_COLUMNS])  # start-up rounds included
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
