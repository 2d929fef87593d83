"""Where ``compare``, ``cluster compare`` and ``report`` write a report: the directory named, or a new timestamped
one under :data:`DEFAULT_REPORTS` with ``latest`` pointed at it; checked before any run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.errors import InputError

DEFAULT_REPORTS = Path("llmpack-report")  # where timestamped reports go when no directory is named


def write_report_to(result: dict[str, Any], target: Path | None, costs: dict[str, float], *, force: bool) -> Path:
    """Into ``target`` exactly (replacing a report only with ``force``), or else a new timestamped
    directory under :data:`DEFAULT_REPORTS` with ``latest`` pointed at it. Returns report.html."""
    from llmpack.report import link_latest, new_report_dir, write_report

    if target is not None:
        return write_report(result, target, costs, replace=force) / "report.html"
    out = write_report(result, new_report_dir(DEFAULT_REPORTS, result["run_group"]), costs)
    link_latest(DEFAULT_REPORTS, out)
    return out / "report.html"


def check_report_target(target: Path | None, flag: str, *, force: bool) -> None:
    """Before any run: the report can be written, and no existing report would be replaced without ``--force``."""
    from llmpack.report import check_report_parent

    if target is None:
        check_report_parent(DEFAULT_REPORTS, flag)
        return
    check_report_parent(target, flag)
    if target.is_dir() and any(target.iterdir()):
        if not (target / "report.json").exists():
            raise InputError(f"{flag} {target}: not empty and not an llmpack report; choose another directory")
        if not force:
            raise InputError(f"{flag} {target}: holds a report already; pass --force to replace it, "
                             "or choose another directory")
