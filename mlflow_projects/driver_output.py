"""A step's output under the MLflow driver: teed to the terminal and its log, and its one error line
(the same ``llmpack: error:`` rule as every backend).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from components import bounded
from components.commands import CRASH_MARK
from components.redaction import redact_text, secrets_in

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
        with os.fdopen(bounded.open_append(log_path), "ab") as log:
            copy_redacted(lambda: os.read(read_end, 65536), saved_out, log)

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


def copy_redacted(read: Callable[[], bytes], out_fd: int, log: IO[bytes]) -> None:
    """Copy ``read()``'s chunks (until b"") to ``out_fd`` and ``log``, whole lines (``\n`` or ``\r`` ended, or 64 KiB)
    through the one redaction path: a step's own raw write of a secret is blanked (round 24)."""
    known = secrets_in()  # this process's (its argv's tracking URI, its environment's tokens), once
    pending = b""
    while chunk := read():
        pending += chunk
        cut = max(pending.rfind(b"\n"), pending.rfind(b"\r"))
        if cut < 0 and len(pending) < LINE_LIMIT:
            continue
        if cut < 0:  # a long line with no end yet: cut at its last space or tab, which no URI, token or encoded
            # form spans (rounds 25, 26); none in a whole MiB: cut where no known secret's beginning is left
            cut = max(pending.rfind(b" "), pending.rfind(b"\t"))
            if cut < 0 and len(pending) < HARD_LIMIT:
                continue
            cut = safe_cut(pending, known, cut + 1 if cut >= 0 else None)
        done, pending = pending[:cut + 1], pending[cut + 1:]
        out = redacted_lines(done, known)
        os.write(out_fd, out)
        log.write(out)
        log.flush()
    if pending:
        out = redacted_lines(pending, known)
        os.write(out_fd, out)
        log.write(out)
        log.flush()


LINE_LIMIT = 65536  # a line longer than this goes out in pieces, each ending at a space or tab
HARD_LIMIT = 1 << 20  # ...or, with none in it, a MiB at a time


def safe_cut(data: bytes, secrets: set[str], end: int | None = None) -> int:
    """The index of the last byte of ``data[:end]`` (default: all of it) to send now: never inside an occurrence of a
    known secret in ``data``, nor after the start of a tail of ``data`` that begins one (it may end in the next read:
    rounds 27, 28), nor inside a UTF-8 character."""
    end = len(data) if end is None else end
    raws = [r for r in (s.encode("utf-8", errors="ignore") for s in secrets) if r]
    for _ in range(8):  # each move can only go left; a few passes settle it
        moved = end
        for raw in raws:
            for k in range(min(len(raw) - 1, len(data)), 0, -1):  # the buffer's tail begins this secret
                if data.endswith(raw[:k]):
                    moved = min(moved, len(data) - k)
                    break
            start = data.find(raw, max(0, moved - len(raw) + 1))
            while 0 <= start < moved:  # an occurrence across the cut: cut before it
                if start + len(raw) > moved:
                    moved = start
                    break
                start = data.find(raw, start + 1)
        if moved == end:
            break
        end = moved
    while 0 < end < len(data) and data[end] & 0xC0 == 0x80:
        end -= 1
    return max(end, 1) - 1


def redacted_lines(data: bytes, secrets: set[str]) -> bytes:
    """``data`` (whole lines, their ends kept) with each line through :func:`~components.redaction.redact_text`."""
    parts = re.split(r"(\r\n|\n|\r)", data.decode("utf-8", errors="replace"))
    return "".join(p if i % 2 else redact_text(p, secrets) if p else "" for i, p in enumerate(parts)).encode()


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
