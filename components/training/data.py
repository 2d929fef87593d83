"""Instruction data: the built-in synthetic set, JSONL loading with row validation, the split.

Rows are normalised to ``{"prompt": str, "response": str}``; chat rows keep their ``messages``
as well so a real tokenizer can apply its chat template.
"""

from __future__ import annotations

import codecs
import errno
import json
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components import bounded
from components.errors import InputError

BUILTIN = "builtin"
HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

_WORDS = (
    "apple river stone cloud tiger maple ocean pixel rocket garden silver laser "
    "violet falcon quartz ember lemon harbor meadow nickel orbit piano"
).split()


def builtin_rows(n: int = 2000, seed: int = 0) -> list[dict[str, str]]:
    """Deterministic synthetic instructions a tiny byte-level model can visibly learn.

    Three tasks with exact answers: upper-case a phrase, reverse a word, add two numbers.
    """
    rng = random.Random(f"llmpack-builtin-{seed}")
    rows = []
    for i in range(n):
        task = i % 3
        if task == 0:
            phrase = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
            rows.append({"prompt": f"Uppercase: {phrase}", "response": phrase.upper()})
        elif task == 1:
            word = rng.choice(_WORDS)
            rows.append({"prompt": f"Reverse: {word}", "response": word[::-1]})
        else:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            rows.append({"prompt": f"Add: {a}+{b}", "response": str(a + b)})
    return rows


# The built-in tasks by the word that starts their prompts (``Reverse: maple``): task evaluation
# reports exact match per task for rows that start so (components.training.generation).
BUILTIN_TASKS = {"Uppercase": "uppercase", "Reverse": "reverse", "Add": "add"}


def builtin_task(prompt: str) -> str | None:
    """The built-in task a prompt asks for (``uppercase``, ``reverse``, ``add``), or None for any other prompt."""
    head, colon, _ = prompt.partition(": ")
    return BUILTIN_TASKS.get(head) if colon else None


def _text(value: Any, field: str, where: str) -> str:
    """A string field that can be written back as UTF-8 (JSON's ``\\ud800`` escapes can make one that cannot)."""
    if not isinstance(value, str):
        raise InputError(f"{where}: field {field!r} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{where}: field {field!r} holds a lone surrogate escape (\\ud800-\\udfff), "
                         "not text") from None
    return value


def _normalise(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise InputError(f"{where}: field 'messages' must be a non-empty list")
        for j, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise InputError(f"{where}: messages[{j}] needs string 'role' and 'content'")
            _text(m["role"], f"messages[{j}].role", where)
            _text(m["content"], f"messages[{j}].content", where)
        if msgs[-1]["role"] != "assistant":
            raise InputError(f"{where}: the last message must have role 'assistant'")
        prompt = "\n".join(f"{m['role']}: {m['content']}" for m in msgs[:-1])
        return {"prompt": prompt, "response": msgs[-1]["content"], "messages": msgs}
    for key in ("prompt", "response"):
        if key not in obj:
            raise InputError(f"{where}: missing field {key!r} (need 'prompt' and 'response', or 'messages')")
        _text(obj[key], key, where)
    if not obj["response"]:
        raise InputError(f"{where}: field 'response' is empty")
    return {"prompt": obj["prompt"], "response": obj["response"]}


def _check_file(p: Path) -> None:
    """One line saying why ``p`` is not a data file (missing, a broken link, a directory, a pipe); nothing when it is.

    A FIFO or device is refused: validation would drain it and the prepare_data step would find
    it empty (or wait forever).
    """
    if p.is_symlink() and not p.exists():
        try:
            p.resolve(strict=True)
        except RuntimeError:  # Python 3.11: a symlink loop
            raise InputError(f"{p}: symbolic link loop") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InputError(f"{p}: symbolic link loop") from None
        raise InputError(f"{p}: broken symbolic link (to {os.readlink(p)})")
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, expected a JSONL file")
    if not p.is_file():
        raise InputError(f"{p}: not a regular file (a pipe or device?); save the data to a file first")


def _lines(p: Path, max_line: int = bounded.MAX_LINE_BYTES, limit: int = bounded.MAX_JSONL_BYTES) -> Iterator[bytes]:
    """The file's lines (``\\n`` only), each at most ``max_line`` bytes and ``limit`` in all (a named symlink
    is followed to a regular file: the user named it); one line naming the limit past it."""
    try:
        yield from bounded.iter_lines(p, max_line, limit, follow_symlinks=True)
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror or exc})") from None


