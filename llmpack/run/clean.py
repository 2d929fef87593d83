"""``llmpack clean``: remove old failed run directories (``<run>.failed``) from the runs directory.

A failed or interrupted run is kept as ``llmpack-runs/<pipeline_run>.failed`` to be looked at; this
removes the ones older than a given age (the directory's modification time). Only real
``.failed`` directories directly in ``--output-dir``: never a link, a staging directory or a
successful run; a run whose records were never sent is kept unless ``--include-unsent``. The
decisions: docs/internals/run-directories.md.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import click

from components.errors import InputError
from llmpack.run import orphans
from llmpack.run.orphans import FAILED_SUFFIX
from llmpack.ui.terminal import command

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")

Action = Literal["removed", "would remove", "kept unsent", "not removed", "refused"]


@dataclass(frozen=True, kw_only=True)
class CleanItem:
    """One failed run directory and what ``clean`` did with it."""

    path: Path
    age_s: float
    action: Action
    reason: str = ""


def parse_age(text: str, flag: str = "--older-than") -> float:
    """Seconds from ``30m``, ``12h``, ``7d``, ``2w`` (also ``90s``, ``1.5d``, and ``0``: any age); an
    :class:`InputError` otherwise."""
    if (text or "").strip() == "0":
        return 0.0
    match = _DURATION.match(text or "")
    if not match:
        raise InputError(f"{flag} {text!r}: give a number and a unit (s, m, h, d, w), e.g. 7d or 12h, or 0 (any age)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def format_age(seconds: float) -> str:
    """``3.2d``, ``5.0h``, ``12m``: the largest unit that keeps the number >= 1."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{max(0.0, seconds):.0f}s"


def unsent(path: Path) -> bool:
    """The kept run's ``summary.json`` says its records were never sent to tracking; an :class:`InputError` when it
    is there but not a bounded regular JSON file (a FIFO, ``/dev/zero``, a symlink, 10^6 ``[``)."""
    from components import bounded

    try:
        summary = bounded.read_json(path / "summary.json", allow_nan=True)
    except InputError:
        raise
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("tracking") == "not sent"


