"""A step's output under the MLflow driver: teed to the terminal and its log, and its one error line
(the same ``llmpack: error:`` rule as every backend).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from components.commands import CRASH_MARK

ERROR_MARK = "llmpack: error:"


@contextmanager
def tee_output(log_path: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (and its children's) to the terminal and a log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump() -> None:
        with log_path.open("ab") as log:
            while chunk := os.read(read_end, 65536):
                os.write(saved_out, chunk)
                log.write(chunk)
                log.flush()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        thread.join()
        for fd in (read_end, saved_out, saved_err):
            os.close(fd)


def error_line(text: str) -> str:
    """The step's ``llmpack: error:`` message, else its last line (same rule as every backend)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for mark in (ERROR_MARK, CRASH_MARK):  # a multi-line crash's type and first line, after a deliberate failure's
        for line in reversed(lines):
            if mark in line:
                return line.split(mark, 1)[1].strip()
    return lines[-1] if lines else "no output"


def deliberate(text: str) -> bool:
    """Did the step fail on purpose (bad input, quality gate) rather than crash?"""
    return ERROR_MARK in text
