"""Terminal output: a live status line on stderr while a run goes, and summary tables."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

err = Console(stderr=True)
out = Console(width=None if sys.stdout.isatty() else 160)


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != 0 and abs(value) < 10 ** -digits:
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return str(value)


def run_with_progress(opts: Any, label: str | None = None, **kwargs: Any) -> dict[str, Any]:  # noqa: D401
    """Run one pipeline with a live ``backend · step · elapsed`` line on stderr."""
    from llmpack.runs import run_pipeline

    name = label or opts.backend
    with err.status(f"[bold]{name}[/] starting", spinner="dots") as status:

        def update(step: str, done: int, elapsed: float) -> None:
            status.update(f"[bold]{name}[/] · {step} · {done} steps done · {elapsed:5.1f}s")

        summary = run_pipeline(opts, progress=update, **kwargs)
    mark = "[green]ok[/]" if summary["status"] == "succeeded" else f"[red]failed[/] ({summary['error']})"
    total = summary["metrics"].get("total_s")
    err.print(f"{name}: {mark} in {fmt(total, 1)}s  →  {summary['artifacts']['run_dir']}")
    return summary


RUN_COLUMNS = (
    ("spinup_s", "spin-up s"),
    ("time_to_first_step_s", "to 1st step s"),
    ("total_s", "total s"),
    ("pipeline_overhead_s", "overhead s"),
    ("tokens_per_s", "tokens/s"),
    ("eval_loss", "eval loss"),
    ("base_eval_loss", "base loss"),
    ("cost_usd", "cost $"),
)


def summary_table(summaries: list[dict[str, Any]]) -> None:
    table = Table(title="llmpack run", title_justify="left")
    table.add_column("orchestrator")
    table.add_column("status")
    for _, header in RUN_COLUMNS:
        table.add_column(header, justify="right")
    for s in summaries:
        m = s["metrics"]
        table.add_row(
            s["orchestrator"],
            s["status"],
            *[fmt(m.get(key), 6 if key == "cost_usd" else 3 if "loss" in key else 2) for key, _ in RUN_COLUMNS],
        )
    out.print(table)
    for s in summaries:
        tags = s["tags"]
        out.print(
            f"[dim]{s['pipeline_run']}: {tags.get('llmpack.gpu_count')}x {tags.get('llmpack.gpu_type')} at "
            f"${tags.get('llmpack.price_per_gpu_hour')}/GPU-h ({tags.get('llmpack.price_source')}); "
            f"model: {s['artifacts'].get('model_dir', '-')}[/]"
        )


COMPARE_COLUMNS = (
    ("spinup_s", "spin-up s"),
    ("time_to_first_step_s", "to 1st step s"),
    ("total_s", "total s"),
)
SINGLE_COLUMNS = (
    ("pipeline_overhead_s", "overhead s"),
    ("tokens_per_s", "tokens/s"),
    ("cost_usd", "cost $"),
    ("usd_per_1m_tokens", "$/1M tok"),
    ("goodput", "goodput"),
)


def compare_table(result: dict[str, Any]) -> None:
    """p50/p90/p99 of the timing metrics, p50 of the rest, a row per orchestrator."""
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
            table.add_row(orch, "0", f"[red]failed: {failed.get(orch, 'no run')}[/]", *[""] * (len(COMPARE_COLUMNS) + len(SINGLE_COLUMNS) - 1))
            continue
        cells = []
        for key, _ in COMPARE_COLUMNS:
            s = stats[key]
            p99 = fmt(s["p99"]) if s["p99"] is not None else "n<10"
            cells.append(f"{fmt(s['p50'])}/{fmt(s['p90'])}/{p99}")
        for key, _ in SINGLE_COLUMNS:
            cells.append(fmt(stats[key]["p50"], 6 if key == "cost_usd" else 3 if key == "goodput" else 2))
        table.add_row(orch, str(n), *cells)
    out.print(table)
    out.print(f"[dim]percentiles: {result['percentile_method']}; p99 needs n >= 10 runs per path.[/]")
    for f in result["failed"]:
        out.print(f"[red]{f['orchestrator']} {f['pipeline_run']} failed:[/] {f['error']}")
