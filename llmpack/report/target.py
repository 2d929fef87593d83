"""Where ``compare``, ``cluster compare`` and ``report`` write a report: the directory named, or a new timestamped
one under :data:`DEFAULT_REPORTS` with ``latest`` pointed at it; checked before any run. What is written there is
:func:`llmpack.report.render.write_report`'s."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from components.errors import InputError

DEFAULT_REPORTS = Path("llmpack-report")  # where timestamped reports go when no directory is named


def write_report_to(result: dict[str, Any], target: Path | None, costs: dict[str, float], *, force: bool) -> Path:
    """Into ``target`` exactly (replacing a report only with ``force``), or else a new timestamped
    directory under :data:`DEFAULT_REPORTS` with ``latest`` pointed at it. Returns report.html."""
    from llmpack.report.render import write_report

    if target is not None:
        return write_report(result, target, costs, replace=force) / "report.html"
    check_report_parent(DEFAULT_REPORTS, "report")  # again: the link may be planted since the check before the runs
    out = write_report(result, new_report_dir(DEFAULT_REPORTS, result["run_group"]), costs, follow_links=False)
    link_latest(DEFAULT_REPORTS, out)
    return out / "report.html"


def check_report_target(target: Path | None, flag: str, *, force: bool) -> None:
    """Before any run: the report can be written, and no existing report would be replaced without ``--force``."""
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


def new_report_dir(parent: Path, run_group: str, now: float | None = None) -> Path:
    """``PARENT/<UTC yyyymmdd-HHMMSS>-<run group>``: every compare gets its own report, none is replaced."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    path = Path(parent) / f"{stamp}-{run_group}"
    i = 1
    while os.path.lexists(path):  # round 31: a planted dangling link is taken, never followed
        i += 1
        path = Path(parent) / f"{stamp}-{run_group}-{i}"
    return path


def check_report_parent(parent: Path, flag: str) -> None:
    """Before any run: the report parent is a directory we can write in (or can be created), and not a link when
    it is the default llmpack chose (round 32: a planted ``llmpack-report`` link took every report elsewhere)."""
    parent = Path(parent)
    if parent == DEFAULT_REPORTS and os.path.islink(parent):
        raise InputError(f"{flag}: ./{parent} is a symlink; reports are never written through it (remove it, or "
                         "name a report directory)")
    if parent.exists() and not parent.is_dir():
        raise InputError(f"{flag} {parent}: exists and is not a directory")
    probe = next((p for p in [parent, *parent.resolve().parents] if p.exists()), None)
    if probe is None or not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {parent}: cannot write a report there (no write permission)")


def link_latest(parent: Path, report_dir: Path) -> None:
    """``PARENT/latest`` points at the newest report (a relative symlink, replaced atomically)."""
    link = Path(parent) / "latest"
    tmp = Path(parent) / f".latest-{os.getpid()}"
    try:
        if tmp.is_symlink():
            tmp.unlink()
        os.symlink(report_dir.name, tmp)
        os.replace(tmp, link)
    except OSError:  # a file system without symlinks: the printed path is enough
        if tmp.is_symlink():
            tmp.unlink()
