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
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components import bounded
from components.errors import InputError

BUILTIN = "builtin"
HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"
VOCABULARY_SIZE = 4000  # distinct words the built-in set draws from, made from the seed
NUMBER_RANGE = 1000  # Add draws its two numbers from 0..NUMBER_RANGE-1


def builtin_vocabulary(seed: int = 0, size: int = VOCABULARY_SIZE) -> list[str]:
    """``size`` distinct pronounceable words (2-3 syllables), made from ``seed``: no fixed word list to memorise."""
    rng = random.Random(f"llmpack-vocabulary-{seed}")
    words: dict[str, None] = {}
    while len(words) < size:
        syllables = rng.randint(2, 3)
        words["".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))] = None
    return list(words)


def _held_out(items: list, fraction: float, rng: random.Random) -> tuple[list, list]:
    """``items`` split into (train pool, eval pool): about ``fraction`` of them held out, each pool non-empty."""
    order = list(items)
    rng.shuffle(order)
    n_eval = min(max(1, round(len(order) * fraction)), len(order) - 1)
    return order[n_eval:], order[:n_eval]


def _builtin_row(task: int, words: list[str], numbers: list[int], rng: random.Random) -> dict[str, str]:
    if task == 0:
        phrase = " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))
        return {"prompt": f"Uppercase: {phrase}", "response": phrase.upper()}
    if task == 1:
        word = rng.choice(words)
        return {"prompt": f"Reverse: {word}", "response": word[::-1]}
    a, b = rng.choice(numbers), rng.choice(numbers)
    return {"prompt": f"Add: {a}+{b}", "response": str(a + b)}


def builtin_split(n: int = 2000, seed: int = 0,
                  eval_fraction: float = 0.1) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The built-in set, split by construction: (train, eval), ``n`` rows in all.

    Three tasks with exact answers computable for any input: upper-case a phrase, reverse a word,
    add two numbers. The vocabulary (:func:`builtin_vocabulary`) and the numbers 0..999 are each
    split first: eval rows are made only of held-out words and numbers, train rows only of the
    rest, so no eval prompt, nor any word or number in it, appears in training ("unseen" means
    unseen). Eval prompts are distinct.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise InputError(f"eval_fraction {eval_fraction} must be between 0 and 1")
    if n < 2:
        raise InputError(f"need at least 2 rows to split into train and eval, got {n}")
    rng = random.Random(f"llmpack-builtin-{seed}")
    pool_fraction = min(max(eval_fraction, 0.2), 0.5)  # enough held-out inputs for distinct eval prompts
    train_words, eval_words = _held_out(builtin_vocabulary(seed), pool_fraction, rng)
    train_numbers, eval_numbers = _held_out(list(range(NUMBER_RANGE)), pool_fraction, rng)
    n_eval = min(max(1, int(round(n * eval_fraction))), n - 1)
    train = [_builtin_row(i % 3, train_words, train_numbers, rng) for i in range(n - n_eval)]
    evaluation: list[dict[str, str]] = []
    seen: set[str] = set()
    i = 0
    while len(evaluation) < n_eval:
        row = _builtin_row(i % 3, eval_words, eval_numbers, rng)
        i += 1
        if row["prompt"] not in seen or i > 50 * n_eval:  # distinct prompts (a guard for tiny pools)
            seen.add(row["prompt"])
            evaluation.append(row)
    return train, evaluation


def builtin_rows(n: int = 2000, seed: int = 0) -> list[dict[str, str]]:
    """``n`` built-in rows (train rows of :func:`builtin_split`, cycling the three tasks); for tests and tools."""
    rng = random.Random(f"llmpack-builtin-rows-{seed}")
    words, numbers = builtin_vocabulary(seed), list(range(NUMBER_RANGE))
    return [_builtin_row(i % 3, words, numbers, rng) for i in range(n)]


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


def prompt_key(row: dict[str, Any]) -> str:
    """A row's identity across splits: its prompt in Unicode's compatibility form (NFKC: a full-width or
    ligature spelling is its plain one), case folded, without invisible format characters (zero-width
    spaces, joiners, bidi marks), runs of whitespace collapsed. Variants a model reads as the same
    prompt are one prompt, so none of them is trained on while another is held out."""
    text = unicodedata.normalize("NFKC", _visible(str(row["prompt"]))).casefold()
    return " ".join(_visible(text).split())


# Unicode's default-ignorable code points (DerivedCoreProperties) and format characters: invisible, so a prompt
# with one inside is the same prompt; stripped before NFKC too (a joiner between a letter and its accent keeps
# them from composing) and after it.
_IGNORABLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
                        "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
                        "\U000e0000-\U000e0fff]")


def _visible(text: str) -> str:
    """``text`` without default-ignorable code points or format characters (category Cf)."""
    return "".join(c for c in _IGNORABLE.sub("", text) if unicodedata.category(c) != "Cf")


def split_rows(rows: list[dict[str, Any]], *, seed: int,
               eval_fraction: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Split by prompt identity: (train, eval, duplicates).

    Rows are grouped by :func:`prompt_key`; the groups are shuffled by ``seed`` and about
    ``eval_fraction`` of the rows' groups (at least one) go to eval, so a prompt is never on both
    sides. Eval keeps one row per prompt; train keeps every copy. ``duplicates`` counts the rows
    beyond the first of each prompt (reported by prepare_data).
    """
    if not 0.0 < eval_fraction < 1.0:
        raise InputError(f"eval_fraction {eval_fraction} must be between 0 and 1")
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(prompt_key(row), []).append(row)
    if len(groups) < 2:
        raise InputError(f"need at least 2 distinct prompts to split into train and eval, got {len(groups)}"
                         f" ({len(rows)} row{'' if len(rows) == 1 else 's'})")
    keys = list(groups)
    random.Random(seed).shuffle(keys)
    n_eval = min(max(1, int(round(len(keys) * eval_fraction))), len(keys) - 1)
    evaluation = [groups[k][0] for k in keys[-n_eval:]]
    train = [row for k in keys[:-n_eval] for row in groups[k]]
    return train, evaluation, len(rows) - len(groups)


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
