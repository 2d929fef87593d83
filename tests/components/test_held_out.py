"""Held-out means held out: no eval prompt, nor any word or number in it, is in training.

Issue 48: 94 of 200 "held-out" prompts were in the training split, so exact match measured recall.
The built-in set is now split by construction (components.training.data.builtin_split) and a
user's JSONL by prompt identity (split_rows); prepare_data reports the duplicates it grouped.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

import pytest

from components.training.data import builtin_split, prompt_key, split_rows
from tests.conftest import run_step

PREP = "components.steps.prepare_data:prepare_data"

TOKEN = re.compile(r"[a-z]+|\d+")


def _inputs(prompt: str) -> set[str]:
    """The words and numbers a built-in prompt is made of (its task word left out)."""
    return set(TOKEN.findall(prompt.partition(": ")[2].lower()))


@pytest.mark.parametrize("seed", range(20))
def test_builtin_eval_prompts_and_their_words_and_numbers_are_unseen(seed: int) -> None:
    train, ev = builtin_split(2000, seed, 0.1)
    assert len(train) + len(ev) == 2000 and len(ev) == 200
    train_prompts = {r["prompt"] for r in train}
    assert not train_prompts & {r["prompt"] for r in ev}
    seen = set().union(*(_inputs(r["prompt"]) for r in train))
    for row in ev:
        assert not _inputs(row["prompt"]) & seen, row["prompt"]
    assert len({r["prompt"] for r in ev}) == len(ev)  # eval prompts distinct
    assert {r["prompt"].partition(":")[0] for r in ev} == {"Uppercase", "Reverse", "Add"}


def test_builtin_vocabulary_is_large_and_from_the_seed() -> None:
    train0, _ = builtin_split(2000, 0, 0.1)
    train1, _ = builtin_split(2000, 1, 0.1)
    words0 = set().union(*(_inputs(r["prompt"]) for r in train0 if not r["prompt"].startswith("Add")))
    assert len(words0) > 500  # not a 22-word lookup table
    assert builtin_split(50, 0, 0.1) == builtin_split(50, 0, 0.1) and train0 != train1


def _full_width(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def _zero_width(text: str) -> str:
    """Invisible code points inside (format characters and the other default-ignorables: a grapheme joiner,
    a variation selector, a Hangul filler), as the second check of issue 48 planted them."""
    return text[:3] + "\u200b" + text[3:5] + "\u034f\ufe0f" + text[5:] + "\u3164\u200d"


@pytest.mark.parametrize("seed", range(20))
def test_user_rows_with_planted_duplicates_never_cross_the_split(seed: int) -> None:
    rng = random.Random(seed)
    base = [{"prompt": f"Question {i}: {rng.random():.6f}", "response": str(i)} for i in range(300)]
    planted = [dict(rng.choice(base)) for _ in range(150)]  # exact copies
    for row in planted[:50]:  # copies differing only in whitespace are the same prompt
        row["prompt"] = "  " + row["prompt"].replace(" ", "   ") + "\t"
    for row in planted[50:80]:  # ... in case, full-width letters or a zero-width space too
        row["prompt"] = rng.choice([str.upper, str.swapcase, _full_width, _zero_width])(row["prompt"])
    rows = base + planted
    rng.shuffle(rows)
    train, ev, dups = split_rows(rows, seed=seed, eval_fraction=0.2)
    assert dups == 150
    assert not {prompt_key(r) for r in train} & {prompt_key(r) for r in ev}
    assert len({prompt_key(r) for r in ev}) == len(ev)  # one eval row per prompt
    eval_keys = {prompt_key(e) for e in ev}
    dropped = sum(1 for r in rows if prompt_key(r) in eval_keys) - len(ev)  # eval keeps one copy of each
    assert len(train) + len(ev) == len(rows) - dropped


def test_a_file_of_one_prompt_repeated_is_refused_in_one_line() -> None:
    from components.errors import InputError
    with pytest.raises(InputError, match="2 distinct prompts"):
        split_rows([{"prompt": "same", "response": "x"}] * 5, seed=0, eval_fraction=0.5)


def test_prepare_data_reports_the_duplicates(tmp_path: Path, step_env: dict[str, str]) -> None:
    data = tmp_path / "dups.jsonl"
    rows = [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(10)] + [{"prompt": "q1", "response": "a1"}] * 3
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    r = run_step(PREP, f"--output=dataset={tmp_path / 'out'}", f"--param=data={data}", "--param=eval_fraction=0.3",
                 cwd=tmp_path, env={**step_env, "LLMPACK_MLFLOW_LOGGING": "0"})
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["duplicate_rows"] == 3 and meta["rows"] == 13
    assert meta["dropped_rows"] == 13 - meta["train"] - meta["eval"]
    train = (tmp_path / "out" / "train.jsonl").read_text().splitlines()
    ev = (tmp_path / "out" / "eval.jsonl").read_text().splitlines()
    assert not {json.loads(x)["prompt"] for x in train} & {json.loads(x)["prompt"] for x in ev}


def test_tokenize_reads_only_the_split_prepare_data_sealed(tmp_path: Path, step_env: dict[str, str]) -> None:
    """Issue 46 (B3): a writer of the volume who swaps eval.jsonl after prepare_data (the training rows copied
    in, so "held out" is recall again) or writes a dataset by hand gets one line from tokenize, no tokens."""
    env = {**step_env, "LLMPACK_MLFLOW_LOGGING": "0"}
    r = run_step(PREP, f"--output=dataset={tmp_path / 'out'}", "--param=builtin_size=200", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    tok = "components.steps.tokenize:tokenize"

    def tokenize(dataset: Path, out: str) -> subprocess.CompletedProcess[str]:
        return run_step(tok, f"--input=dataset={dataset}", f"--output=tokens={tmp_path / out}", "--param=seq_len=64",
                        cwd=tmp_path, env=env)

    ok = tokenize(tmp_path / "out", "tok-ok")
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "tok-ok" / "llmpack-tokens.seal.json").is_file()
    train = (tmp_path / "out" / "train.jsonl").read_bytes()
    (tmp_path / "out" / "eval.jsonl").write_bytes(train)  # the eval split replaced by training rows
    swapped = tokenize(tmp_path / "out", "tok-swapped")
    assert swapped.returncode == 2 and "not the file that was sealed" in swapped.stderr, swapped.stderr
    assert "Traceback" not in swapped.stderr and not (tmp_path / "tok-swapped" / "train_input_ids.npy").exists()
    hand = tmp_path / "hand"
    hand.mkdir()
    (hand / "train.jsonl").write_bytes(train)
    (hand / "eval.jsonl").write_bytes(train)
    unsealed = tokenize(hand, "tok-hand")
    assert unsealed.returncode == 2 and "no llmpack-dataset.seal.json" in unsealed.stderr, unsealed.stderr
