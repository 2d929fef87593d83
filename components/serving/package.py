"""Turn a finetune output (adapter or full weights + llmpack-model.json) into what a server loads.

:func:`write_servable` writes an MLflow pyfunc model directory whose code is
:mod:`components.serving.pyfunc_model` (models-from-code: a file MLflow runs, not a pickle) and
whose artifacts are the tuned weights, the base model when it is the built-in one (a few MB, so
the served model needs nothing else), the tokenizer and serving.json. A Hugging Face base is named,
not copied: the serving host loads it from its Hugging Face cache or the hub, as the steps did;
``merge=true`` (:func:`write_merged`) gives self-contained weights for such a model.

:func:`write_merged` writes the adapter merged into the base (peft ``merge_and_unload``) in the
Hugging Face layout an inference server reads: config.json, model.safetensors,
generation_config.json and the tokenizer's files where the model has a Hugging Face tokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from components.training.modeling import MODEL_META, load_base_model
from components.training.tiny import BOS_ID, EOS_ID, PAD_ID, TINY

CODE_FILE = Path(__file__).with_name("pyfunc_model.py")
SERVING_SPEC = "serving.json"
# The longest answer a request gets unless it asks (``params={"max_new_tokens": n}``): the
# built-in tasks' answers are under 30 bytes; a longer default only slows a wrong answer down.
MAX_NEW_TOKENS = 64


def model_meta(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / MODEL_META).read_text())


def pinned(dist: str) -> str:
    """``dist==version`` as installed here, without a local build tag (``2.13.0+cu130`` is not on PyPI)."""
    from importlib.metadata import version

    return f"{dist}=={version(dist).split('+')[0]}"


def serving_requirements(method: str) -> list[str]:
    """What the served model imports: MLflow, torch, transformers, and peft for an adapter; nothing of llmpack."""
    return [pinned(d) for d in ("mlflow", "torch", "transformers", *(("peft",) if method == "lora" else ()))]


def _save_tokenizer(base_model: str, out: Path) -> None:
    from components.steps.tokenize import load_tokenizer

    load_tokenizer(base_model).save_pretrained(str(out))


def write_servable(model_dir: Path, out: Path, work: Path, *, max_new_tokens: int = MAX_NEW_TOKENS) -> Path:
    """An MLflow pyfunc model of ``model_dir`` at ``out`` (which must not exist); ``work`` holds the staging files."""
    import mlflow.pyfunc

    meta = model_meta(model_dir)
    method, base_model = meta["method"], meta["base_model"]
    weights = model_dir / ("adapter" if method == "lora" else "full")
    spec: dict[str, Any] = {"weights": "adapter" if method == "lora" else "full", "base_model": base_model,
                            "max_new_tokens": max_new_tokens}
    artifacts = {"serving": str(work / SERVING_SPEC), "weights": str(weights)}
    if base_model == TINY:
        spec.update(tokenizer="bytes", bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID)
        if method == "lora":
            load_base_model(TINY).save_pretrained(str(work / "base"), safe_serialization=True)
            artifacts["base"] = str(work / "base")
    else:
        spec["tokenizer"] = "huggingface"
        _save_tokenizer(base_model, work / "tokenizer")
        artifacts["tokenizer"] = str(work / "tokenizer")
    (work / SERVING_SPEC).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    mlflow.pyfunc.save_model(path=str(out), python_model=str(CODE_FILE), artifacts=artifacts,
                             pip_requirements=serving_requirements(method))
    return out


def write_merged(model_dir: Path, out: Path) -> Path:
    """The tuned model as full weights in the Hugging Face layout at ``out``: the adapter merged into its base."""
    meta = model_meta(model_dir)
    if meta["method"] == "full":  # full fine-tuning: the weights are already whole
        shutil.copytree(model_dir / "full", out)
    else:
        from peft import PeftModel

        base = load_base_model(meta["base_model"])
        merged = PeftModel.from_pretrained(base, str(model_dir / "adapter")).merge_and_unload()
        merged.save_pretrained(str(out), safe_serialization=True)
    if meta["base_model"] != TINY:
        _save_tokenizer(meta["base_model"], out)
    return out
