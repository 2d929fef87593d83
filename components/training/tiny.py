"""The embedded ``tiny`` model: a small Llama config and a byte-level tokenizer, built in code.

No download, ever: ``--model tiny`` builds the same randomly initialised base model from a fixed
seed in every process, so every step and every orchestrator path sees identical weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

TINY = "tiny"
TINY_INIT_SEED = 1234  # the identity of the tiny base model; unrelated to the training seed

BOS_ID, EOS_ID, PAD_ID = 256, 257, 258
VOCAB_SIZE = 259

TINY_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 352,
    # two, not four: it learns the built-in tasks in the default steps (docs/internals/decisions.md)
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
}


# LoRA on ``tiny`` also trains these two modules whole (peft's ``modules_to_save``). The base is
# random: its output head of std 0.02 behind a unit-scale RMSNorm caps every logit near 2.6, so
# adapters on the linear layers alone cannot make a confident prediction (eval loss stays near 4.8),
# and its embeddings carry no meaning to adapt. A pretrained model's head and embeddings are
# meaningful and large (a 1B model's: 260M parameters), so only ``tiny`` gets this.
TINY_MODULES_TO_SAVE = ("embed_tokens", "lm_head")


class ByteTokenizer:
    """UTF-8 bytes are token ids 0-255; 256-258 are BOS, EOS and PAD."""

    bos_token_id = BOS_ID
    eos_token_id = EOS_ID
    pad_token_id = PAD_ID
    vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def encode_pair(self, prompt: str, response: str) -> tuple[list[int], list[int]]:
        """Token ids of the prompt (BOS + prompt + newline) and of the response (+ EOS)."""
        return [BOS_ID, *self.encode(prompt + "\n")], [*self.encode(response), EOS_ID]


def build_tiny_model() -> LlamaForCausalLM:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**TINY_CONFIG)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(TINY_INIT_SEED)
        model = LlamaForCausalLM(config)
    model.config.name_or_path = TINY
    return model
