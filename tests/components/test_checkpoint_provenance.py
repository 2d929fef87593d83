"""Checkpoints are the user's own or never resumed (issue 46, items 2, 9 and 10).

Item 2: a checkpoint forged by whoever can write the checkpoint directory (under another key, or
with no signature, even of the final step with chosen weights) is refused in one line and never
loaded, whether the checkpoint dir is explicit (no owner check) or the run's own on the volume;
the finetune step then trains. Item 9: manifests and state are read bounded (deep nesting, a FIFO,
a sparse file, a huge ``state.json``, entries naming files outside the checkpoint or symlinks).
Item 10: a symlinked run directory on the volume is refused; nothing it points at is written or
removed. The attacker writes under ``LLMPACK_SIGNING_KEY``; the session's key file is the user's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from components import settings
from components.errors import InputError
from components.training.checkpoint_state import DATA_FILE, TENSORS_FILE
from components.training.checkpointing import (
    MANIFEST,
    newest_checkpoint,
    resume_newest,
    save_checkpoint,
    write_manifest,
)
from tests.conftest import REPO

torch = pytest.importorskip("torch")
OWNER = {"pipeline_run": "run-a", "step": "finetune"}
ATTACKER_KEY = "ab" * 32


def _trained(seed: int = 0, fill: float | None = None) -> tuple[Any, Any]:
    """A small model and an AdamW that took two steps; ``fill``: every weight set to that (chosen weights)."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    for _ in range(2):
        net(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    if fill is not None:
        with torch.no_grad():
            for p in net.parameters():
                p.fill_(fill)
    return net, opt


def _forge(root: Path, step_no: int, monkeypatch: pytest.MonkeyPatch, *, how: str,
           owner: dict[str, str] | None = OWNER, fingerprint: str = "fp") -> Path:
    """What whoever can write the directory plants: a whole checkpoint of chosen weights (7.0), its manifest
    listing the right sizes and sha256, signed with their own key or not at all."""
    net, opt = _trained(fill=7.0)
    with monkeypatch.context() as m:
        m.setenv("LLMPACK_SIGNING_KEY", ATTACKER_KEY)
        path = save_checkpoint(root, step_no, net, opt, fingerprint, owner=owner)
    if how == "unsigned":
        manifest = json.loads((path / MANIFEST).read_text())
        manifest.pop("signature", None)
        (path / MANIFEST).write_text(json.dumps(manifest))
    return path


def _no_forged_weights(net: Any) -> bool:
    return not any(torch.all(p == 7.0) for p in net.parameters())


def _lines(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


# --------------------------------------------------------------------------- item 2: provenance


@pytest.mark.parametrize("how", ["another key", "unsigned"])
@pytest.mark.parametrize("owner", [None, OWNER], ids=["explicit-dir", "volume"])
def test_a_forged_final_checkpoint_is_refused_and_never_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        how: str, owner: dict[str, str] | None) -> None:
    root = tmp_path / "ckpt"
    net, opt = _trained()
    save_checkpoint(root, 2, net, opt, "fp", owner=OWNER)  # the user's own, signed with the session key
    forged = _forge(root, 6, monkeypatch, how=how)
    fresh, fresh_opt = _trained(seed=1)
    assert resume_newest(root, "fp", fresh, fresh_opt, owner=owner) == (root / "step-00000002", 2)
    assert _no_forged_weights(fresh)
    lines = _lines(capsys.readouterr().out, str(forged))
    assert len(lines) == 1 and lines[0].startswith(f"finetune: refusing checkpoint {forged}: "), lines
    assert ("unsigned" if how == "unsigned" else "does not verify with your signing key") in lines[0]


def test_a_forged_checkpoint_alone_means_training_starts_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    forged = _forge(tmp_path / "ckpt", 120, monkeypatch, how="another key")
    fresh, fresh_opt = _trained(seed=1)
    assert resume_newest(tmp_path / "ckpt", "fp", fresh, fresh_opt) is None  # step 0: training runs
    assert _no_forged_weights(fresh) and newest_checkpoint(tmp_path / "ckpt", "fp") is None
    assert len(_lines(capsys.readouterr().out, f"refusing checkpoint {forged}")) == 1


def test_a_signed_manifest_edited_or_renamed_no_longer_verifies(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Someone else's signed checkpoint given this run's owner; a user's step 2 renamed as the final step."""
    root = tmp_path / "ckpt"
    net, opt = _trained()
    theirs = save_checkpoint(root, 4, net, opt, "fp", owner={"pipeline_run": "run-b", "step": "finetune"})
    manifest = json.loads((theirs / MANIFEST).read_text())
    manifest["owner"] = OWNER
    (theirs / MANIFEST).write_text(json.dumps(manifest))
    fresh, fresh_opt = _trained(seed=1)
    assert resume_newest(root, "fp", fresh, fresh_opt, owner=OWNER) is None
    assert "does not verify" in capsys.readouterr().out
    shutil.rmtree(theirs)
    mine = save_checkpoint(root, 2, net, opt, "fp", owner=OWNER)
    shutil.copytree(mine, root / "step-00000120")
    assert resume_newest(root, "fp", fresh, fresh_opt, owner=OWNER) == (mine, 2)
    assert len(_lines(capsys.readouterr().out, "is step 2's, in a directory named 'step-00000120'")) == 1


@pytest.mark.slow
def test_the_finetune_step_trains_past_a_forged_final_checkpoint(tokens: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported case on the real step: a forged ``step-<max_steps>`` (chosen adapter weights, the
    fingerprint recomputed, the manifest rewritten) in an explicit ``checkpoint_dir`` and on the volume.
    The step refuses it in one line and trains: the adapter is the one honest training gives."""
    from safetensors.torch import load_file, save_file

    env = {**os.environ, "PYTHONPATH": str(REPO), "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1"}
    env.pop(settings.CHECKPOINT_ROOT.name, None)
    args = ["--param=max_steps=6", "--param=batch_size=4", "--param=checkpoint_every=2"]

    def finetune(out: str, *extra: str, **more_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "components.run", "components.steps.finetune:finetune",
                               f"--input=tokens={tokens}", f"--output=model={tmp_path / out}", *args, *extra],
                              cwd=REPO, env={**env, **more_env}, capture_output=True, text=True, timeout=300)

    honest = finetune("honest", f"--param=checkpoint_dir={tmp_path / 'honest-ckpt'}")
    assert honest.returncode == 0, honest.stdout + honest.stderr

    def plant(root: Path, owner: dict[str, str]) -> Path:
        """step 4's files, its step set to 6 and every trainable weight to 7.0, re-listed under the attacker's key."""
        forged = root / "step-00000006"
        shutil.copytree(tmp_path / "honest-ckpt" / "step-00000004", forged)
        state = json.loads((forged / DATA_FILE).read_text())
        state["step"] = 6
        (forged / DATA_FILE).write_text(json.dumps(state))
        tensors = load_file(str(forged / TENSORS_FILE))
        trainable = {ref["$tensor"] for ref in state["trainable"].values()}
        save_file({k: torch.full_like(v, 7.0) if k in trainable else v for k, v in tensors.items()},
                  str(forged / TENSORS_FILE))
        (forged / MANIFEST).unlink()
        monkeypatch.setenv("LLMPACK_SIGNING_KEY", ATTACKER_KEY)
        write_manifest(forged, 6, json.loads((tmp_path / "honest-ckpt" / "step-00000004" / MANIFEST).read_text())
                       ["fingerprint"], owner)
        monkeypatch.delenv("LLMPACK_SIGNING_KEY")
        return forged

    adapter = Path("adapter") / "adapter_model.safetensors"
    explicit = tmp_path / "explicit"
    shutil.copytree(tmp_path / "honest-ckpt", explicit)
    forged = plant(explicit, {"pipeline_run": "", "step": "finetune"})
    again = finetune("again", f"--param=checkpoint_dir={explicit}")
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(_lines(again.stdout, f"refusing checkpoint {forged}")) == 1, again.stdout
    assert f"resumed from {explicit / 'step-00000004'} at step 4" in again.stdout
    assert (tmp_path / "again" / adapter).read_bytes() == (tmp_path / "honest" / adapter).read_bytes()

    pvc = tmp_path / "pvc"
    (pvc / "run-f" / "finetune").mkdir(parents=True)
    forged = plant(pvc / "run-f" / "finetune", {"pipeline_run": "run-f", "step": "finetune"})
    from tests.sealing import for_run

    run_tokens = for_run(tokens, tmp_path / "run-f-tokens", "run-f")  # a run takes only its own run's outputs
    vol = finetune("vol", "--param=pipeline_run=run-f", f"--input=tokens={run_tokens}",
                   **{settings.CHECKPOINT_ROOT.name: str(pvc)})
    assert vol.returncode == 0, vol.stdout + vol.stderr
    assert len(_lines(vol.stdout, f"refusing checkpoint {forged}")) == 1 and "finetune: resumed from" not in vol.stdout
    assert len((tmp_path / "vol" / "train_log.jsonl").read_text().splitlines()) == 6  # all six steps trained
    assert (tmp_path / "vol" / adapter).read_bytes() == (tmp_path / "honest" / adapter).read_bytes()


# --------------------------------------------------------------------------- item 9: bounded manifests and state


def _two(root: Path) -> tuple[Path, Path]:
    net, opt = _trained()
    return save_checkpoint(root, 2, net, opt, "fp"), save_checkpoint(root, 4, net, opt, "fp")


def _in_thread(fn: Any, unblock: Path | None = None, timeout_s: float = 20) -> Any:
    """``fn()`` within ``timeout_s``; a FIFO ``unblock`` is opened for writing after it (so a hung reader ends)."""
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(value=fn()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    hung = thread.is_alive()
    if hung and unblock is not None:
        os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))  # the reader sees EOF
        thread.join(10)
    assert not hung, f"blocked for over {timeout_s} s"
    return result.get("value")


@pytest.mark.parametrize(("deep", "why"), [(100_000, "larger than the 64 KiB limit"), (20_000, "nested deeper than")])
def test_a_manifest_nested_100k_deep_is_one_skip_not_a_recursion_error(tmp_path: Path, deep: int, why: str) -> None:
    older, newest = _two(tmp_path)
    (newest / MANIFEST).write_text("[" * deep + "]" * deep)
    skipped: list[str] = []
    for _ in range(2):  # every retry the same: one skip, never a RecursionError
        assert newest_checkpoint(tmp_path, "fp", on_skip=lambda p, w: skipped.append(w)) == older
    assert len(skipped) == 2 and skipped[0] == skipped[1] and f"no valid {MANIFEST} (" in skipped[0]
    assert why in skipped[0], skipped[0]


def test_a_fifo_as_manifest_or_state_never_blocks_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    older, newest = _two(tmp_path)
    (newest / MANIFEST).unlink()
    os.mkfifo(newest / MANIFEST)
    fresh, fresh_opt = _trained(seed=1)
    assert _in_thread(lambda: resume_newest(tmp_path, "fp", fresh, fresh_opt), newest / MANIFEST) == (older, 2)
    assert "not a regular file" in _lines(capsys.readouterr().out, str(newest))[0]
    (older / TENSORS_FILE).unlink()
    os.mkfifo(older / TENSORS_FILE)
    assert _in_thread(lambda: resume_newest(tmp_path, "fp", fresh, fresh_opt), older / TENSORS_FILE) is None
    assert "FIFO" in _lines(capsys.readouterr().out, str(older))[0]


def test_a_sparse_file_is_never_hashed_unless_the_user_signed_its_size(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A 4 GiB sparse ``state.safetensors`` listed at its size by an unsigned manifest: refused before any read
    (hashing it took 17 s); listed at another size by the user's signed one: refused by fstat alone."""
    older, newest = _two(tmp_path)
    manifest = json.loads((newest / MANIFEST).read_text())
    with (newest / TENSORS_FILE).open("r+b") as fh:
        fh.truncate(4 << 30)
    manifest["files"][TENSORS_FILE]["bytes"] = 4 << 30
    manifest.pop("signature", None)
    (newest / MANIFEST).write_text(json.dumps(manifest))
    fresh, fresh_opt = _trained(seed=1)
    began = time.monotonic()
    assert resume_newest(tmp_path, "fp", fresh, fresh_opt) == (older, 2)
    assert time.monotonic() - began < 2.0
    with (older / TENSORS_FILE).open("r+b") as fh:
        fh.truncate(4 << 30)  # the user's signed manifest says a few KiB
    began = time.monotonic()
    assert resume_newest(tmp_path, "fp", fresh, fresh_opt) is None
    assert time.monotonic() - began < 2.0
    assert f"has {4 << 30} bytes, the manifest says" in _lines(capsys.readouterr().out, str(older))[0]


def test_a_state_json_over_its_cap_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 12 MiB ``state.json`` (95 MiB cost 770 MiB): refused from the signed manifest's size, nothing parsed."""
    older, newest = _two(tmp_path)
    (newest / MANIFEST).unlink()
    (newest / DATA_FILE).write_text(json.dumps({"pad": [1] * (4 << 20)}))
    write_manifest(newest, 4, "fp")  # even signed by the user's own key
    fresh, fresh_opt = _trained(seed=1)
    tracemalloc.start()
    try:
        assert resume_newest(tmp_path, "fp", fresh, fresh_opt) == (older, 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak >> 20} MiB traced"
    line = _lines(capsys.readouterr().out, str(newest))[0]
    assert "over its 8388608 byte cap" in line, line


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_manifest_entries_outside_the_checkpoint_are_refused_before_any_stat(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signed: bool) -> None:
    """Entries ``../secret``, ``/abs/secret``, ``sub/../../secret``: no existence or size oracle, no stat of them."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 1234)
    root = tmp_path / "ckpt"
    _, newest = _two(root)
    manifest = json.loads((newest / MANIFEST).read_text())
    touched: list[str] = []
    for real in ("stat", "lstat", "open"):
        original = getattr(os, real)

        def spy(path: Any, *a: Any, _original: Any = original, **k: Any) -> Any:
            touched.append(str(path))
            return _original(path, *a, **k)

        monkeypatch.setattr(os, real, spy)
    for name in ("../secret", str(secret), "sub/../../../secret"):
        doc = {**manifest, "files": {**manifest["files"], name: {"bytes": 1234, "sha256": "0" * 64}}}
        doc.pop("signature", None)
        if signed:
            from components.provenance import sign

            doc["signature"] = sign("checkpoint", doc)
        (newest / MANIFEST).write_text(json.dumps(doc))
        refused: list[str] = []
        found = newest_checkpoint(root, "fp", on_refuse=lambda p, w, seen=refused: seen.append(w))
        assert found == root / "step-00000002"
        assert len(refused) == 1 and "1234" not in refused[0] and "missing" not in refused[0], refused
        assert not [t for t in touched if t.endswith("secret")], touched


def test_symlinks_are_refused_as_state_files_and_as_checkpoints(tmp_path: Path) -> None:
    """A signed checkpoint whose ``state.safetensors`` is a symlink (to the very bytes it lists), and a
    ``step-*`` entry that is a symlink to a whole signed checkpoint elsewhere: neither followed."""
    root = tmp_path / "ckpt"
    older, newest = _two(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (newest / TENSORS_FILE).rename(elsewhere / TENSORS_FILE)
    (newest / TENSORS_FILE).symlink_to(elsewhere / TENSORS_FILE)
    refused: list[tuple[Path, str]] = []
    assert newest_checkpoint(root, "fp", on_refuse=lambda p, w: refused.append((p, w))) == older
    assert refused == [(newest, f"{TENSORS_FILE} is not a regular file (a symlink, FIFO or device is refused)")]
    net, opt = _trained()
    other = save_checkpoint(tmp_path / "other", 6, net, opt, "fp")
    (root / "step-00000006").symlink_to(other, target_is_directory=True)
    refused.clear()
    assert newest_checkpoint(root, "fp", on_refuse=lambda p, w: refused.append((p, w))) == older
    assert refused[0] == (root / "step-00000006", "not a directory (a symlink is refused)")


# --------------------------------------------------------------------------- item 10: the volume's run directory


def _as_step(tmp_path: Path, run: str) -> Any:
    from components import reporting
    from components.reporting import RunContext, StepTelemetry

    ctx = RunContext(run_group="g", pipeline_run=run, orchestrator="argo", mode="cluster", submitted_at=0.0)
    reporting.begin(StepTelemetry(ctx, "finetune", tmp_path / "events.jsonl"))
    return reporting


def test_a_symlinked_run_directory_on_the_volume_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from components.steps.finetune import checkpoint_root

    target = tmp_path / "target"
    (target / "finetune").mkdir(parents=True)
    (tmp_path / "pvc").mkdir()
    (tmp_path / "pvc" / "run-7").symlink_to(target, target_is_directory=True)
    monkeypatch.setenv(settings.CHECKPOINT_ROOT.name, str(tmp_path / "pvc"))
    reporting = _as_step(tmp_path, "run-7")
    try:
        with pytest.raises(InputError, match=r"run-7 is a symlink; the checkpoint root's run directory must be a real"):
            checkpoint_root("", tmp_path / "out")
    finally:
        reporting.end()
    assert (tmp_path / "pvc" / "run-7").is_symlink() and (target / "finetune").is_dir()


def test_scratch_checkpoints_are_not_removed_through_a_symlink_planted_since(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from components.training.checkpointing import real_run_dir, remove_scratch

    pvc, target = tmp_path / "pvc", tmp_path / "target"
    ckpt = real_run_dir(pvc, pvc / "run-a" / "finetune")
    (target / "finetune").mkdir(parents=True)
    (target / "finetune" / "precious").write_text("kept")
    shutil.rmtree(pvc / "run-a")
    (pvc / "run-a").symlink_to(target, target_is_directory=True)  # planted while the run trained
    remove_scratch(ckpt, pvc)
    assert (target / "finetune" / "precious").read_text() == "kept"
    assert "not removing checkpoints under" in capsys.readouterr().out
    (pvc / "run-a").unlink()
    real_run_dir(pvc, ckpt)
    (ckpt / "step-00000002").mkdir()
    remove_scratch(ckpt, pvc)  # a real one: removed, with the emptied run directory
    assert list(pvc.iterdir()) == []


@pytest.mark.slow
def test_the_finetune_step_refuses_a_symlinked_run_directory_and_removes_nothing(tokens: Path,
                                                                                 tmp_path: Path) -> None:
    """The reported case: ``<root>/<run>`` a symlink; the run used to write into its target and delete
    ``<target>/finetune`` at the end. Now: exit 2, one line, the target untouched."""
    pvc, target = tmp_path / "pvc", tmp_path / "target"
    (target / "finetune").mkdir(parents=True)
    (target / "finetune" / "precious").write_text("kept")
    pvc.mkdir()
    (pvc / "run-s").symlink_to(target, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1",
           settings.CHECKPOINT_ROOT.name: str(pvc)}
    from tests.sealing import for_run

    run_tokens = for_run(tokens, tmp_path / "run-s-tokens", "run-s")  # a run takes only its own run's outputs
    r = subprocess.run([sys.executable, "-m", "components.run", "components.steps.finetune:finetune",
                        f"--input=tokens={run_tokens}", f"--output=model={tmp_path / 'out'}", "--param=max_steps=2",
                        "--param=batch_size=4", "--param=pipeline_run=run-s"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(_lines(r.stderr, "is a symlink")) == 1, r.stderr
    assert (target / "finetune" / "precious").read_text() == "kept"
    assert sorted(p.name for p in target.rglob("*")) == ["finetune", "precious"]


@pytest.mark.slow  # two finetune step processes
@pytest.mark.parametrize("where", ["checkpoint_dir", "root"])
def test_a_checkpoint_place_that_cannot_be_a_directory_is_one_line(tokens: Path, tmp_path: Path, where: str) -> None:
    """Round 7 (B5): ``checkpoint_dir`` (or the checkpoint volume) a file gave FileExistsError's traceback, exit 1."""
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    env = {**os.environ, "PYTHONPATH": str(REPO), "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1",
           **({settings.CHECKPOINT_ROOT.name: str(afile)} if where == "root" else {})}
    from tests.sealing import for_run

    run_tokens = for_run(tokens, tmp_path / "run-f-tokens", "run-f")  # a run takes only its own run's outputs
    extra = ([f"--param=checkpoint_dir={afile}"] if where == "checkpoint_dir"
             else ["--param=pipeline_run=run-f", f"--input=tokens={run_tokens}"])
    r = subprocess.run([sys.executable, "-m", "components.run", "components.steps.finetune:finetune",
                        f"--input=tokens={tokens}", f"--output=model={tmp_path / 'out'}", "--param=max_steps=2",
                        "--param=batch_size=4", *extra], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "cannot be made a directory" in r.stderr or "not a directory" in r.stderr, r.stderr
