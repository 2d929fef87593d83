"""tokenize: rows -> fixed-length packed sequences, prompt tokens masked out of the loss; the held-out prompts
to answer."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from components.dsl import Dataset, Execution, Input, Output, Resources, step
from components.errors import InputError
from components.serving.sealed import DATASET, TOKENS, private_copy, sealed_output, verified_seal
from components.training.data import builtin_task, read_split
from components.training.generation import TASK_FILE, task_rows, write_task_rows
from components.training.pretrained import is_alias
from components.training.tiny import TINY, ByteTokenizer

IGNORE = -100


def pair_ids(tokenizer: Any, row: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) for one row, with the model's chat template when it has one."""
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.encode_pair(row["prompt"], row["response"])
    messages = row.get("messages") or [
        {"role": "user", "content": row["prompt"]},
        {"role": "assistant", "content": row["response"]},
    ]
    if getattr(tokenizer, "chat_template", None):
        prompt = list(tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True,
                                                    return_dict=False))
        full = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))
        if full[: len(prompt)] != prompt:
            raise InputError("tokenizer chat template does not extend the prompt; cannot mask prompt tokens")
        return prompt, full[len(prompt) :]
    prompt = list(tokenizer(row["prompt"] + "\n")["input_ids"])
    response = list(tokenizer(row["response"], add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        response.append(tokenizer.eos_token_id)
    return prompt, response


def pack(pairs: list[tuple[list[int], list[int]]], seq_len: int, pad_id: int, *,
         keep_tail: bool) -> tuple[list[list[int]], list[list[int]]]:
    """Concatenate examples into one stream and cut it into ``seq_len`` blocks (no padding waste).

    Labels are the token ids with prompt tokens set to -100. The last partial block is dropped
    for training and padded (labels -100) for evaluation, so evaluation sees every token.
    """
    ids: list[int] = []
    labels: list[int] = []
    for prompt, response in pairs:
        ids += prompt + response
        labels += [IGNORE] * len(prompt) + response
    blocks, block_labels = [], []
    for start in range(0, len(ids), seq_len):
        chunk, lab = ids[start : start + seq_len], labels[start : start + seq_len]
        if len(chunk) < seq_len:
            if not keep_tail:
                break
            lab = lab + [IGNORE] * (seq_len - len(chunk))
            chunk = chunk + [pad_id] * (seq_len - len(chunk))
        blocks.append(chunk)
        block_labels.append(lab)
    return blocks, block_labels


def load_tokenizer(model: str) -> Any:
    if model == TINY:
        return ByteTokenizer()
    from components.training.modeling import check_model_ref, local_source

    if is_alias(model):
        check_model_ref(model)  # one line saying how to install it
    from transformers import AutoTokenizer

    # as load_base_model reads it: "~/models/x" is a directory, not a hub id; an alias, its cached directory
    source = local_source(model)
    try:
        return AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise InputError(f"model {model!r}: cannot load its tokenizer ({type(exc).__name__})") from None


@step(execution=Execution(resources=Resources(cpu=2, memory="4Gi"), hf_cache=True))
def tokenize(dataset: Input[Dataset], tokens: Output[Dataset], model: str = "tiny", seq_len: int = 128) -> None:
    """Tokenize (byte-level for tiny, the model's own tokenizer otherwise) and pack to seq_len."""
    import numpy as np

    from components.reporting import current, metric

    if seq_len < 8:
        raise InputError(f"seq_len {seq_len} is too small (minimum 8)")
    tokenizer = load_tokenizer(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    tel = current()
    pipeline_run = tel.ctx.pipeline_run if tel is not None else ""
    counts = {}
    # the split prepare_data signed, read from a private copy (never the shared volume a writer can swap),
    # written in this process's own directory, then copied out and sealed: evaluate scores exactly these bytes
    split_files = verified_seal(Path(dataset.path), pipeline_run, DATASET)["files"]
    needed = {name: split_files[name] for name in ("train.jsonl", "eval.jsonl") if name in split_files}
    if len(needed) != 2:
        raise InputError(f"{dataset.path}: prepare_data's seal names no train.jsonl and eval.jsonl")
    with tempfile.TemporaryDirectory(prefix="llmpack-split-") as private, \
            sealed_output(Path(tokens.path), TOKENS, pipeline_run) as out:
        split_dir = private_copy(Path(dataset.path), needed, Path(private) / "dataset")
        for split, keep_tail in (("train", False), ("eval", True)):
            rows = read_split(split_dir / f"{split}.jsonl")
            pairs = [pair_ids(tokenizer, row) for row in rows]
            if split == "eval":  # the held-out prompts evaluate answers, with their expected answers
                answerable, too_long = task_rows(pairs, rows, max_prompt_tokens=seq_len, task_of=builtin_task)
                write_task_rows(out / TASK_FILE, answerable)
                metric("task_rows_too_long", too_long)
            blocks, labels = pack(pairs, seq_len, pad_id, keep_tail=keep_tail)
            if not blocks:
                raise InputError(f"{split} split has fewer than {seq_len} tokens; lower seq_len or add data")
            np.save(out / f"{split}_input_ids.npy", np.asarray(blocks, dtype=np.int64))
            np.save(out / f"{split}_labels.npy", np.asarray(labels, dtype=np.int64))
            counts[split] = len(blocks)
        meta = {"model": model, "seq_len": seq_len, "pad_id": int(pad_id), "train_blocks": counts["train"],
                "eval_blocks": counts["eval"]}
        (out / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    metric("train_tokens_available", counts["train"] * seq_len)
