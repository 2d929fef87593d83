"""Every step, run on its own as an orchestrator would run it: ``python -m components.run``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from components.errors import InputError
from components.steps.finetune import batch_indices, lr_at
from components.steps.tokenize import IGNORE, pack
from components.training.checkpointing import newest_checkpoint
from components.training.data import builtin_rows, read_jsonl, split_rows
from components.training.progress import PROGRESS_FILE
from components.training.tiny import ByteTokenizer
from llmpack.ui.progress import read_train_progress
from tests.conftest import run_step

PREP = "components.steps.prepare_data:prepare_data"
TUNE = "components.steps.finetune:finetune"
EVAL = "components.steps.evaluate:evaluate"
REG = "components.steps.register:register"


def test_builtin_data_is_deterministic_and_learnable_shaped() -> None:
    a, b = builtin_rows(30, seed=1), builtin_rows(30, seed=1)
    assert a == b and a != builtin_rows(30, seed=2)
    up = next(r for r in a if r["prompt"].startswith("Uppercase: "))
    assert up["response"] == up["prompt"].removeprefix("Uppercase: ").upper()
    add = next(r for r in a if r["prompt"].startswith("Add: "))
    x, y = add["prompt"].removeprefix("Add: ").split("+")
    assert int(add["response"]) == int(x) + int(y)


def test_split_is_seeded_and_disjoint() -> None:
    rows = builtin_rows(100)
    train, ev, dups = split_rows(rows, seed=3, eval_fraction=0.1)
    assert len(ev) + len(train) == 100 and 1 <= len(ev) <= 12
    assert split_rows(rows, seed=3, eval_fraction=0.1) == (train, ev, dups)
    assert split_rows(rows, seed=4, eval_fraction=0.1)[1] != ev
    assert not {r["prompt"] for r in ev} & {r["prompt"] for r in train}


def test_prepare_data_from_jsonl_with_chat_messages(tmp_path: Path, step_env: dict[str, str]) -> None:
    data = tmp_path / "chat.jsonl"
    rows = [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(8)]
    rows.append({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    r = run_step(PREP, f"--output=dataset={tmp_path / 'out'}", f"--param=data={data}", cwd=tmp_path,
                 env={**step_env, "LLMPACK_MLFLOW_LOGGING": "0"})
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta == {"source": str(data), "rows": 9, "train": 8, "eval": 1, "skipped": 0, "duplicate_rows": 0,
                    "dropped_rows": 0}
    all_rows = [json.loads(x) for f in ("train", "eval")
                for x in (tmp_path / "out" / f"{f}.jsonl").read_text().splitlines()]
    chat = next(x for x in all_rows if "messages" in x)
    assert chat["prompt"] == "user: hi" and chat["response"] == "hello"
    events = (tmp_path / "out" / "llmpack-events.jsonl").read_text()
    assert '"process_started"' in events and '"finished"' in events


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "a", "response": "b"}\n{"prompt": "a", "resp\n', r"bad\.jsonl:2: malformed JSON"),
        ('{"prompt": "a", "response": "b"}\n\n{"prompt": "a"}\n', r"bad\.jsonl:3: missing field 'response'"),
        ("", r"bad\.jsonl: no rows \(empty file\)"),
        ('{"messages": [{"role": "user", "content": "x"}]}\n',
         r"bad\.jsonl:1: the last message must have role 'assistant'"),
        ('[1, 2]\n', r"bad\.jsonl:1: expected a JSON object"),
    ],
)
def test_bad_jsonl_names_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    with pytest.raises(InputError, match=message):
        read_jsonl(bad)


def test_bad_rows_can_be_skipped_and_counted(tmp_path: Path) -> None:
    f = tmp_path / "mixed.jsonl"
    f.write_text('{"prompt": "a", "response": "b"}\nnot json\n{"prompt": "c", "response": "d"}\n')
    rows, skipped = read_jsonl(f, skip_bad_rows=True)
    assert len(rows) == 2 and skipped == 1


def test_missing_file_as_a_step_exits_2_with_one_line(tmp_path: Path, step_env: dict[str, str]) -> None:
    r = run_step(PREP, f"--output=dataset={tmp_path / 'o'}", "--param=data=nope.jsonl", cwd=tmp_path, env=step_env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == "llmpack: error: nope.jsonl: no such file"
    assert "Traceback" not in r.stderr and "warning" not in r.stderr


def test_packing_masks_prompts_and_wastes_no_padding() -> None:
    tok = ByteTokenizer()
    pairs = [tok.encode_pair("ab", "XY"), tok.encode_pair("cd", "Z")]
    flat = [t for p, r in pairs for t in p + r]
    blocks, labels = pack(pairs, seq_len=4, pad_id=tok.pad_token_id, keep_tail=False)
    assert [t for b in blocks for t in b] == flat[: len(blocks) * 4]  # a plain stream, no padding
    prompt_len = len(pairs[0][0])
    assert labels[0][:prompt_len] == [IGNORE] * prompt_len
    _, tail_labels = pack(pairs, seq_len=4, pad_id=tok.pad_token_id, keep_tail=True)
    assert len(tail_labels) == -(-len(flat) // 4) and tail_labels[-1][-1] == IGNORE


def test_tokenize_writes_packed_arrays(tokens: Path) -> None:
    ids = np.load(tokens / "train_input_ids.npy")
    labels = np.load(tokens / "train_labels.npy")
    assert ids.shape[1] == 64 and ids.shape == labels.shape
    assert (labels == IGNORE).any() and (labels != IGNORE).any()
    assert ids.max() < 259


def test_schedule_and_data_order() -> None:
    assert lr_at(0, lr=1.0, warmup=4, total=10) == 0.25
    assert lr_at(3, lr=1.0, warmup=4, total=10) == 1.0
    assert lr_at(10, lr=1.0, warmup=4, total=10) == pytest.approx(0.1)
    first = batch_indices(0, 4, 10, seed=0)
    assert first == batch_indices(0, 4, 10, seed=0) and len(first) == 4
    assert set(batch_indices(0, 4, 10, 0) + batch_indices(1, 4, 10, 0)).__len__() == 8  # no repeats within an epoch


@pytest.mark.slow  # two finetune processes (~40 s)
def test_finetune_resumes_from_a_checkpoint_with_identical_result(tokens: Path, finetuned: Path,
                                                                  tmp_path: Path) -> None:
    env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1"}
    straight = finetuned  # the same 6 steps, uninterrupted
    events = (straight / "llmpack-events.jsonl").read_text()
    for name in ("process_started", "model_loaded", "first_step", "finished", "tokens_per_s", "train_s"):
        assert f'"{name}"' in events
    progress = read_train_progress(straight / PROGRESS_FILE)  # what `llmpack` shows while it trains
    assert progress is not None and (progress.step, progress.max_steps, progress.eta_s) == (6, 6, 0.0)
    assert progress.tokens_per_s is not None and progress.tokens_per_s > 0

    # A run cut short after checkpointing at step 3 (max_steps=3 would change the schedule,
    # so SIGTERM it instead once the step-3 checkpoint exists), then restarted.
    ckpt = tmp_path / "ckpt"
    resumed = tmp_path / "resumed"
    cmd = [sys.executable, "-m", "components.run", TUNE, f"--input=tokens={tokens}", f"--output=model={resumed}",
           "--param=max_steps=6", "--param=batch_size=4", "--param=checkpoint_every=3",
           f"--param=checkpoint_dir={ckpt}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while newest_checkpoint(ckpt) is None and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert newest_checkpoint(ckpt) is not None
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed from" in r.stdout
    a = (straight / "adapter" / "adapter_model.safetensors").read_bytes()
    b = (resumed / "adapter" / "adapter_model.safetensors").read_bytes()
    assert a == b, "a resumed run must end with the same weights as an uninterrupted one"


@pytest.mark.slow  # finetune and evaluate processes: the slow tier
def test_evaluate_gate_fails_the_step(tokens: Path, finetuned: Path, fresh_tracking_uri: str, tmp_path: Path) -> None:
    env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1"}
    from tests.sealing import chain_for_run

    tok, model = chain_for_run(tokens, finetuned, tmp_path, "pr-reg")  # a run's steps take its own run's outputs
    ok = run_step(EVAL, f"--input=tokens={tok}", f"--input=model={model}", f"--output=metrics={tmp_path / 'e1'}",
                  "--param=pipeline_run=pr-reg", cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stderr
    metrics = json.loads((tmp_path / "e1" / "metrics.json").read_text())
    assert metrics["eval_loss"] < metrics["base_eval_loss"] and metrics["passed"]
    assert metrics["eval_set"].startswith("sha256:")  # what promotion compares versions on
    gate = run_step(EVAL, f"--input=tokens={tokens}", f"--input=model={finetuned}",
                    f"--output=metrics={tmp_path / 'e2'}", "--param=min_improvement=100", cwd=tmp_path, env=env)
    assert gate.returncode == 1
    assert "quality gate" in gate.stderr and "Traceback" not in gate.stderr

    reg = run_step(REG, f"--input=model={model}", f"--input=metrics={tmp_path / 'e1'}",
                   f"--output=registration={tmp_path / 'r'}",
                   "--param=model_name=test-model", "--param=pipeline_run=pr-reg", "--param=run_group=rg-reg",
                   cwd=tmp_path, env={**env, "LLMPACK_MLFLOW_LOGGING": "1", "MLFLOW_TRACKING_URI": fresh_tracking_uri})
    assert reg.returncode == 0, reg.stderr
    record = json.loads((tmp_path / "r" / "registration.json").read_text())
    assert record["registered"] and record["version"] == "1"
    from mlflow.tracking import MlflowClient

    mv = MlflowClient(fresh_tracking_uri).get_model_version("test-model", "1")
    assert mv.tags["llmpack.pipeline_run"] == "pr-reg"
    assert mv.tags["llmpack.eval_set"] == metrics["eval_set"] and mv.tags["llmpack.promotion"] == "champion"
    assert record["promotion"].startswith("version 1 -> champion (no champion yet")
    # a compare round (LLMPACK_REGISTER_VERSION=0): the weights go on its run, no model version
    tok, model = chain_for_run(tokens, finetuned, tmp_path, "pr-cmp")
    again = run_step(EVAL, f"--input=tokens={tok}", f"--input=model={model}", f"--output=metrics={tmp_path / 'e3'}",
                     "--param=pipeline_run=pr-cmp", cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    quiet = run_step(REG, f"--input=model={model}", f"--input=metrics={tmp_path / 'e3'}",
                     f"--output=registration={tmp_path / 'q'}",
                     "--param=model_name=test-model", "--param=pipeline_run=pr-cmp", "--param=run_group=rg-cmp",
                     cwd=tmp_path,
                     env={**env, "LLMPACK_MLFLOW_LOGGING": "1", "MLFLOW_TRACKING_URI": fresh_tracking_uri,
                          "LLMPACK_REGISTER_VERSION": "0"})
    assert quiet.returncode == 0, quiet.stderr
    skipped = json.loads((tmp_path / "q" / "registration.json").read_text())
    assert skipped["registered"] is False and skipped["skipped"] == "LLMPACK_REGISTER_VERSION=0"
    mc = MlflowClient(fresh_tracking_uri)
    assert [str(v.version) for v in mc.search_model_versions("name='test-model'")] == ["1"]
    assert mc.list_artifacts(skipped["run_id"], "model")  # the weights are on the round's run


def test_saving_a_tiny_adapter_asks_no_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """peft's "auto" embedding check asked the hub for tiny's config.json (tiny is no hub id) unless offline."""
    import peft.utils.save_and_load as peft_saving

    from components.steps.finetune import build_model, save_outputs

    asked: list[str] = []
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(peft_saving, "check_file_exists_on_hf_hub", lambda repo, name, **_: asked.append(repo))
    net, _ = build_model("tiny", "lora", lora_r=4, lora_alpha=8)
    save_outputs(tmp_path, net, None, method="lora", fused_evaluate=False, meta={"base_model": "tiny"}, tokens_seal="")
    assert asked == []
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    from safetensors.torch import load_file

    # tiny's trained copy of its random embeddings (modules_to_save), and no LoRA on them
    assert [k for k in load_file(tmp_path / "adapter" / "adapter_model.safetensors") if "embed" in k] == \
        ["base_model.model.model.embed_tokens.weight"]


def test_a_crashing_step_ends_with_one_line_of_its_exception_s_type_and_first_line(tmp_path: Path) -> None:
    """The newcomer's trial: a multi-line message showed only its last line (400 x's), type and first line lost."""
    from components.commands import last_error_line

    (tmp_path / "crashing.py").write_text(
        "from components import Dataset, Output, step\n\n\n@step()\n"
        "def explode(out: Output[Dataset]) -> None:\n"
        "    raise RuntimeError('first line of the problem\\nsecond line\\n' + 'x' * 400)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[2])]),
           "LLMPACK_MLFLOW_LOGGING": "0"}
    r = run_step("crashing:explode", f"--output=out={tmp_path / 'o'}", cwd=tmp_path, env=env)
    assert r.returncode == 1 and "Traceback" in r.stderr  # where it happened, for the step's log
    assert r.stderr.strip().splitlines()[-1] == "llmpack: crashed: RuntimeError: first line of the problem"
    assert last_error_line(r.stderr) == "RuntimeError: first line of the problem"
