"""Our GPU-hours and cost beside Argo's and OpenCost's: the terminal table, the report's section.

The figures and the reasons are :mod:`llmpack.report.accounts`'; this is how they are shown, the
same columns in the terminal (80 columns), report.md and report.html.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

from llmpack.report.accounts import rows

TITLE = "Beside Argo and OpenCost"
NOTE = ("Ours bills GPU nodes (Ready to removal or scale-down); Argo's resourcesDuration and OpenCost bill pods "
        "(GPU requests x run time); OpenCost prices them from its own billing data.")
COLUMNS = (("path", "path"), ("ours GPU-h", "ours_gpu_hours"), ("ours $", "ours_usd"), ("Argo GPU-h", "argo_gpu_hours"),
           ("OpenCost GPU-h", "opencost_gpu_hours"), ("OpenCost $", "opencost_gpu_cost_usd"))


def _cell(row: Mapping[str, Any], key: str) -> str:
    if key == "path":
        return str(row["label"])
    value = row.get(key)
    if value is None:
        return "-"
    return f"${value:,.2f}" if key.endswith("usd") else f"{value:.3f}"


def table_rows(runs: Iterable[Mapping[str, Any]]) -> list[tuple[list[str], list[str]]]:
    """(cells, reasons) per run that has Argo's or OpenCost's figures."""
    return [([_cell(r, key) for _, key in COLUMNS], list(r["why"])) for r in rows(runs)]


def terminal(runs: Iterable[Mapping[str, Any]], console: Any) -> None:
    """The table and, under it, each run's reasons (nothing when no run has the figures)."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    found = table_rows(runs)
    if not found:
        return
    table = Table(title=TITLE, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for name, key in COLUMNS:
        table.add_column(name, justify="left" if key == "path" else "right", no_wrap=True)
    for cells, _ in found:
        table.add_row(*(escape(c) for c in cells))
    console.print(table)
    for cells, why in found:
        for line in why:
            console.print(f"[dim]{escape(cells[0])}:[/] {escape(line)}")


def markdown(runs: Iterable[Mapping[str, Any]]) -> list[str]:
    found = table_rows(runs)
    if not found:
        return []
    lines = ["", f"## {TITLE}", "", NOTE, "", "| " + " | ".join(n for n, _ in COLUMNS) + " |",
             "|" + "|".join("---" if k == "path" else "---:" for _, k in COLUMNS) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells, _ in found]
    lines += [""] + [f"- **{cells[0]}**: {line}" for cells, why in found for line in why]
    return lines


def html_section(runs: Iterable[Mapping[str, Any]]) -> str:
    found = table_rows(runs)
    if not found:
        return ""
    head = "".join(f"<th>{html.escape(n)}</th>" for n, _ in COLUMNS)
    body = "".join("<tr>" + "".join(f"<{'th' if i == 0 else 'td'}>{html.escape(c)}</{'th' if i == 0 else 'td'}>"
                                    for i, c in enumerate(cells)) + "</tr>" for cells, _ in found)
    why = "".join(f"<li><b>{html.escape(cells[0])}</b>: {html.escape(line)}</li>" for cells, w in found for line in w)
    return (f"<h2>{TITLE}</h2><p class=note>{html.escape(NOTE)}</p><table class=num><tr>{head}</tr>{body}</table>"
            f"<ul>{why}</ul>")
