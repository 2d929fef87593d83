"""Turn a finetune output (adapter or full weights + llmpack-model.json) into what a server loads.

:func:`write_servable` writes the files that make the run's ``model`` artifact an MLflow pyfunc
model: ``MLmodel``, the model's code (:mod:`components.serving.pyfunc_model`, models-from-code: a
file MLflow runs, not a pickle), its requirements, ``serving.json``, the base model when it is the
built-in one (3.5 MB, so the served model needs nothing else) and a Hugging Face tokenizer. The
tuned weights are not copied: ``MLmodel`` names ``adapter/`` (or ``full/``) where the register step
has always logged them, so their bytes are the ones every path logs. A Hugging Face base is named,
not copied: the serving host loads it from its Hugging Face cache or the hub, as the steps did;
``merge=true`` (:func:`write_merged`) gives self-contained weights for such a model.

:func:`write_merged` writes the adapter merged into the base (peft ``merge_and_unload``) in the
Hugging Face layout an inference server reads: config.json, model.safetensors,
generation_config.json and the tokenizer's files where the model has a Hugging Face tokenizer.
"""

from __future__ import annotations

import json
import platform
import shutil
import uuid
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any

from components.training.modeling import MODEL_META, load_base_model
from components.training.tiny import BOS_ID, EOS_ID, PAD_ID, TINY

CODE_FILE = Path(__file__).with_name("pyfunc_model.py")
SERVING_SPEC = "serving.json"
# The longest answer a request gets unless it asks (``params={"max_new_tokens": n}``): the
# built-in tasks' answers are under 30 bytes; a longer default only slows a wrong answer down.
MAX_NEW_TOKENS = 64
# What one request may ask (serving.json carries them; the served model refuses more in one line):
# generation is token by token and attention quadratic in the prompt, so each bound caps a request's time.
MAX_NEW_TOKENS_LIMIT = 256
MAX_PROMPT_CHARS = 4096
MAX_PROMPTS = 64
# MLflow's loader for a models-from-code pyfunc model (what ``mlflow.pyfunc.save_model(python_model=
# "file.py")`` writes); tests/components/test_serving_package.py holds this file to MLflow's own.
CODE_MODEL_LOADER = "mlflow.pyfunc.loaders.code_model"


def model_meta(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / MODEL_META).read_text())


def pinned(dist: str) -> str:
    """``dist==version`` as installed here, without a local build tag (``2.13.0+cu130`` is not on PyPI)."""
    return f"{dist}=={version(dist).split('+')[0]}"


def serving_requirements(method: str) -> list[str]:
    """What the served model imports: MLflow, torch, transformers, and peft for an adapter; nothing of llmpack."""
    return [pinned(d) for d in ("mlflow", "torch", "transformers", *(("peft",) if method == "lora" else ()))]


def _save_tokenizer(base_model: str, out: Path) -> None:
    from components.steps.tokenize import load_tokenizer

    load_tokenizer(base_model).save_pretrained(str(out))


def params_signature(max_new_tokens: int) -> dict[str, Any]:
    """The model signature: no input schema (a string, a list, a DataFrame column), one parameter.

    A pyfunc model without a params schema has its ``params`` dropped by MLflow (with a warning),
    on load as over HTTP; declared, ``mlflow models serve`` passes ``{"params": {...}}`` through.
    """
    spec = [{"name": "max_new_tokens", "default": max_new_tokens, "shape": None, "type": "long"}]
    return {"inputs": None, "outputs": None, "params": json.dumps(spec)}


