"""A killed finetune never resumes from a partial checkpoint, and its restart ends byte-identical.

The quick tests damage checkpoint directories the ways a SIGKILL can leave them and check that
``newest_checkpoint`` passes over each; the slow one runs ``benchmarks/chaos_sigkill.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from components.training.checkpointing import MANIFEST, checkpoint_problem, newest_checkpoint, write_manifest

REPO = Path(__file__).resolve().parents[2]


def _fake_checkpoint(root: Path, step_no: int, fingerprint: str = "fp", name: str | None = None) -> Path:
    """A checkpoint directory as save_checkpoint leaves it, with made-up state bytes."""
    path = root / (name or f"step-{step_no:08d}")
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(bytes(range(256)) * (step_no + 1))
    write_manifest(path, step_no, fingerprint)
    return path


def _drop_state(path: Path) -> None:
    (path / "state.pt").unlink()


def _truncate_state(path: Path) -> None:
    data = (path / "state.pt").read_bytes()
    (path / "state.pt").write_bytes(data[: len(data) // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray((path / "state.pt").read_bytes())
    data[7] ^= 0xFF
    (path / "state.pt").write_bytes(bytes(data))


def _drop_manifest(path: Path) -> None:
    (path / MANIFEST).unlink()


def _cut_manifest(path: Path) -> None:
    text = (path / MANIFEST).read_text()
    (path / MANIFEST).write_text(text[: len(text) // 2])


def _empty_manifest(path: Path) -> None:
    (path / MANIFEST).write_text('{"step": 4, "fingerprint": "fp", "files": {}}')


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (_drop_state, "state.pt is missing"),
        (_truncate_state, "state.pt has"),
        (_flip_a_byte, "does not match the sha256"),
        (_drop_manifest, "no valid manifest.json"),
        (_cut_manifest, "no valid manifest.json"),
        (_empty_manifest, "lists no state.pt"),
    ],
)
def test_a_damaged_newest_checkpoint_is_passed_over(tmp_path: Path, damage: Callable[[Path], None], why: str) -> None:
    older = _fake_checkpoint(tmp_path, 2)
    newest = _fake_checkpoint(tmp_path, 4)
    assert newest_checkpoint(tmp_path, "fp") == newest
    damage(newest)
    skipped: list[tuple[Path, str]] = []
    assert newest_checkpoint(tmp_path, "fp", on_skip=lambda p, w: skipped.append((p, w))) == older
    assert [p for p, _ in skipped] == [newest] and why in skipped[0][1]
    assert checkpoint_problem(newest) is not None and checkpoint_problem(older) is None
    assert newest_checkpoint(tmp_path) == older  # without a fingerprint too


def test_a_leftover_temp_dir_is_never_chosen(tmp_path: Path) -> None:
    whole = _fake_checkpoint(tmp_path, 2)
    _fake_checkpoint(tmp_path, 4, name=".tmp-step-00000004-12345")  # complete files, never renamed
    assert newest_checkpoint(tmp_path, "fp") == whole
    shutil.rmtree(whole)
    assert newest_checkpoint(tmp_path, "fp") is None


def test_other_settings_checkpoints_are_ignored_not_reported(tmp_path: Path) -> None:
    mine = _fake_checkpoint(tmp_path, 2, fingerprint="mine")
    _fake_checkpoint(tmp_path, 4, fingerprint="theirs")
    skipped: list[Path] = []
    assert newest_checkpoint(tmp_path, "mine", on_skip=lambda p, _: skipped.append(p)) == mine
    assert skipped == []


def test_save_checkpoint_writes_a_manifest_and_clears_leftovers(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from components.training.checkpointing import load_checkpoint, save_checkpoint

    net = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters())
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    (tmp_path / ".tmp-step-00000002-999").mkdir(parents=True)  # a killed write of this very step
    (tmp_path / ".tmp-step-00000001-999").mkdir()  # a killed write of an earlier step
    for step_no in (2, 4, 6):
        save_checkpoint(tmp_path, step_no, net, opt, "fp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000006"]
    newest = newest_checkpoint(tmp_path, "fp")
    assert newest is not None and newest.name == "step-00000006" and checkpoint_problem(newest) is None
    assert load_checkpoint(newest, net, opt) == 6


@pytest.mark.slow
def test_sigkill_at_any_moment_resumes_byte_identical(tmp_path: Path) -> None:
    """One kill each at startup, inside a step and inside a checkpoint write (the pause hook)."""
    r = subprocess.run(
        [sys.executable, "benchmarks/chaos_sigkill.py", "--kills", "3", "--seed", "1", "--max-steps", "8",
         "--checkpoint-every", "2", "--workdir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3/3 identical, 0 partial checkpoints loaded" in r.stdout
    assert "kills that landed: 3/3" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.strip()[:1].isdigit() and "yes" in line]
    assert len(rows) == 3 and "/ checkpoint" in rows[2]  # the third kill landed inside a checkpoint write
