"""A writer of the checkpoint directory never gets its bytes signed by the user's key (issue 46, item 2).

``save_checkpoint`` writes the state files, then the signed manifest. Another writer (the same uid on a
shared volume, or anyone in a writable, non-sticky checkpoint root) used to swap ``state.safetensors`` in
``.tmp-step-N-PID`` between the two: the manifest hashed the swapped file from disk and signed it, so the
forged checkpoint verified and ``load_checkpoint`` restored the attacker's weights (14-20 of 20 saves in a
plain polling race). The race is made deterministic here: ``write_state`` is wrapped so the swap lands
right after it returns, before the manifest is written. Now the digests signed are those of the bytes
the process wrote (hashed as they went out), in a ``mkdtemp`` directory (0700, files 0600): the swapped
file does not match its signed sha256, so the checkpoint is never resumed and the previous one is.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from components.errors import InputError
from components.training import checkpointing
from components.training.checkpoint_state import TENSORS_FILE, UnreadableState
from components.training.checkpointing import (
    checkpoint_problem,
    load_checkpoint,
    newest_checkpoint,
    resume_newest,
    save_checkpoint,
)

torch = pytest.importorskip("torch")
OWNER = {"pipeline_run": "run-a", "step": "finetune"}


def _trained(fill: float | None = None) -> tuple[Any, Any]:
    """A small model and an AdamW that took a step; ``fill``: every weight set to that (the attacker's choice)."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    net(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    if fill is not None:
        with torch.no_grad():
            for p in net.parameters():
                p.fill_(fill)
    return net, opt


def _forged_tensors(tmp_path: Path) -> bytes:
    """The attacker's ``state.safetensors``: the user's own format (learned from any earlier checkpoint), weights 42."""
    net, opt = _trained(fill=42.0)
    probe = save_checkpoint(tmp_path / "probe", 4, net, opt, "fp", owner=OWNER)
    return (probe / TENSORS_FILE).read_bytes()


def _between_state_and_manifest(monkeypatch: pytest.MonkeyPatch, root: Path,
                                act: Callable[[Path], None]) -> list[Path]:
    """Run ``act(the .tmp-step directory)`` right after ``write_state`` returns, before the manifest is written:
    the window another writer races for, held open. Returns the directories it acted on."""
    seen: list[Path] = []
    original = checkpointing.write_state

    def write_then_act(target: Any, state: dict[str, Any]) -> Any:
        result = original(target, state)
        (tmp,) = root.glob(".tmp-step-*")
        seen.append(tmp)
        act(tmp)
        return result

    monkeypatch.setattr(checkpointing, "write_state", write_then_act)
    return seen


def _swap(data: bytes) -> Callable[[Path], None]:
    """What the other writer does: a new file of its bytes renamed over ``state.safetensors``."""
    def swap(tmp: Path) -> None:
        (tmp / ".x").write_bytes(data)
        os.replace(tmp / ".x", tmp / TENSORS_FILE)
    return swap


def _overwrite_in_place(data: bytes) -> Callable[[Path], None]:
    """The same uid writing into the very inode this process created (its descriptor is no protection)."""
    def overwrite(tmp: Path) -> None:
        with open(tmp / TENSORS_FILE, "r+b") as fh:
            fh.write(data)
    return overwrite


@pytest.mark.parametrize("how", ["swapped", "overwritten in place"])
def test_a_state_file_changed_between_write_and_manifest_is_never_signed_nor_resumed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str) -> None:
    forged = _forged_tensors(tmp_path)
    root = tmp_path / "ckpt"
    net, opt = _trained()
    honest = save_checkpoint(root, 2, net, opt, "fp", owner=OWNER)  # the user's own earlier checkpoint
    assert len(forged) == (honest / TENSORS_FILE).stat().st_size  # same layout: only the weights differ
    acted = _between_state_and_manifest(monkeypatch, root, _swap(forged) if how == "swapped"
                                        else _overwrite_in_place(forged))
    final = save_checkpoint(root, 4, net, opt, "fp", owner=OWNER)
    assert acted and (final / TENSORS_FILE).read_bytes() == forged  # the attacker's bytes did land

    # before the fix: None (it verified) and load_checkpoint put 42.0 into the model
    assert "does not match the sha256 in the manifest" in (checkpoint_problem(final) or "")
    assert newest_checkpoint(root, "fp", owner=OWNER) == honest
    fresh, fresh_opt = _trained(fill=0.0)
    with pytest.raises(UnreadableState, match="does not match the sha256"):
        load_checkpoint(final, fresh, fresh_opt)
    assert float(fresh.weight.detach().flatten()[0]) == 0.0  # untouched
    resumed = resume_newest(root, "fp", fresh, fresh_opt, owner=OWNER)
    assert resumed == (honest, 2)
    assert torch.equal(fresh.weight, net.weight) and 42.0 not in fresh.weight  # the user's weights, not the forged
    assert f"skipping unreadable checkpoint {final}" in capsys.readouterr().out


