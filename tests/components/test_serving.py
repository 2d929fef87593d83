"""The registered model on a real MLflow store: champion and challenger, loaded and served without llmpack.

Three runs of the steps in a row on one sqlite store (tiny model, 600 built-in rows, seq_len 64):
6 steps, then a worse one of 2 steps, then a better one of 60 steps with ``merge=true``. The
registered versions are then loaded by ``mlflow.pyfunc.load_model`` in a fresh process and served
by ``mlflow models serve`` on a loopback port.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_step

pytestmark = pytest.mark.slow

TUNE = "components.steps.finetune:finetune"
EVAL = "components.steps.evaluate:evaluate"
REG = "components.steps.register:register"
NAME = "served-model"
PROMPTS = ["Reverse: apple", "Uppercase: river stone", "Add: 12+30"]


def _tune_eval_register(root: Path, tokens: Path, steps: int, tracking_uri: str, *extra: str,
                        model: Path | None = None, batch_size: int = 4) -> tuple[Path, dict[str, Any]]:
    """One run's finetune (unless ``model`` is given), evaluate and register: (its model directory,
    registration.json)."""
    from tests.sealing import chain_for_run

    env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1"}
    run = f"pr-{root.name}"  # every step of this run takes only its own run's outputs
    root.mkdir(parents=True, exist_ok=True)
    tokens, model = chain_for_run(tokens, model, root, run)
    if model is None:
        model = root / "model"
        r = run_step(TUNE, f"--input=tokens={tokens}", f"--output=model={model}", f"--param=max_steps={steps}",
                     f"--param=batch_size={batch_size}", f"--param=pipeline_run={run}", cwd=root, env=env)
        assert r.returncode == 0, r.stderr
    r = run_step(EVAL, f"--input=tokens={tokens}", f"--input=model={model}", f"--output=metrics={root / 'eval'}",
                 f"--param=pipeline_run={run}", cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    r = run_step(REG, f"--input=model={model}", f"--input=metrics={root / 'eval'}",
                 f"--output=registration={root / 'reg'}", f"--param=model_name={NAME}",
                 f"--param=pipeline_run={run}", "--param=run_group=rg-serving", *extra, cwd=root,
                 env={**env, "LLMPACK_MLFLOW_LOGGING": "1", "MLFLOW_TRACKING_URI": tracking_uri})
    assert r.returncode == 0, r.stderr
    return model, json.loads((root / "reg" / "registration.json").read_text())


@pytest.fixture(scope="module")
def three_runs(tokens: Path, finetuned: Path, mlflow_template_db: Path,
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The store after a 6-step run, a worse 2-step one and a better one of 60 steps of 8 (merge=true).

    The better run is the pipeline's default length: shorter ones answer every prompt with EOS at
    once, and a comparison of empty answers would prove little.
    """
    from tests.conftest import fresh_store

    root = tmp_path_factory.mktemp("serving")
    uri = fresh_store(mlflow_template_db, root / "mlflow.db")
    runs = {}
    for label, steps, batch, extra in (("first", 6, 4, ()), ("worse", 2, 4, ()),
                                       ("better", 60, 8, ("--param=merge=true",))):
        (root / label).mkdir()
        runs[label] = _tune_eval_register(root / label, tokens, steps, uri, *extra, batch_size=batch,
                                          model=finetuned if label == "first" else None)
    return {"uri": uri, "root": root, **runs}


def _greedy_with_adapter(model_dir: Path, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
    """The generations of base + adapter computed here, with llmpack's own tiny model and tokenizer."""
    import torch
    from peft import PeftModel

    from components.training.tiny import EOS_ID, PAD_ID, ByteTokenizer, build_tiny_model

    net = PeftModel.from_pretrained(build_tiny_model(), str(model_dir / "adapter")).eval()
    return _greedy(net, prompts, max_new_tokens, ByteTokenizer(), EOS_ID, PAD_ID, torch)


def _greedy(net: Any, prompts: list[str], max_new_tokens: int, tok: Any, eos: int, pad: int, torch: Any) -> list[str]:
    answers = []
    for prompt in prompts:
        ids = torch.tensor([tok.encode_pair(prompt, "")[0]])
        with torch.no_grad():
            out = net.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                               do_sample=False, eos_token_id=eos, pad_token_id=pad)[0, ids.shape[1]:].tolist()
        answers.append(tok.decode(out[: out.index(eos)] if eos in out else out))
    return answers


