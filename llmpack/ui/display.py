"""Terminal output every command shares: the two consoles (stdout, stderr), library logs kept off the terminal,
the live status line's text and the number format. The tables are their commands': :mod:`llmpack.run.show`,
:mod:`llmpack.compare.table`."""

from __future__ import annotations

import io
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
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
        from components import bounded

        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        # never appended through a link planted where the log goes (a runs directory others may write)
        return os.fdopen(bounded.open_append(self.baseFilename), "a", encoding="utf-8")


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


def print_unbroken(console: Console, *parts: str | Text) -> None:
    """One line made of ``parts`` that the console never wraps (``soft_wrap``): a line that holds a command to
    copy (``to decide: llmpack compare --budget 13.5m``) stays one line at any width; a narrow terminal folds
    it only on screen, and a copy gets it whole."""
    line = Text()
    for part in parts:
        line.append(part if isinstance(part, Text) else Text(part))
    console.print(line, soft_wrap=True)