def clean_runs(
    runs_dir: Path,
    older_than_s: float,
    *,
    dry_run: bool = False,
    include_unsent: bool = False,
    now: float | None = None,
    remove: Callable[[Path], None] = shutil.rmtree,
) -> list[CleanItem]:
    """Remove (or with ``dry_run`` list) the ``*.failed`` run directories in ``runs_dir`` older than
    ``older_than_s``."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise InputError(f"--output-dir {runs_dir}: no such directory")
    now = time.time() if now is None else now
    items: list[CleanItem] = []
    with os.scandir(runs_dir) as entries:
        candidates = sorted((e for e in entries if e.name.endswith(FAILED_SUFFIX) and e.is_dir(follow_symlinks=False)),
                            key=lambda e: e.name)
    for entry in candidates:
        path = runs_dir / entry.name
        age_s = now - entry.stat(follow_symlinks=False).st_mtime
        if older_than_s > 0 and age_s < older_than_s:  # 0: every one, even one written this second
            continue
        try:
            kept_unsent = not include_unsent and unsent(path)
        except InputError as exc:  # one line for this run directory; the others go on
            items.append(CleanItem(path=path, age_s=age_s, action="refused", reason=str(exc)))
            continue
        if kept_unsent:
            items.append(CleanItem(path=path, age_s=age_s, action="kept unsent"))
            continue
        if dry_run:
            items.append(CleanItem(path=path, age_s=age_s, action="would remove"))
            continue
        try:
            remove(path)
            items.append(CleanItem(path=path, age_s=age_s, action="removed"))
        except OSError as exc:
            items.append(CleanItem(path=path, age_s=age_s, action="not removed", reason=exc.strerror or str(exc)))
    return items


def clean_now_command(runs_dir: Path) -> str:
    """The ``llmpack clean`` command that removes every failed run in ``runs_dir`` today (not only those 7 days old)."""
    default = runs_dir == Path("llmpack-runs")
    return "llmpack clean --older-than 0" + ("" if default else f" --output-dir {shlex.quote(str(runs_dir))}")


def render_item(item: CleanItem) -> str:
    """One line per run directory."""
    age = format_age(item.age_s)
    if item.action == "kept unsent":
        return (f"kept {item.path} ({age} old): its records were never sent to tracking; "
                f"llmpack sync {item.path}, or pass --include-unsent")
    if item.action == "refused":
        return f"llmpack: error: left {item.path}: {item.reason} (remove it with --include-unsent)"
    if item.action == "not removed":
        return f"llmpack: error: could not remove {item.path}: {item.reason}"
    return f"{item.action} {item.path} ({age} old)"


def take_over_dead_runs(runs_dir: Path, *, dry_run: bool = False) -> list[str]:
    """Every staging directory in ``runs_dir`` whose client died: taken over and sent (:mod:`llmpack.run.orphans`);
    one line each. One whose client lives is not touched; one the store cannot take now stays unsent. One that
    names a store other than the configured one is not touched either: its line is an error (``llmpack: error:``)."""
    from llmpack.run.sync import store_for, sync_run

    lines = []
    for staging in orphans.find_partial_runs(runs_dir):
        try:
            owner = orphans.read_owner(staging)
        except InputError as exc:  # unreadable, unbounded or unsealed: bad input, named, nothing touched
            lines.append(f"llmpack: error: left {staging}: {exc}")
            continue
        if orphans.owner_alive(owner):
            lines.append(f"left {staging}: its run is in progress")
            continue
        try:  # a store planted in the directory: refused before anything is touched or sent
            store_for(owner.get("tracking_uri"), None, what=f"left {staging}")
        except InputError as exc:
            lines.append(f"llmpack: error: {exc} of llmpack sync {shlex.quote(str(staging))}")
            continue
        if dry_run:
            lines.append(f"would take over {staging} (its client died)")
            continue
        try:
            kept = orphans.take_over(staging)
        except InputError as exc:
            lines.append(f"llmpack: error: left {staging}: {exc}")  # whole: the file it names is the news
            continue
        try:
            result = sync_run(kept)
        except Exception as exc:  # noqa: BLE001 - an outage or a refusal: kept unsent, named with its command
            lines.append(f"took over {staging} (its client died) as {kept}; not sent ({type(exc).__name__}): "
                         f"llmpack sync {kept}")
            continue
        lines.append(f"took over {staging} (its client died) as {kept}: record {result.mlflow_run_id} {result.status}, "
                     f"{result.logged} record(s) sent")
    return lines


@command("clean", short_help="Remove old failed runs (<run>.failed) from the runs directory.")
@click.option("--older-than", "older_than", default="7d", show_default=True,
              help="Remove failed runs at least this old (by modification time): 30m, 12h, 7d, 2w; 0: all of them.")
@click.option("--output-dir", "--runs-dir", "runs_dir", type=click.Path(path_type=Path), default=Path("llmpack-runs"),
              show_default=True, help="The runs directory, run's and compare's --output-dir (old name: --runs-dir).")
@click.option("--dry-run", is_flag=True, help="Only print what would be removed.")
@click.option("--include-unsent", is_flag=True,
              help="Also remove failed runs whose records were never sent to tracking (see llmpack sync).")
def clean(older_than: str, runs_dir: Path, dry_run: bool, include_unsent: bool) -> None:
    """Remove old failed runs (<run>.failed directories) from the runs directory.

    First takes over each run whose llmpack client died (<run>.partial; see llmpack sync) and
    sends it. Never touches successful runs, runs in progress, or anything outside --output-dir (symbolic
    links are neither followed nor removed). A failed run whose records were never sent to the
    tracking server is kept unless --include-unsent. A dead client's run that names a tracking
    store other than the configured one (MLFLOW_TRACKING_URI, else the default) is left untouched
    and named (send it with llmpack sync --tracking-uri).

    Exit codes: 0 ok; 1 a directory could not be removed; 2 bad input (such a run).
    """
    import sys

    from components.redaction import printable

    refused = False
    if runs_dir.is_dir():  # directory names are a stranger's: shown, never obeyed (escape bytes as '?')
        for line in take_over_dead_runs(runs_dir, dry_run=dry_run):
            refused |= line.startswith("llmpack: error: ")
            click.echo(printable(line, 4000), err=line.startswith("llmpack: error: "))
    items = clean_runs(runs_dir, parse_age(older_than), dry_run=dry_run, include_unsent=include_unsent)
    for item in items:
        click.echo(printable(render_item(item), 4000), err=item.action in ("not removed", "refused"))
    if not any(item.action in ("removed", "would remove") for item in items):
        click.echo(f"no failed runs older than {older_than} to remove in {runs_dir}")
    if any(item.action == "not removed" for item in items):
        sys.exit(1)
    if refused or any(item.action == "refused" for item in items):  # bad input (a planted store, an unsealed or
        # unreadable run directory): named, left as it was
        sys.exit(2)
