"""The model evaluate scores and register logs is the one finetune wrote (components/serving/sealed.py).

An adapter swapped on disk between finetune and evaluate was scored, signed and registered (the
second independent check's n3): evaluate hashed whatever was there. Now finetune signs the digests
of what it wrote, and evaluate and register read only a private copy checked against them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from components.errors import InputError
from components.serving import sealed
from components.training.modeling import MODEL_META
from tests.conftest import run_step

pytestmark = pytest.mark.slow  # finetune, evaluate and register processes in every test: the slow tier

EVAL = "components.steps.evaluate:evaluate"
REG = "components.steps.register:register"
ADAPTER = "adapter/adapter_model.safetensors"


@pytest.fixture()
def env() -> dict[str, str]:
    return {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1"}


def _copy(finetuned: Path, tmp_path: Path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(finetuned, model)
    return model


def _evaluate(tokens: Path, model: Path, out: Path, env: dict[str, str], *params: str):
    return run_step(EVAL, f"--input=tokens={tokens}", f"--input=model={model}", f"--output=metrics={out}", *params,
                    cwd=out.parent, env=env)


def _refused(r, says: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert says in lines[-1] and "Traceback" not in r.stderr, r.stderr


def test_finetune_seals_what_it_wrote(finetuned: Path) -> None:
    seal = sealed.verified_seal(finetuned, "")
    assert seal["weights"] == "adapter" and MODEL_META in seal["files"] and ADAPTER in seal["files"]
    assert not any(p.name.startswith(".llmpack-weights-") for p in finetuned.iterdir())  # the staging is gone


def test_an_adapter_swapped_after_finetune_is_not_scored(tokens: Path, finetuned: Path, tmp_path: Path,
                                                         env: dict[str, str]) -> None:
    model = _copy(finetuned, tmp_path)
    swapped = bytearray((model / ADAPTER).read_bytes())
    swapped[-1] ^= 0x01  # one bit of one weight: same size, other bytes
    (model / ADAPTER).write_bytes(bytes(swapped))
    r = _evaluate(tokens, model, tmp_path / "m", env)
    _refused(r, "not the file that was sealed")
    assert not (tmp_path / "m" / "metrics.json").exists()


def test_an_unsealed_or_resealed_model_is_not_scored(tokens: Path, finetuned: Path, tmp_path: Path,
                                                     env: dict[str, str]) -> None:
    model = _copy(finetuned, tmp_path)
    seal = json.loads((model / sealed.SEAL_FILE).read_text())
    (model / sealed.SEAL_FILE).unlink()
    _refused(_evaluate(tokens, model, tmp_path / "a", env), "no llmpack-model.seal.json: not an output finetune wrote")
    # the swapped file's digest written into the seal: the signature no longer verifies
    (model / ADAPTER).write_bytes(b"\0" * 64)
    seal["files"][ADAPTER] = {"bytes": 64, "sha256": "b5" * 32}
    (model / sealed.SEAL_FILE).write_text(json.dumps(seal))
    _refused(_evaluate(tokens, model, tmp_path / "b", env), "not signed by this environment's key")


def test_a_symlink_where_a_sealed_file_was_is_refused(tokens: Path, finetuned: Path, tmp_path: Path,
                                                      env: dict[str, str]) -> None:
    model = _copy(finetuned, tmp_path)
    real = tmp_path / "elsewhere.safetensors"
    os.replace(model / ADAPTER, real)
    os.symlink(real, model / ADAPTER)  # the very bytes, through a link someone else controls
    _refused(_evaluate(tokens, model, tmp_path / "m", env), "a symlink where a regular file is expected")


def test_an_adapter_swapped_after_evaluate_is_not_registered(tokens: Path, finetuned: Path, tmp_path: Path,
                                                             env: dict[str, str]) -> None:
    model = _copy(finetuned, tmp_path)
    assert _evaluate(tokens, model, tmp_path / "m", env).returncode == 0
    (model / ADAPTER).write_bytes((model / ADAPTER).read_bytes()[:-1] + b"\0")
    r = run_step(REG, f"--input=model={model}", f"--input=metrics={tmp_path / 'm'}",
                 f"--output=registration={tmp_path / 'r'}", cwd=tmp_path, env=env)
    _refused(r, "not the file that was sealed")
    assert not (tmp_path / "r" / "registration.json").exists()


def _save(out: Path, run: str) -> None:
    with sealed.sealed_output(out, sealed.MODEL, run, weights="adapter", meta=MODEL_META) as private:
        (private / "adapter").mkdir()
        (private / "adapter" / "w.bin").write_bytes(b"weights")
        (private / MODEL_META).write_text('{"method": "lora"}\n')


def test_a_model_sealed_in_another_pipeline_run_is_refused(tmp_path: Path) -> None:
    _save(tmp_path / "m", "run-a")
    assert sealed.verified_seal(tmp_path / "m", "run-a")["files"]["adapter/w.bin"]["bytes"] == 7
    with pytest.raises(InputError, match="pipeline run 'run-a''s, not 'run-b''s"):
        sealed.verified_seal(tmp_path / "m", "run-b")


def test_the_private_copy_is_exactly_the_sealed_bytes_or_nothing(tmp_path: Path) -> None:
    _save(tmp_path / "m", "")
    files = sealed.verified_seal(tmp_path / "m", "")["files"]
    copy = sealed.private_copy(tmp_path / "m", files, tmp_path / "c")
    assert (copy / "adapter" / "w.bin").read_bytes() == b"weights" and oct(copy.stat().st_mode)[-3:] == "700"
    (tmp_path / "m" / "adapter" / "w.bin").write_bytes(b"weights and more")  # longer: read stops at the seal's size
    with pytest.raises(InputError, match="not the file that was sealed"):
        sealed.private_copy(tmp_path / "m", files, tmp_path / "d")
    assert not (tmp_path / "d").exists()  # nothing half-copied is left
    bad = {"../escape": files["adapter/w.bin"]}
    with pytest.raises(InputError, match="only files inside the output"):
        sealed.private_copy(tmp_path / "m", bad, tmp_path / "e")


def test_the_output_is_written_outside_the_volume_and_sealed_as_written(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The third check's race: peft wrote into a staging directory inside the output, and the seal hashed the files
    back from there, so a writer of the volume flipping a bit in between had its bytes signed. Now the staging is
    the process's own temporary directory, and the digest is of the bytes as they are copied out."""
    out = tmp_path / "volume" / "model"
    real_replace = os.replace

    def flip_after_write(src: str | Path, dst: str | Path, **kw: int) -> None:  # a volume writer, after each write
        real_replace(src, dst, **kw)
        if Path(dst).name == "w.bin":
            (out / "adapter" / "w.bin").write_bytes(b"weightz")

    with sealed.sealed_output(out, sealed.MODEL, "", weights="adapter", meta=MODEL_META) as private:
        assert not private.resolve().is_relative_to(out.parent.resolve())
        (private / "adapter").mkdir()
        (private / "adapter" / "w.bin").write_bytes(b"weights")
        (private / MODEL_META).write_text('{"method": "lora"}\n')
        monkeypatch.setattr(os, "replace", flip_after_write)
    monkeypatch.undo()
    files = sealed.verified_model(out, "")["files"]
    with pytest.raises(InputError, match="w.bin: not the file that was sealed"):  # the seal holds what was written
        sealed.private_copy(out, files, tmp_path / "copy")