def test_the_write_directory_is_private_and_each_file_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ckpt"
    modes: dict[str, int] = {}

    def look(tmp: Path) -> None:
        st = os.lstat(tmp)
        modes["dir"], modes["uid"] = stat.S_IMODE(st.st_mode), st.st_uid
        modes.update({p.name: stat.S_IMODE(os.lstat(p).st_mode) for p in tmp.iterdir()})

    seen = _between_state_and_manifest(monkeypatch, root, look)
    net, opt = _trained()
    os.umask(old := os.umask(0))  # the most permissive umask: the modes below are the code's own
    try:
        save_checkpoint(root, 4, net, opt, "fp", owner=OWNER)
    finally:
        os.umask(old)
    # a fresh random name (mkdtemp) that still names the step and the writer's pid (benchmarks/chaos_sigkill.py)
    assert re.fullmatch(rf"\.tmp-step-00000004-[a-z0-9_]+-{os.getpid()}", seen[0].name)
    assert modes == {"dir": 0o700, "uid": os.geteuid(), "state.safetensors": 0o600, "state.json": 0o600}


def test_a_write_directory_replaced_while_written_is_not_published(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer of a non-sticky root renames the private directory away and puts a look-alike in its place."""
    forged = _forged_tensors(tmp_path)
    root = tmp_path / "ckpt"

    def replace_dir(tmp: Path) -> None:
        os.rename(tmp, tmp.with_name("away"))
        tmp.mkdir(mode=0o700)
        (tmp / TENSORS_FILE).write_bytes(forged)
        (tmp / "state.json").write_bytes((tmp.with_name("away") / "state.json").read_bytes())

    def move_away(tmp: Path) -> None:
        os.rename(tmp, tmp.with_name("away"))

    net, opt = _trained()
    for act in (replace_dir, move_away):
        with monkeypatch.context() as m:
            _between_state_and_manifest(m, root, act)
            with pytest.raises(InputError, match="was replaced or opened to others while it was written; not pub"):
                save_checkpoint(root, 4, net, opt, "fp", owner=OWNER)
        assert not (root / "step-00000004").exists() and newest_checkpoint(root) is None
        shutil.rmtree(root / "away")


def test_the_streamed_tensors_file_is_byte_for_byte_safetensors_own(tmp_path: Path) -> None:
    """The writer hashes what it streams, so it writes the format itself: exactly what safetensors makes."""
    from safetensors.torch import load_file, save

    from components.training.checkpoint_state import _safetensors, write_file

    tensors = {"w": torch.randn(3, 5), "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4),
               "bf": torch.randn(7).to(torch.bfloat16), "half": torch.randn(2).half(),
               "mask": torch.tensor([True, False]), "step": torch.arange(5), "f64": torch.randn(3, dtype=torch.float64),
               "u8": torch.arange(3).to(torch.uint8), "i16": torch.arange(2).to(torch.int16),
               "i32": torch.arange(3).to(torch.int32)}
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        entry = write_file(fd, "x.safetensors", _safetensors(tensors))
        os.symlink(tmp_path / "x.safetensors", tmp_path / "planted")
        with pytest.raises(FileExistsError):  # O_EXCL|O_NOFOLLOW: never into an entry already there, nor through one
            write_file(fd, "planted", [b"x"])
    finally:
        os.close(fd)
    written = (tmp_path / "x.safetensors").read_bytes()
    assert written == save(tensors)
    assert entry["bytes"] == len(written)
    back = load_file(str(tmp_path / "x.safetensors"))
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in tensors.items())
    with pytest.raises(TypeError, match="complex64 tensor"):
        list(_safetensors({"c": torch.zeros(2, dtype=torch.complex64)}))


def test_a_state_file_rewritten_in_place_while_it_loads_is_refused_never_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second tester's payload: the same inode and size, other bytes, written after the file was opened.

    The sha256 used to be taken through the descriptor, then safetensors read the file again (42 of 300
    loads restored the forged weights); now the bytes hashed are the bytes decoded."""
    from components.training import checkpoint_state

    net, opt = _trained()
    final = save_checkpoint(tmp_path / "ckpt", 4, net, opt, "fp", owner=OWNER)
    forged = _forged_tensors(tmp_path)
    assert len(forged) == (final / TENSORS_FILE).stat().st_size  # same size: only the bytes differ
    opened = checkpoint_state._open_state_file

    def open_then_rewrite(directory: Path, name: str, want: Any, **kwargs: Any) -> int:
        fd = opened(directory, name, want, **kwargs)
        if name == TENSORS_FILE:
            with open(directory / name, "r+b") as fh:  # in place: same inode
                fh.write(forged)
        return fd

    monkeypatch.setattr(checkpoint_state, "_open_state_file", open_then_rewrite)
    fresh, fresh_opt = _trained(fill=0.0)
    with pytest.raises((UnreadableState, InputError)):
        load_checkpoint(final, fresh, fresh_opt)
    assert not any(float(p.detach().abs().max()) == 42.0 for p in fresh.parameters())
