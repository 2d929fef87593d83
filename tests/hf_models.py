"""Small real Hugging Face model directories, built offline in seconds, for the ``--model DIR`` path.

What a real user points ``--model`` at: a directory with ``config.json``, safetensors weights, a
fast tokenizer (``tokenizer.json``) and a chat template. :func:`build_model_dir` writes one for a
tiny Llama or Qwen2 with a byte-level BPE tokenizer trained here (with the ``tokenizers``
library) on the built-in data's text; the chat template is Llama-3-like (header tokens) for
``llama`` and ChatML for ``qwen2``. :func:`write_chat_jsonl` writes chat rows
(``{"messages": [...]}``) from the same built-in data. Same arguments, same files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.training.data import builtin_rows

ARCHS = ("llama", "qwen2")
SYSTEM_PROMPT = "You are a helpful assistant."
ROLES = ("system", "user", "assistant")
# transformers' Qwen2 pre-tokenizer pattern (models/qwen2/tokenization_qwen2.py).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Special tokens and chat template per architecture (the shapes of the real Llama 3 and Qwen2 ones).
SPECIAL: dict[str, dict[str, Any]] = {
    "llama": {
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "pad": "<|finetune_right_pad_id|>",
        "extra": ["<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"],
        "chat_template": (
            "{{ bos_token }}{% for message in messages %}"
            "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>"
            "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
        ),
    },
    "qwen2": {
        "bos": None,  # Qwen2 has no BOS; the template starts each turn with <|im_start|>
        "eos": "<|im_end|>",
        "pad": "<|endoftext|>",
        "extra": ["<|im_start|>"],
        "chat_template": (
            "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    },
}


def chat_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` chat rows (system, user, assistant) made from :func:`components.training.data.builtin_rows`."""
    return [
        {"messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": row["prompt"]},
            {"role": "assistant", "content": row["response"]},
        ]}
        for row in builtin_rows(n, seed)
    ]


def write_chat_jsonl(path: str | Path, n: int, seed: int = 0) -> Path:
    """Write ``n`` chat rows as JSONL (what ``--data FILE`` reads); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in chat_rows(n, seed):
            fh.write(json.dumps(row, sort_keys=True) + "\n")
    return path


def _training_text(n_rows: int = 600) -> list[str]:
    """What the tokenizer learns its merges from: the built-in data plus the chat role words."""
    text = [f"{r['prompt']}\n{r['response']}" for r in builtin_rows(n_rows, 0)]
    return text + [SYSTEM_PROMPT, *ROLES, *(f"{role}\n" for role in ROLES)]


def build_tokenizer(arch: str = "llama", vocab_size: int = 400) -> Any:
    """A real fast tokenizer: byte-level BPE trained here, with bos/eos/pad and a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if arch not in SPECIAL:
        raise ValueError(f"arch {arch!r}: expected one of {ARCHS}")
    spec = SPECIAL[arch]
    specials = [t for t in (spec["bos"], spec["eos"], spec["pad"], *spec["extra"]) if t]
    tok = Tokenizer(models.BPE())
    if arch == "qwen2":
        # Qwen2's own pre-tokenizer and normalizer: transformers loads a qwen2 model's tokenizer
        # as Qwen2Tokenizer, which puts these in place whatever tokenizer.json says.
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodes: no unknown tokens
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    if spec["bos"]:  # like Llama 3: plain text gets BOS (the chat template writes its own)
        bos = spec["bos"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=spec["bos"],
        eos_token=spec["eos"],
        pad_token=spec["pad"],
        additional_special_tokens=spec["extra"],
        chat_template=spec["chat_template"],
        model_max_length=512,
    )


def build_model_dir(
    path: str | Path,
    arch: str = "llama",
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 400,
    seed: int = 0,
) -> Path:
    """Write a tiny ``arch`` causal LM with its own tokenizer and chat template into ``path``."""
    import torch

    tokenizer = build_tokenizer(arch, vocab_size)
    common: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": 512,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if arch == "llama":
        from transformers import LlamaConfig as Config
        from transformers import LlamaForCausalLM as Model

        config = Config(**common, tie_word_embeddings=False)
    else:
        from transformers import Qwen2Config as Config
        from transformers import Qwen2ForCausalLM as Model

        config = Config(**common, tie_word_embeddings=True)  # as the small Qwen2 checkpoints
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Model(config)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