def test_first_version_is_champion_a_worse_one_stays_challenger_a_better_one_takes_over(
        three_runs: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    first, worse, better = three_runs["first"][1], three_runs["worse"][1], three_runs["better"][1]
    assert (first["version"], worse["version"], better["version"]) == ("1", "2", "3")
    assert first["champion"] and first["promotion"].startswith("version 1 -> champion (no champion yet")
    assert not worse["champion"] and worse["promotion"].startswith("version 2 stays challenger (did not beat v1: ")
    assert better["champion"] and better["promotion"].startswith("version 3 -> champion (beat v1: ")
    mc = MlflowClient(three_runs["uri"])
    assert str(mc.get_model_version_by_alias(NAME, "champion").version) == "3"
    assert str(mc.get_model_version_by_alias(NAME, "challenger").version) == "3"
    tags = mc.get_model_version(NAME, "2").tags
    assert tags["llmpack.promotion"] == "challenger"
    assert tags["llmpack.promotion.metric"] == "eval_loss" and tags["llmpack.promotion.baseline_version"] == "1"
    assert float(tags["llmpack.promotion.value"]) > float(tags["llmpack.promotion.baseline_value"])  # lower wins
    assert tags["llmpack.promotion.baseline_run_id"] == first["run_id"] and tags["llmpack.run_id"] == worse["run_id"]
    assert tags["llmpack.eval_set"] == mc.get_model_version(NAME, "1").tags["llmpack.eval_set"]
    assert mc.get_model_version(NAME, "3").tags["llmpack.promotion.baseline_version"] == "1"
    # the run that registered a version carries its decision too (the report shows it)
    assert mc.get_run(worse["run_id"]).data.tags["llmpack.promotion"] == worse["promotion"]


def test_promote_false_registers_a_challenger_only(three_runs: dict[str, Any], tokens: Path, finetuned: Path) -> None:
    from mlflow.tracking import MlflowClient

    root = three_runs["root"] / "nopromote"
    root.mkdir()
    _, record = _tune_eval_register(root, tokens, 0, three_runs["uri"], "--param=promote=false", model=finetuned)
    assert record["promotion"] == f"version {record['version']} stays challenger (promote=false)"
    mc = MlflowClient(three_runs["uri"])
    assert str(mc.get_model_version_by_alias(NAME, "challenger").version) == record["version"]
    assert str(mc.get_model_version_by_alias(NAME, "champion").version) == "3"


LOAD = """
import json, sys
import mlflow.pyfunc
model = mlflow.pyfunc.load_model(sys.argv[1])
answers = model.predict(json.loads(sys.argv[2]))
ours = sorted(m for m in sys.modules if m.split(".")[0] in ("components", "llmpack", "tests"))
print(json.dumps({"answers": answers, "llmpack_modules": ours}))
"""


def _bare_env(tracking_uri: str) -> dict[str, str]:
    """A serving process's environment: the store, offline, no path to this checkout, this environment's
    programs first on PATH (``mlflow models serve --env-manager local`` starts ``uvicorn`` by name)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",) and not k.startswith("LLMPACK_")}
    path = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return {**env, "MLFLOW_TRACKING_URI": tracking_uri, "HF_HUB_OFFLINE": "1", "PATH": path}


def test_the_champion_loads_in_a_fresh_process_and_answers_as_base_plus_adapter(three_runs: dict[str, Any],
                                                                               tmp_path: Path) -> None:
    model_dir = three_runs["better"][0]
    r = subprocess.run([sys.executable, "-c", LOAD, f"models:/{NAME}@champion", json.dumps(PROMPTS)],
                       cwd=tmp_path, env=_bare_env(three_runs["uri"]), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    served = json.loads(r.stdout.strip().splitlines()[-1])
    assert served["llmpack_modules"] == [], "serving imported llmpack code"
    expected = _greedy_with_adapter(model_dir, PROMPTS)
    assert served["answers"] == expected
    assert any(expected), "every answer empty: the comparison would prove little"


def test_merged_weights_load_with_transformers_and_answer_as_base_plus_adapter(three_runs: dict[str, Any],
                                                                              tmp_path: Path) -> None:
    import mlflow.artifacts
    import torch
    from transformers import AutoModelForCausalLM

    from components.training.tiny import EOS_ID, PAD_ID, ByteTokenizer

    model_dir, record = three_runs["better"]
    assert record["merged"] is True
    local = mlflow.artifacts.download_artifacts(run_id=record["run_id"], artifact_path="merged",
                                                dst_path=str(tmp_path), tracking_uri=three_runs["uri"])
    assert sorted(p.name for p in Path(local).iterdir()) == ["config.json", "generation_config.json",
                                                             "model.safetensors"]
    merged = AutoModelForCausalLM.from_pretrained(local, dtype=torch.float32).eval()
    assert not any("lora" in name for name, _ in merged.named_parameters())
    assert (_greedy(merged, PROMPTS, 64, ByteTokenizer(), EOS_ID, PAD_ID, torch)
            == _greedy_with_adapter(model_dir, PROMPTS))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_mlflow_models_serve_answers_on_loopback(three_runs: dict[str, Any], tmp_path: Path) -> None:
    port = _free_port()
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([str(mlflow_cli), "models", "serve", "-m", f"models:/{NAME}@champion", "--env-manager",
                               "local", "-h", "127.0.0.1", "-p", str(port)], cwd=tmp_path,
                              env=_bare_env(three_runs["uri"]), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5):
                    break
            except OSError:
                assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "mlflow models serve did not answer /ping in 240 s"
                time.sleep(1)
        body = json.dumps({"inputs": PROMPTS}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            predictions = json.loads(answer.read())["predictions"]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    assert predictions == _greedy_with_adapter(three_runs["better"][0], PROMPTS)


def test_a_hugging_face_base_serves_with_its_own_tokenizer_and_chat_template(tmp_path: Path) -> None:
    """An adapter on a local Hugging Face model directory (tests/hf_models.py): the pyfunc model saves the
    tokenizer, names the base, and answers as base + adapter prompted through the chat template."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from components.serving.package import write_servable
    from tests.hf_models import build_model_dir

    base_dir = build_model_dir(tmp_path / "base", "llama")
    model_dir = tmp_path / "model"
    torch.manual_seed(0)
    net = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
                         LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    net.save_pretrained(model_dir / "adapter", safe_serialization=True, save_embedding_layers=False)
    (model_dir / "llmpack-model.json").write_text(json.dumps({"base_model": str(base_dir), "method": "lora"}))
    write_servable(model_dir, model_dir, max_new_tokens=8)
    assert (model_dir / "tokenizer" / "tokenizer.json").exists() and not (model_dir / "base").exists()

    tok = AutoTokenizer.from_pretrained(base_dir)
    expected = []
    for prompt in PROMPTS[:2]:
        ids = torch.tensor([tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)])
        with torch.no_grad():
            out = net.eval().generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                      do_sample=False, eos_token_id=tok.eos_token_id,
                                      pad_token_id=(tok.pad_token_id if tok.pad_token_id is not None
                                                    else tok.eos_token_id))
        new = out[0, ids.shape[1]:].tolist()
        new = new[: new.index(tok.eos_token_id)] if tok.eos_token_id in new else new
        expected.append(tok.decode(new, skip_special_tokens=True))
    r = subprocess.run([sys.executable, "-c", LOAD, str(model_dir), json.dumps(PROMPTS[:2])], cwd=tmp_path,
                       env=_bare_env("sqlite:///unused.db"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    served = json.loads(r.stdout.strip().splitlines()[-1])
    assert served == {"answers": expected, "llmpack_modules": []}
    assert any(expected), "every answer empty: the comparison would prove little"
