"""The load dtype: fp32 weights whatever a checkpoint was saved in, autocast only on a GPU with bf16.

transformers 5 keeps a checkpoint's own dtype unless told, so without ``dtype=`` a bf16
checkpoint would be fine-tuned with AdamW on bf16 weights (docs/internals/decisions.md, "Dependencies and
the step image").
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from components.training.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("bf16-tiny")
    build_tiny_model().to(torch.bfloat16).save_pretrained(out)
    return out


def test_a_bf16_checkpoint_loads_as_fp32_weights(bf16_checkpoint: Path):
    from safetensors.torch import load_file

    from components.training.modeling import load_base_model

    saved = load_file(str(bf16_checkpoint / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}  # the checkpoint really is bf16
    net = load_base_model(str(bf16_checkpoint))
    params = dict(net.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.float32}
    # the same numbers, widened: loading changed the dtype, not the weights
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(params[name].detach(), saved[name].float())


def test_without_the_explicit_dtype_transformers_would_keep_bf16(bf16_checkpoint: Path):
    """The premise of the fix: if this starts failing, transformers changed its default again."""
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(str(bf16_checkpoint))
    assert next(net.parameters()).dtype == torch.bfloat16


def test_autocast_dtype_follows_the_device(monkeypatch: pytest.MonkeyPatch):
    from components.training.modeling import device_and_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_and_dtype() == (torch.device("cpu"), None)  # CPU: plain fp32, byte-identical across paths
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert device_and_dtype() == (torch.device("cuda"), torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert device_and_dtype() == (torch.device("cuda"), None)  # no bf16 (pre-Ampere): fp32, no fp16 loss scaling
