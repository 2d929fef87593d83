"""Task evaluation: greedy answers to the held-out prompts, scored by exact and normalised match.

Loss says the tuned model got closer to the answers; this says whether it *gives* them
(``Reverse: apple`` -> ``elppa``). tokenize writes the held-out prompts as token ids with their
expected answers (:data:`TASK_FILE`); evaluate answers each one greedily, base and tuned, in the
same batches on every path, so every path scores the same figures (docs/serving.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from components import bounded
from components.errors import InputError
from components.training.tiny import ByteTokenizer

TASK_FILE = "eval_prompts.jsonl"
# Generation is bounded twice: at most this many held-out rows (the first of the seeded eval
# split), and per batch as many new tokens as the longest expected answer (its end token
# included), at most MAX_NEW_TOKENS. An answer longer than the expected one cannot match exactly.
MAX_TASK_ROWS = 256
MAX_NEW_TOKENS = 64
# Tokens (prompt width + new tokens, times rows) in one generation batch: the 200 built-in prompts
# of the default run in one batch; about 85 rows of a 128-token prompt for a larger model.
MAX_BATCH_TOKENS = 16384

GateMetric = Literal["auto", "eval_loss", "exact_match", "normalised_match"]
GATE_METRICS: tuple[str, ...] = ("auto", "eval_loss", "exact_match", "normalised_match")
TASK_METRICS = ("exact_match", "normalised_match")


def normalise(text: str) -> str:
    """The text a normalised match compares: stripped, runs of whitespace as one space, casefolded."""
    return " ".join(text.split()).casefold()


@dataclass(frozen=True, kw_only=True)
class TaskScore:
    """Fractions of rows answered exactly and after :func:`normalise`, overall and per built-in task."""

    rows: int
    exact_match: float
    normalised_match: float
    per_task: dict[str, float] = field(default_factory=dict)  # exact match by task name, where rows name one


def score(answers: list[str], rows: list[dict[str, Any]]) -> TaskScore:
    """Score ``answers[i]`` against ``rows[i]["response"]`` (rows with a ``task`` also count per task)."""
    if len(answers) != len(rows):
        raise ValueError(f"{len(answers)} answers for {len(rows)} rows")
    exact = [a == r["response"] for a, r in zip(answers, rows, strict=True)]
    loose = [normalise(a) == normalise(r["response"]) for a, r in zip(answers, rows, strict=True)]
    tasks: dict[str, list[bool]] = {}
    for hit, row in zip(exact, rows, strict=True):
        if row.get("task"):
            tasks.setdefault(row["task"], []).append(hit)
    n = max(1, len(rows))
    return TaskScore(rows=len(rows), exact_match=sum(exact) / n, normalised_match=sum(loose) / n,
                     per_task={t: sum(h) / len(h) for t, h in sorted(tasks.items())})


def task_rows(pairs: list[tuple[list[int], list[int]]], rows: list[dict[str, Any]], *, max_prompt_tokens: int,
              task_of: Any) -> tuple[list[dict[str, Any]], int]:
    """The prompts to answer, as tokenize writes them, and how many were left out for length.

    A prompt longer than ``max_prompt_tokens`` (the training window) is left out: the model never
    saw a context that long. At most :data:`MAX_TASK_ROWS` rows, the first of the split.
    """
    kept, too_long = [], 0
    for (prompt, response), row in zip(pairs, rows, strict=True):
        if len(kept) == MAX_TASK_ROWS:
            break
        if len(prompt) > max_prompt_tokens:
            too_long += 1
            continue
        kept.append({"prompt_ids": prompt, "answer_tokens": len(response), "response": row["response"],
                     "task": task_of(row["prompt"])})
    return kept, too_long


def write_task_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def read_task_rows(path: Path) -> list[dict[str, Any]]:
    """The rows :func:`write_task_rows` wrote; none when the file is absent (tokens from an older run)."""
    if not path.is_file():
        return []
    return [bounded.loads(line, str(path)) for line in bounded.iter_lines(path) if line.strip()]


def decode_answer(tokenizer: Any, ids: list[int]) -> str:
    """An answer's text: the byte tokenizer's, or a Hugging Face tokenizer's without its special tokens."""
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.decode(ids)
    return tokenizer.decode(ids, skip_special_tokens=True)


def batches(rows: list[dict[str, Any]], max_tokens: int) -> list[list[dict[str, Any]]]:
    """The rows in order, cut into batches of at most ``max_tokens`` (prompt width + new tokens, times rows).

    Few, large batches: each ``generate`` call has a fixed cost, and on a CPU a batch of 16 took
    five times as long per row as one of 256. At least one row per batch, however long.
    """
    out: list[list[dict[str, Any]]] = []
    batch: list[dict[str, Any]] = []
    width = new = 0
    for row in rows:
        w, n = max(width, len(row["prompt_ids"])), max(new, min(MAX_NEW_TOKENS, row["answer_tokens"]))
        if batch and (len(batch) + 1) * (w + n) > max_tokens:
            out.append(batch)
            batch, w, n = [], len(row["prompt_ids"]), min(MAX_NEW_TOKENS, row["answer_tokens"])
        batch.append(row)
        width, new = w, n
    return out + ([batch] if batch else [])


def greedy_answers(net: Any, rows: list[dict[str, Any]], *, tokenizer: Any, eos_id: int, pad_id: int, device: Any,
                   amp_dtype: Any, max_batch_tokens: int = MAX_BATCH_TOKENS) -> list[str]:
    """Each row's greedy answer, cut at the end token, decoded.

    Batches (:func:`batches`) are left-padded, with an attention mask, in the rows' order, so every
    path builds the same batches and, with the CPU's deterministic algorithms, gives the same tokens.
    """
    import torch

    answers: list[str] = []
    net.eval()
    for batch in batches(rows, max_batch_tokens):
        width = max(len(r["prompt_ids"]) for r in batch)
        ids = torch.tensor([[pad_id] * (width - len(r["prompt_ids"])) + r["prompt_ids"] for r in batch], device=device)
        mask = torch.tensor([[0] * (width - len(r["prompt_ids"])) + [1] * len(r["prompt_ids"]) for r in batch],
                            device=device)
        new_tokens = min(MAX_NEW_TOKENS, max(r["answer_tokens"] for r in batch))
        with torch.no_grad(), torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            out = net.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                               eos_token_id=eos_id, pad_token_id=pad_id)
        for generated in out[:, width:].tolist():
            cut = generated.index(eos_id) if eos_id in generated else len(generated)
            answers.append(decode_answer(tokenizer, generated[:cut]))
    return answers


def choose_gate(gate_metric: str, rows: int) -> str:
    """The metric the quality gate judges: ``auto`` is exact match when there are answers to score, else eval loss."""
    if gate_metric not in GATE_METRICS:
        raise InputError(f"gate_metric {gate_metric!r}: use one of {', '.join(GATE_METRICS)}")
    if gate_metric == "auto":
        return "exact_match" if rows else "eval_loss"
    if gate_metric in TASK_METRICS and not rows:
        raise InputError(f"gate_metric {gate_metric}: the eval split has no prompt short enough to answer "
                         f"(longer than seq_len); use gate_metric=eval_loss or a larger seq_len")
    return gate_metric


def gate_improvement(gate: str, result: dict[str, float]) -> float:
    """How much better tuned is than base on the gated metric (positive: better)."""
    if gate == "eval_loss":
        return result["base_eval_loss"] - result["eval_loss"]
    return result[f"tuned_{gate}"] - result[f"base_{gate}"]