@pytest.mark.parametrize("victim", ["eval_prompts.jsonl", "eval_labels.npy", "meta.json"])
def test_a_tokens_file_changed_after_tokenize_is_not_scored(tokens: Path, finetuned: Path, tmp_path: Path,
                                                            env: dict[str, str], victim: str) -> None:
    """The eval split, its answers (the gate's exact match) and its meta: sealed by tokenize, read from a private
    copy by evaluate, so rewriting the answers to what the adapter says, or swapping the split for the scoring and
    back for the fingerprint, is refused."""
    tok = tmp_path / "tok"
    shutil.copytree(tokens, tok)
    path = tok / victim
    if victim == "meta.json":
        path.unlink()
        os.mkfifo(path)  # a reader that opened it would block for ever
    else:
        data = bytearray(path.read_bytes())
        data[-2] ^= 0x01
        path.write_bytes(bytes(data))
    r = _evaluate(tok, finetuned, tmp_path / "m", env)
    _refused(r, "a FIFO" if victim == "meta.json" else "not the file that was sealed")
    assert not (tmp_path / "m" / "metrics.json").exists()


def test_another_genuine_tokenize_output_is_not_scored_in_place_of_the_one_trained_beside(
        tokens: Path, finetuned: Path, tmp_path: Path, env: dict[str, str]) -> None:
    """Issue 46, round 16: a seal named its kind and run only, so a writer of the volume could put another tokenize
    output of the same run (sealed with the same key) where evaluate reads its tokens: one whose eval split is the
    training rows scores recall as held-out. finetune now signs which tokens seal it trained on."""
    other = tmp_path / "other-tokens"
    with sealed.sealed_output(other, sealed.TOKENS, "") as private:  # as the run's own tokenize would seal it
        for f in tokens.iterdir():
            if not f.name.endswith(".seal.json"):
                shutil.copy2(f, private / f.name)
        shutil.copy2(tokens / "train_input_ids.npy", private / "eval_input_ids.npy")  # eval = the training rows
        shutil.copy2(tokens / "train_labels.npy", private / "eval_labels.npy")
    _refused(_evaluate(other, finetuned, tmp_path / "m", env), "not trained on the tokens it is scored on")
    assert not (tmp_path / "m" / "metrics.json").exists()
    seal = sealed.verified_seal(finetuned, "")
    assert seal["tokens_seal"] == sealed.seal_id(sealed.verified_seal(tokens, "", sealed.TOKENS))


