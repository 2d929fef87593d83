"""The served model: an MLflow pyfunc "model from code" that answers prompts with greedy generations.

Copied into every logged model and run by ``mlflow.pyfunc.load_model`` and ``mlflow models serve``
(models-from-code: this file, never a pickle); it imports no llmpack module, only torch,
transformers, peft (for an adapter) and MLflow, the model's declared requirements. Artifacts
(``components.serving.package`` writes them): ``serving`` (serving.json: encoding, generation
length, limits), ``weights`` (adapter or full weights), ``base`` (a logged base model) and
``tokenizer`` (a Hugging Face one; the built-in byte-level model's is :class:`ByteCodec`). The
prompt format is the training format: ``BOS + prompt + newline`` for the built-in model, the chat
template's user message and generation prompt for a Hugging Face tokenizer that has one.

A request is bounded (serving.json's limits; these defaults where an older one has none):
``params={"max_new_tokens": n}`` from 1 to 256 (64 unless asked), at most 64 prompts of at most
4,096 characters each, prompt plus answer within the model's context. Anything more is one
``MlflowException`` line (HTTP 400 from ``mlflow models serve``) before any token is generated.
"""

from __future__ import annotations

import json
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.pyfunc import PythonModel

LIMITS = {"max_new_tokens": 64, "max_new_tokens_limit": 256, "max_prompt_chars": 4096, "max_prompts": 64}


def refuse(message: str) -> MlflowException:
    """A request the model does not take: one line, ``INVALID_PARAMETER_VALUE`` (HTTP 400 when served)."""
    return MlflowException.invalid_parameter_value(message)


class ByteCodec:
    """The built-in model's tokenizer: UTF-8 bytes are ids 0-255, then BOS, EOS and PAD (serving.json says which)."""

    def __init__(self, bos_id: int, eos_id: int, pad_id: int) -> None:
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id

    def prompt_ids(self, prompt: str) -> list[int]:
        return [self.bos_id, *(prompt + "\n").encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HubCodec:
    """A Hugging Face tokenizer, with its chat template when it has one (as the model was trained)."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.eos_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id

    def prompt_ids(self, prompt: str) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None):
            return list(self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                           add_generation_prompt=True, tokenize=True,
                                                           return_dict=False))
        return list(self.tokenizer(prompt + "\n")["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def prompts_of(model_input: Any) -> list[str]:
    """The prompts in a request.

    A string, a list of strings, a DataFrame's ``prompt`` (or only) column, a dict's ``prompt``.
    """
    if isinstance(model_input, str):
        return [model_input]
    if hasattr(model_input, "columns"):  # a pandas DataFrame, as `mlflow models serve` hands a JSON request over
        column = "prompt" if "prompt" in model_input.columns else model_input.columns[0]
        return _texts(model_input[column].tolist())
    if isinstance(model_input, dict):
        value = model_input.get("prompt", model_input.get("prompts"))
        if not isinstance(value, (str, list, tuple)):  # None, a number, another dict: one refusal, no recursion
            raise refuse("a request's 'prompt' must be a string or a list of strings")
        return prompts_of(value)
    if hasattr(model_input, "tolist"):  # a numpy array or a pandas Series
        return _texts(model_input.tolist())
    if not isinstance(model_input, (list, tuple)):
        raise refuse(f"a request must be a string, a list of strings or a 'prompt' column, not "
                     f"{type(model_input).__name__}")
    return _texts(model_input)


def _texts(values: Any) -> list[str]:
    """``values`` when each is a string (a number is taken as its digits); a list, a dict or anything else nested
    is one refusal naming its index (never its text: a 100,000-deep list has no printable form)."""
    if not isinstance(values, (list, tuple)):
        values = [values]
    out = []
    for i, v in enumerate(values):
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(str(v))
        else:
            raise refuse(f"prompt {i} is not text ({type(v).__name__})")
    return out


class TunedModel(PythonModel):
    """Greedy generation from the tuned model, one answer per prompt."""

    def load_context(self, context: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        with open(context.artifacts["serving"], encoding="utf-8") as fh:
            self.spec = {**LIMITS, **json.load(fh)}
        if self.spec["tokenizer"] == "bytes":
            self.codec: Any = ByteCodec(self.spec["bos_id"], self.spec["eos_id"], self.spec["pad_id"])
        else:
            self.codec = HubCodec(context.artifacts["tokenizer"])
        weights = context.artifacts["weights"]
        if self.spec["weights"] == "adapter":
            from peft import PeftModel

            base_path = context.artifacts.get("base") or self.spec["base_model"]
            base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
            self.net = PeftModel.from_pretrained(base, weights)
        else:
            self.net = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
        self.net.eval()
        self.context_tokens = int(getattr(self.net.config, "max_position_embeddings", 0) or 0)

    def max_new_tokens(self, params: Any) -> int:
        """``params["max_new_tokens"]`` when it is an integer within the limit, else the default."""
        value = (params or {}).get("max_new_tokens")
        if value is None:
            return int(self.spec["max_new_tokens"])
        limit = int(self.spec["max_new_tokens_limit"])
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise refuse(f"max_new_tokens {repr(value)[:40]}: must be an integer from 1 to {limit}")
        return value

    def bounded_prompts(self, model_input: Any) -> list[str]:
        """The request's prompts, when there are at most ``max_prompts`` of at most ``max_prompt_chars`` each."""
        prompts = prompts_of(model_input)
        most, longest = int(self.spec["max_prompts"]), int(self.spec["max_prompt_chars"])
        if not prompts:
            raise refuse("no prompt in the request")
        if len(prompts) > most:
            raise refuse(f"{len(prompts)} prompts in one request; at most {most}")
        for i, prompt in enumerate(prompts):
            if len(prompt) > longest:
                raise refuse(f"prompt {i}: {len(prompt):,} characters; at most {longest:,}")
        return prompts

    def encoded(self, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
        """Every prompt's token ids, when each with ``max_new_tokens`` fits the model's context."""
        out = [self.codec.prompt_ids(prompt) for prompt in prompts]
        for i, ids in enumerate(out):
            if self.context_tokens and len(ids) + max_new_tokens > self.context_tokens:
                raise refuse(f"prompt {i}: {len(ids)} tokens plus max_new_tokens {max_new_tokens} exceed the "
                             f"model's context of {self.context_tokens} tokens")
        return out

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> str:
        """The greedy answer: at most ``max_new_tokens``, ending at EOS (not included)."""
        import torch

        ids = torch.tensor([prompt_ids], dtype=torch.long)
        with torch.no_grad():
            out = self.net.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                    do_sample=False, eos_token_id=self.codec.eos_id, pad_token_id=self.codec.pad_id)
        new = out[0, ids.shape[1]:].tolist()
        if self.codec.eos_id in new:
            new = new[: new.index(self.codec.eos_id)]
        return self.codec.decode(new)

    def predict(self, context, model_input, params=None):
        """One greedy answer per prompt. Not annotated: MLflow reads ``predict``'s hints as an input schema."""
        max_new_tokens = self.max_new_tokens(params)
        encoded = self.encoded(self.bounded_prompts(model_input), max_new_tokens)  # every check before any token
        return [self.generate(ids, max_new_tokens) for ids in encoded]


mlflow.models.set_model(TunedModel())
