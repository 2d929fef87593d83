"""Bounded readers: every file llmpack reads that someone else could have written goes through here.

A regular file is required (a FIFO would block for ever, a device such as ``/dev/zero`` never ends,
a symlink may point anywhere: each refused before a byte is read); the size is capped before
parsing; JSON nesting is capped (CPython's decoder recurses); JSONL lines are capped one by one.
Every refusal is one :class:`InputError` line naming the file and the limit.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from components.errors import InputError

MAX_JSON_BYTES = 8 << 20  # a summary, manifest, state or metrics file: KiBs in practice
MAX_JSONL_BYTES = 256 << 20  # an events file or a data set
MAX_LINE_BYTES = 1 << 20  # one JSONL record
MAX_DEPTH = 64  # nesting of a JSON value


def open_regular(path: str | Path, *, follow_symlinks: bool = False) -> int:
    """A read-only descriptor on ``path`` when it is a regular file; else one :class:`InputError`.

    Opened non-blocking (a FIFO cannot hang the open) and, unless ``follow_symlinks``, without
    following a final symlink. The caller closes the descriptor.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise  # the callers' own question: absent
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise InputError(f"{path}: a symlink where a regular file is expected") from None
        if exc.errno in (errno.ENOTDIR, errno.EISDIR):  # a directory on the way swapped for a file, or the reverse
            raise InputError(f"{path}: not a regular file ({exc.strerror}: a path on the way is not a directory, "
                             "or it is one)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputError(f"{path}: not a regular file (a FIFO, device or directory is refused)")
    os.set_blocking(fd, True)
    return fd


# The directories a step was given (its outputs, its checkpoint directory), by device and inode as they were when
# the step began: a directory on the way to them swapped since (for a link to the user's own files) is refused
# before anything is written or removed under it, not only a link in the last place (O_NOFOLLOW).
_PINNED: dict[str, tuple[int, int]] = {}


def pin_directory(path: str | Path, *, real_levels: int = 0) -> None:
    """Remember the directory at ``path`` as it is now (the step's own output or checkpoint directory).

    ``real_levels``: that many directories, ``path`` and up, must be real ones (lstat, not a symlink): the
    levels the orchestrator made for the run (``<run>/<task>/<output>``), where a link is never its own but
    one a writer of the volume swapped in before the step began. Else one :class:`InputError`.
    """
    level = Path(os.path.abspath(path))
    for _ in range(real_levels):
        if level.is_symlink():
            raise InputError(f"{level}: a symlink where the run's directory should be (swapped by a writer of the "
                             "volume?); nothing was written there")
        level = level.parent
    st = os.stat(path)
    _PINNED[os.path.abspath(path)] = (st.st_dev, st.st_ino)


def check_pinned_fd(path: str | Path, fd: int) -> None:
    """When ``path`` is pinned, the directory open as ``fd`` must be the pinned one (what is done relative to
    ``fd`` then lands in it, whatever is swapped after: no race); else one :class:`InputError`."""
    identity = _PINNED.get(os.path.abspath(path))
    if identity is not None:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != identity:
            raise InputError(f"{path}: not the directory the step began with (it, or a directory on the way to it, "
                             "was swapped, perhaps for a link); nothing written or removed there")


@contextlib.contextmanager
def pinned_directories(paths: Iterable[str | Path], *, real_levels: int = 0) -> Iterator[None]:
    """``paths`` pinned while the block runs (a step); the pins made inside it are dropped with them."""
    before = dict(_PINNED)
    try:
        for path in paths:
            pin_directory(path, real_levels=real_levels)
        yield
    finally:
        _PINNED.clear()
        _PINNED.update(before)


def check_pinned(path: str | Path) -> None:
    """Every pinned directory at or above ``path`` still the one pinned; else one :class:`InputError`."""
    target = os.path.abspath(path)
    for pinned, identity in _PINNED.items():
        if target == pinned or target.startswith(pinned.rstrip(os.sep) + os.sep):
            try:
                st = os.stat(pinned)
                now: tuple[int, int] | None = (st.st_dev, st.st_ino)
            except OSError:
                now = None
            if now != identity:
                raise InputError(f"{pinned}: not the directory the step began with (it, or a directory on the way "
                                 "to it, was swapped, perhaps for a link); nothing written or removed there")


def _parent_fd(path: Path) -> int:
    """The directory ``path`` is in, open by descriptor; that directory swapped for a symlink is refused, so what is
    written next, relative to the descriptor, lands in it and never where a planted link points."""
    check_pinned(path.parent)
    try:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise InputError(f"{path.parent}: not a directory to write {path.name} in ({exc.strerror}; a symlink is "
                         "refused); nothing was written") from None
    try:
        check_pinned_fd(path.parent, fd)  # the directory opened is the pinned one: no race after the check above
    except InputError:
        os.close(fd)
        raise
    return fd


def write_atomic(path: str | Path, data: bytes) -> None:
    """``data`` written whole at ``path``: through a new temporary file beside it (``O_EXCL|O_NOFOLLOW``: a planted
    link or FIFO is never opened) and a rename (which replaces the name, never a link's target), both relative to
    the directory opened first (that directory swapped for a link is refused). A ``path`` that exists as anything
    but a regular file (a symlink, FIFO, device, directory) is one :class:`InputError`."""
    path = Path(path)
    dir_fd = _parent_fd(path)
    try:
        try:
            st = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(st.st_mode):
                raise InputError(f"{path}: not a regular file (a symlink, FIFO or device is refused); nothing was "
                                 "written")
        tmp = f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


def open_append(path: str | Path, mode: int = 0o644) -> int:
    """A descriptor to append to ``path`` (made if absent), never through a planted link (``O_NOFOLLOW``, relative to
    its directory opened first: that directory swapped for a link is refused too); a FIFO, device or directory
    there is one :class:`InputError`."""
    path = Path(path)
    dir_fd = _parent_fd(path)
    try:
        fd = os.open(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, mode,
                     dir_fd=dir_fd)
    except OSError as exc:
        raise InputError(f"{path}: cannot be opened to append ({exc.strerror}; a symlink is refused)") from None
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{path}: not a regular file (a symlink, FIFO or device is refused)")
    os.set_blocking(fd, True)
    return fd


def read_bytes(path: str | Path, limit: int = MAX_JSON_BYTES, *, follow_symlinks: bool = False) -> bytes:
    """The whole file, when it is a regular file of at most ``limit`` bytes."""
    fd = open_regular(path, follow_symlinks=follow_symlinks)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{path}: larger than the {_size(limit)} limit for this file")
    return data


def depth(value: Any) -> int:
    """How deeply ``value`` nests lists and dicts (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level + 1)
            stack.extend((child, level + 1) for child in item if isinstance(child, (dict, list)))
    return deepest


def loads(text: str | bytes, where: str, max_depth: int = MAX_DEPTH, *, allow_nan: bool = False) -> Any:
    """JSON parsed with NaN/Infinity refused and nesting capped; else one :class:`InputError` naming ``where``.

    ``allow_nan``: NaN and Infinity read as floats (a summary our own writer may hold them in: a diverged
    loss), for a caller that screens numbers itself."""

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        value = json.loads(text, parse_constant=None if allow_nan else no_constant)
    except RecursionError:
        raise InputError(f"{where}: JSON nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: not valid JSON ({str(exc)[:80]})") from None
    if depth(value) > max_depth:
        raise InputError(f"{where}: JSON nested deeper than {max_depth} levels")
    return value


def read_json(path: str | Path, limit: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH,
              *, follow_symlinks: bool = False, allow_nan: bool = False) -> Any:
    """A JSON file: regular, at most ``limit`` bytes, nested at most ``max_depth``."""
    return loads(read_bytes(path, limit, follow_symlinks=follow_symlinks), str(path), max_depth, allow_nan=allow_nan)


def iter_lines(path: str | Path, max_line: int = MAX_LINE_BYTES, limit: int = MAX_JSONL_BYTES,
               *, follow_symlinks: bool = False) -> Iterator[bytes]:
    """The file's lines (newline stripped), each at most ``max_line`` bytes, ``limit`` bytes in all."""
    fd = open_regular(path, follow_symlinks=follow_symlinks)
    total = 0
    with os.fdopen(fd, "rb") as fh:
        while True:
            line = fh.readline(max_line + 2)
            if not line:
                return
            total += len(line)
            if total > limit:
                raise InputError(f"{path}: larger than the {_size(limit)} limit for this file")
            body = line.rstrip(b"\r\n")
            if len(body) > max_line:
                raise InputError(f"{path}: a line longer than the {_size(max_line)} limit per line")
            yield body


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