def test_the_eval_set_fingerprint_covers_the_answers(tmp_path: Path) -> None:
    from components.serving.promotion import eval_set_fingerprint

    for d, answer in (("a", "olleh"), ("b", "hello")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "eval_prompts.jsonl").write_text(json.dumps({"answer": answer}) + "\n")
    assert eval_set_fingerprint(tmp_path / "a") != eval_set_fingerprint(tmp_path / "b")


def test_a_train_split_changed_after_tokenize_is_not_trained_on(tokens: Path, tmp_path: Path,
                                                                env: dict[str, str]) -> None:
    """The fourth check: finetune read the train split straight from the volume, so a model trained on a volume
    writer's data was sealed, scored and registered. It reads a private copy checked against tokenize's seal."""
    tok = tmp_path / "tok"
    shutil.copytree(tokens, tok)
    data = bytearray((tok / "train_labels.npy").read_bytes())
    data[-2] ^= 0x01
    (tok / "train_labels.npy").write_bytes(bytes(data))
    r = run_step("components.steps.finetune:finetune", f"--input=tokens={tok}", f"--output=model={tmp_path / 'm'}",
                 "--param=max_steps=1", "--param=batch_size=4", cwd=tmp_path, env=env)
    _refused(r, "train_labels.npy: not the file that was sealed")
    assert not (tmp_path / "m" / sealed.SEAL_FILE).exists()


def test_a_directory_swapped_for_a_link_during_the_copy_out_is_never_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fourth check: `model/adapter/` swapped for a symlink after the one `lstat` check; the remaining files went
    into the directory the link named. Now each directory is written through its descriptor, opened `O_NOFOLLOW`."""
    out, elsewhere = tmp_path / "volume" / "model", tmp_path / "victim"
    elsewhere.mkdir()
    (elsewhere / "b.bin").write_bytes(b"the victim's file")
    real_open = os.open

    def swap_after_first(path: str | Path, flags: int, mode: int = 0o777, **kw: int) -> int:
        fd = real_open(path, flags, mode, **kw)
        if str(path).startswith(".a.bin.") and (out / "adapter").is_dir() and not (out / "adapter").is_symlink():
            os.replace(out / "adapter", tmp_path / "moved")  # the real directory moved away...
            os.symlink(elsewhere, out / "adapter")  # ...and a link to the victim's in its place
        return fd

    with sealed.sealed_output(out, sealed.MODEL, "", weights="adapter", meta=MODEL_META) as private:
        (private / "adapter").mkdir()
        for name in ("a.bin", "b.bin"):
            (private / "adapter" / name).write_bytes(b"weights " + name.encode())
        (private / MODEL_META).write_text('{"method": "lora"}\n')
        monkeypatch.setattr(os, "open", swap_after_first)
    monkeypatch.undo()
    assert (elsewhere / "b.bin").read_bytes() == b"the victim's file"  # never written through the link
    assert sorted(p.name for p in elsewhere.iterdir()) == ["b.bin"]
    with pytest.raises(InputError):  # and the output the link now stands for is not the sealed one
        sealed.private_copy(out, sealed.verified_model(out, "")["files"], tmp_path / "copy")
