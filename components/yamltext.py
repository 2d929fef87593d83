"""YAML that a user hands us, parsed to plain data or refused in one line naming the file and line.

PyYAML's ``safe_load`` raises more than ``yaml.YAMLError``: an explicit tag it cannot build
(``!!int x``, ``!!int`` alone, ``!!timestamp x``, ``!!bool maybe``) escapes from its constructors as
a ValueError, IndexError, AttributeError or KeyError, and deep nesting as a RecursionError. Every
loader of user YAML (price files, control-plane costs, Workflow YAML, KFP packages, the MLflow Job
template, the compiled artifacts ``llmpack cluster doctor`` reads) goes through here so each of those is
one line, exit 2.

``safe_load`` still expands aliases: a 344-byte "billion laughs" file (nine levels of nine ``*a``)
becomes 9^9 strings, gigabytes of memory and, once ``repr()``-ed into an error line, hundreds of MB
printed. No file llmpack reads needs an alias (the compilers write none), so the loader here refuses
the first one (:class:`_no_alias_loader`), and a file is read only up to :data:`MAX_FILE_BYTES`
(:func:`read_bytes`). Values quoted back in an error go through :func:`excerpt`, never a bare ``repr``.
"""

from __future__ import annotations

import errno
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from components import bounded
from components.errors import InputError

MAX_FILE_BYTES = 16 << 20  # any YAML file the CLI or a runner reads; the compiled artifacts are < 100 KiB
EXCERPT_CHARS = 60  # how much of a value an error line quotes back


def read_bytes(path: Path, where: str) -> bytes:
    """The file's bytes, up to :data:`MAX_FILE_BYTES`; past it one :class:`InputError` line ``WHERE: ...``.

    An OSError (missing, unreadable) is raised as is: each caller names it in its own words. A FIFO, device or
    directory is one :class:`InputError` (a FIFO would block the read for ever); the user's own symlink is followed.
    """
    if Path(path).is_dir():  # as open() says it: the callers word it ("cannot read ... (Is a directory)")
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    try:
        fd = bounded.open_regular(path, follow_symlinks=True)
    except InputError:
        raise InputError(f"{where}: not a regular file (a FIFO, device or directory is refused)") from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"{where}: larger than the {MAX_FILE_BYTES >> 20} MiB limit for a YAML file; "
                         "is it the right file?")
    return data


def read_text(path: Path, where: str, *, not_text: str | None = None) -> str:
    """:func:`read_bytes` as UTF-8 text; unreadable is ``WHERE: cannot read (why)``, other bytes ``not_text``.

    ``not_text``: the caller's line for a file that is not UTF-8 (default ``WHERE: not UTF-8 text``),
    for the callers whose words the hostile-input table (docs/internals/hostile-input.md) already holds.
    """
    try:
        return read_bytes(path, where).decode("utf-8")
    except OSError as exc:
        raise InputError(f"{where}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InputError(not_text or f"{where}: not UTF-8 text") from None


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters: a value quoted in an error line stays short."""
    if isinstance(value, (list, tuple, dict, set)) and len(value) > limit:  # repr of a huge container costs its size
        return f"<a {type(value).__name__} of {len(value)} items>"
    text = repr(value if not isinstance(value, str) else value[: limit + 1])
    return text if len(text) <= limit else text[: limit - 3] + "..."


@lru_cache(maxsize=1)
def _no_alias_loader() -> type:
    """PyYAML's SafeLoader, except that composing an alias (``*name``, ``<<: *name``) is a YAML error.

    Refused at compose time, before anything is expanded: a bomb costs no more than its own bytes.
    """
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"alias *{excerpt(event.anchor)[1:-1]} is not accepted (write the value out)",
                    event.start_mark)
            return super().compose_node(parent, index)

    return NoAliasLoader


def safe_load(text: str, where: str, *, documents: bool = False) -> Any:
    """``yaml.safe_load`` without aliases (or, with ``documents``, the list of its documents); bad YAML is an
    InputError ``WHERE: ...``."""
    import yaml

    loader = _no_alias_loader()
    try:
        return list(yaml.load_all(text, Loader=loader)) if documents else yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        at = f"line {mark.line + 1}: " if mark is not None else ""
        raise InputError(f"{where}: not valid YAML ({at}{problem[:200]})") from None
    except RecursionError:
        raise InputError(f"{where}: not valid YAML (nested too deeply)") from None
    except (ValueError, TypeError, AttributeError, LookupError, ArithmeticError) as exc:  # a tag it cannot build
        raise InputError(f"{where}: not valid YAML "
                         f"(a tagged value that cannot be built: {type(exc).__name__})") from None


def load_file(path: Path, where: str, *, documents: bool = False) -> Any:
    """:func:`read_bytes`, UTF-8 and :func:`safe_load` in one; an OSError is raised as is for the caller to word."""
    try:
        text = read_bytes(path, where).decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{where}: not UTF-8 text") from None
    return safe_load(text, where, documents=documents)
