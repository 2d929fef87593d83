"""Task evaluation: exact and normalised match, the held-out prompts tokenize writes, the gate's metric."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from components.errors import InputError
from components.steps.tokenize import pair_ids
from components.training.data import builtin_rows, builtin_task, read_jsonl
from components.training.generation import (
    MAX_TASK_ROWS,
    TASK_FILE,
    batches,
    choose_gate,
    gate_improvement,
    greedy_answers,
    normalise,
    read_task_rows,
    score,
    task_rows,
)
from components.training.tiny import EOS_ID, PAD_ID, ByteTokenizer
from tests.conftest import llmpack, run_step

EVAL = "components.steps.evaluate:evaluate"


def test_exact_match_is_exact_and_normalised_match_forgives_case_and_spacing() -> None:
    rows = [{"response": "ELPPA"}, {"response": "Hello  world"}, {"response": "42"}, {"response": "x"}]
    got = score(["ELPPA", " hello world\n", "42 ", "y"], rows)
    assert got.rows == 4
    assert got.exact_match == pytest.approx(1 / 4)  # only the first is byte for byte
    assert got.normalised_match == pytest.approx(3 / 4)  # the last is wrong either way
    assert normalise("  A\tb\n C ") == "a b c"
    with pytest.raises(ValueError):
        score(["a"], rows)


def test_per_task_exact_match_for_the_builtin_tasks() -> None:
    assert [builtin_task(r["prompt"]) for r in builtin_rows(3)] == ["uppercase", "reverse", "add"]
    assert builtin_task("Summarise: a text") is None and builtin_task("Reverse apple") is None
    rows = [{"response": "ab", "task": "reverse"}, {"response": "cd", "task": "reverse"},
            {"response": "3", "task": "add"}, {"response": "z", "task": None}]
    got = score(["ab", "xx", "3", "z"], rows)
    assert got.per_task == {"add": 1.0, "reverse": 0.5}
    assert got.exact_match == pytest.approx(3 / 4)


def test_user_jsonl_prompt_response_and_chat_messages_become_prompts_to_answer(tmp_path: Path) -> None:
    data = tmp_path / "eval.jsonl"
    data.write_text(
        json.dumps({"prompt": "Capital of France?", "response": "Paris"}) + "\n"
        + json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                                   {"role": "assistant", "content": "4"}]}) + "\n"
        + json.dumps({"prompt": "x" * 200, "response": "too long a prompt"}) + "\n"
        + json.dumps({"prompt": "Reverse: abc", "response": "cba"}) + "\n")
    rows, _ = read_jsonl(data)
    tok = ByteTokenizer()
    kept, too_long = task_rows([pair_ids(tok, r) for r in rows], rows, max_prompt_tokens=64, task_of=builtin_task)
    assert too_long == 1
    assert [r["response"] for r in kept] == ["Paris", "4", "cba"]
    assert [r["task"] for r in kept] == [None, None, "reverse"]
    # the chat row's prompt is its messages before the answer, as training saw them
    assert tok.decode(kept[1]["prompt_ids"]) == "system: Be brief.\nuser: 2+2?\n"
    assert kept[0]["answer_tokens"] == len("Paris") + 1  # the answer and its end token
    many, _ = task_rows([pair_ids(tok, r) for r in rows[:1]] * 300, rows[:1] * 300, max_prompt_tokens=64,
                        task_of=builtin_task)
    assert len(many) == MAX_TASK_ROWS


def test_gate_metric_auto_is_exact_match_where_there_are_answers_else_eval_loss() -> None:
    assert choose_gate("auto", 200) == "exact_match"
    assert choose_gate("auto", 0) == "eval_loss"
    assert choose_gate("eval_loss", 200) == "eval_loss"
    assert choose_gate("normalised_match", 3) == "normalised_match"
    with pytest.raises(InputError, match="gate_metric 'accuracy': use one of auto, eval_loss"):
        choose_gate("accuracy", 200)
    with pytest.raises(InputError, match="no prompt short enough"):
        choose_gate("exact_match", 0)
    result = {"base_eval_loss": 5.0, "eval_loss": 1.5, "base_exact_match": 0.0, "tuned_exact_match": 0.25}
    assert gate_improvement("eval_loss", result) == 3.5
    assert gate_improvement("exact_match", result) == 0.25


def test_greedy_answers_on_tiny_are_deterministic_and_bounded() -> None:
    import torch

    from components.training.tiny import build_tiny_model

    tok = ByteTokenizer()
    rows = [{"prompt_ids": tok.encode_pair(p, "")[0], "answer_tokens": n, "response": "?"}
            for p, n in (("Reverse: apple", 6), ("Add: 1+2", 2), ("Uppercase: tiger ocean", 12))]
    net = build_tiny_model()
    kwargs = {"tokenizer": tok, "eos_id": EOS_ID, "pad_id": PAD_ID, "device": torch.device("cpu"), "amp_dtype": None}
    first = greedy_answers(net, rows, max_batch_tokens=80, **kwargs)  # two batches: the first two rows, the third
    assert [len(b) for b in batches(rows, 80)] == [2, 1]
    assert first == greedy_answers(net, rows, max_batch_tokens=80, **kwargs)
    # a batch gets as many new tokens as its longest expected answer (end token included), no more
    # a byte is at most a character
    assert len(first) == 3 and all(len(a) <= 6 for a in first[:2]) and len(first[2]) <= 12


@pytest.mark.slow  # evaluate processes: the slow tier
def test_evaluate_logs_task_metrics_and_gates_on_the_chosen_metric(tokens: Path, finetuned: Path,
                                                                   tmp_path: Path) -> None:
    env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1"}
    held_out = read_task_rows(tokens / TASK_FILE)
    assert held_out and {r["task"] for r in held_out} == {"uppercase", "reverse", "add"}
    ok = run_step(EVAL, f"--input=tokens={tokens}", f"--input=model={finetuned}", f"--output=metrics={tmp_path / 'e'}",
                  "--param=gate_metric=eval_loss", cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stderr
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert m["gate_metric"] == "eval_loss" and m["gate_improvement"] == m["improvement"] and m["passed"]
    assert m["task_rows"] == len(held_out)
    for key in ("base_exact_match", "tuned_exact_match", "base_normalised_match", "tuned_normalised_match",
                "tuned_exact_match_reverse"):
        assert 0.0 <= m[key] <= 1.0, key
    events = (tmp_path / "e" / "llmpack-events.jsonl").read_text()
    assert '"gated_by_eval_loss"' in events and '"tuned_exact_match"' in events
    # auto: exact match, which cannot rise by 0.5 in 6 steps
    gate = run_step(EVAL, f"--input=tokens={tokens}", f"--input=model={finetuned}",
                    f"--output=metrics={tmp_path / 'g'}", "--param=min_improvement=0.5", cwd=tmp_path, env=env)
    assert gate.returncode == 1
    assert "quality gate: exact match improved by" in gate.stderr and "Traceback" not in gate.stderr


def test_a_bad_gate_metric_is_one_line_exit_2_and_nothing_written(tmp_path: Path) -> None:
    r = llmpack("run", "--param", "gate_metric=accuracy", "--output-dir", str(tmp_path / "runs"),
                "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "gate_metric" in lines[0] and "'auto'" in lines[0], r.stderr
    assert not (tmp_path / "runs").exists()