def read_jsonl(path: str | Path, *, skip_bad_rows: bool = False) -> tuple[list[dict[str, Any]], int]:
    """Read and validate every row; returns (rows, skipped). Errors name file and line.

    Lines end at ``\\n`` only (JSON Lines): U+2028 and friends inside a JSON string are text, not
    line breaks, so ``str.splitlines`` is not used. A leading UTF-8 byte order mark is ignored. A line
    over 1 MiB or a file over 256 MiB (:mod:`components.bounded`) is refused, ``skip_bad_rows`` or not.
    """
    p = Path(path)
    _check_file(p)
    rows: list[dict[str, Any]] = []
    skipped = 0
    for lineno, raw in enumerate(_lines(p), start=1):
        if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8):]
        where = f"{p}:{lineno}"
        try:
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{where}: not UTF-8 text (byte {exc.start + 1} of the line)") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{where}: malformed JSON ({exc.msg})") from None
            except RecursionError:
                raise InputError(f"{where}: JSON nested too deeply") from None
            rows.append(_normalise(obj, where))
        except InputError:
            if not skip_bad_rows:
                raise
            skipped += 1
    if not rows:
        raise InputError(f"{p}: no rows (empty file)" if not skipped else f"{p}: every row was invalid")
    return rows, skipped


def load_hf_dataset(dataset_id: str, split: str = "train") -> list[dict[str, Any]]:
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError:
        raise InputError(f"data {dataset_id!r}: Hugging Face ids need the 'datasets' package "
                         "(pip install datasets)") from None
    try:
        ds = datasets.load_dataset(dataset_id, split=split)
    except Exception as exc:  # noqa: BLE001 - any hub failure is one line for the user
        raise InputError(f"data {dataset_id!r}: cannot load from the Hugging Face hub ({type(exc).__name__})") from None
    return [_normalise(dict(r), f"{dataset_id}[{i}]") for i, r in enumerate(ds)]


def is_file_ref(source: str) -> bool:
    return source.endswith((".jsonl", ".json")) or "/" not in source or source.startswith((".", "/", "~"))


def load_rows(source: str, *, seed: int = 0, skip_bad_rows: bool = False,
              builtin_size: int = 2000) -> tuple[list[dict[str, Any]], int]:
    """Rows from ``builtin``, a JSONL file, or a Hugging Face dataset id. Returns (rows, skipped)."""
    if source == BUILTIN:
        return builtin_rows(builtin_size, seed), 0
    if Path(source).expanduser().exists() or is_file_ref(source) or not HF_ID.match(source):
        return read_jsonl(Path(source).expanduser(), skip_bad_rows=skip_bad_rows)
    return load_hf_dataset(source), 0


def split_rows(rows: list[dict[str, Any]], *, seed: int,
               eval_fraction: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Seeded shuffle, then the last ``eval_fraction`` (at least one row) is the eval split."""
    if not 0.0 < eval_fraction < 1.0:
        raise InputError(f"eval_fraction {eval_fraction} must be between 0 and 1")
    if len(rows) < 2:
        raise InputError(f"need at least 2 rows to split into train and eval, got {len(rows)}")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_eval = min(max(1, int(round(len(rows) * eval_fraction))), len(rows) - 1)
    shuffled = [rows[i] for i in order]
    return shuffled[:-n_eval], shuffled[-n_eval:]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")


def read_split(path: Path) -> list[dict[str, Any]]:
    """Rows :func:`write_jsonl` wrote. Lines end at ``\\n`` only: it writes U+2028, U+2029 and U+0085
    inside strings as they are (``ensure_ascii=False``), and ``str.splitlines`` would cut there."""
    # a written row holds its prompt twice at most (a chat row's messages and their joined prompt): 4x the limits
    return [json.loads(line) for line in _lines(Path(path), 4 * bounded.MAX_LINE_BYTES, 4 * bounded.MAX_JSONL_BYTES)
            if line.strip()]