def render_mlmodel(artifacts: dict[str, str], *, python_version: str, mlflow_version: str, created: datetime,
                   model_uuid: str, max_new_tokens: int = MAX_NEW_TOKENS) -> str:
    """The ``MLmodel`` file of a models-from-code pyfunc model, written without importing MLflow.

    The register step logs through MLflow's REST API without importing MLflow (its 2-4 s import);
    ``mlflow.pyfunc.save_model`` would import it. The file is the one ``save_model`` writes for
    ``python_model="pyfunc_model.py"`` with these artifacts (paths relative to the model), less
    ``cloudpickle_version`` (nothing is pickled) and the absolute source paths it records, plus the
    signature that declares ``max_new_tokens`` (:func:`params_signature`).
    """
    import yaml

    doc = {
        "flavors": {"python_function": {
            "artifacts": {name: {"path": path} for name, path in sorted(artifacts.items())},
            "code": None,
            "env": {"conda": "conda.yaml", "virtualenv": "python_env.yaml"},
            "loader_module": CODE_MODEL_LOADER,
            "model_code_path": CODE_FILE.name,
            "python_version": python_version,
            "streamable": False,
        }},
        "mlflow_version": mlflow_version,
        "model_uuid": model_uuid,
        "signature": params_signature(max_new_tokens),
        "utc_time_created": created.strftime("%Y-%m-%d %H:%M:%S.%f"),
    }
    return yaml.safe_dump(doc, sort_keys=True, default_flow_style=False)


def render_environment(requirements: list[str], python_version: str) -> dict[str, str]:
    """``requirements.txt``, ``python_env.yaml`` and ``conda.yaml``, as MLflow writes them for a pyfunc model."""
    import yaml

    pip = version("pip") if _installed("pip") else ""
    build = [f"pip=={pip}" if pip else "pip", "setuptools", "wheel"]
    return {
        "requirements.txt": "".join(f"{r}\n" for r in requirements),
        "python_env.yaml": yaml.safe_dump({"python": python_version, "build_dependencies": build,
                                           "dependencies": ["-r requirements.txt"]}, sort_keys=False),
        "conda.yaml": yaml.safe_dump({"channels": ["conda-forge"], "dependencies": [
            f"python={python_version}", f"pip<={pip}" if pip else "pip", {"pip": requirements}], "name": "mlflow-env"},
            sort_keys=False),
    }


def _installed(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError

    try:
        version(dist)
    except PackageNotFoundError:
        return False
    return True


def write_servable(model_dir: Path, out: Path, *, max_new_tokens: int = MAX_NEW_TOKENS) -> Path:
    """The files at ``out`` that, logged beside ``model_dir``'s weights, make an MLflow pyfunc model of it."""
    meta = model_meta(model_dir)
    method, base_model = meta["method"], meta["base_model"]
    out.mkdir(parents=True, exist_ok=True)
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise ValueError(f"max_new_tokens {max_new_tokens}: must be 1 to {MAX_NEW_TOKENS_LIMIT}")
    spec: dict[str, Any] = {"weights": "adapter" if method == "lora" else "full", "base_model": base_model,
                            "max_new_tokens": max_new_tokens, "max_new_tokens_limit": MAX_NEW_TOKENS_LIMIT,
                            "max_prompt_chars": MAX_PROMPT_CHARS, "max_prompts": MAX_PROMPTS}
    artifacts = {"serving": SERVING_SPEC, "weights": spec["weights"]}
    if base_model == TINY:
        spec.update(tokenizer="bytes", bos_id=BOS_ID, eos_id=EOS_ID, pad_id=PAD_ID)
        if method == "lora":
            load_base_model(TINY).save_pretrained(str(out / "base"), safe_serialization=True)
            artifacts["base"] = "base"
    else:
        spec["tokenizer"] = "huggingface"
        _save_tokenizer(base_model, out / "tokenizer")
        artifacts["tokenizer"] = "tokenizer"
    (out / SERVING_SPEC).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(CODE_FILE, out / CODE_FILE.name)
    python_version = platform.python_version()
    for name, text in render_environment(serving_requirements(method), python_version).items():
        (out / name).write_text(text)
    (out / "MLmodel").write_text(render_mlmodel(artifacts, python_version=python_version,
                                                mlflow_version=version("mlflow"), created=datetime.now(timezone.utc),
                                                model_uuid=uuid.uuid4().hex, max_new_tokens=max_new_tokens))
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
