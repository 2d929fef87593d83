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


def run_with_progress(opts: Any, label: str | None = None, **kwargs: Any) -> dict[str, Any]:
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
