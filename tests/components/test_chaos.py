"""A killed finetune never resumes from a partial checkpoint, and its restart ends byte-identical.

The quick tests damage checkpoint directories the ways a SIGKILL can leave them and check that
``newest_checkpoint`` passes over each; the slow one runs ``benchmarks/chaos_sigkill.py``.
Preemption: on a checkpoint volume (``LLMPACK_CHECKPOINT_ROOT``, what ``--checkpoint-pvc`` sets in
the pod) each run keeps its own directory, so two runs of the very same settings never resume from
each other's state; the slow retry-from-volume test runs the real step as the compiled task would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from components import reporting, settings
from components.errors import InputError
from components.record.telemetry import RunContext
from components.reporting import StepTelemetry
from components.training.checkpoint_state import DATA_FILE, TENSORS_FILE
from components.training.checkpointing import (
    MANIFEST,
    checkpoint_problem,
    newest_checkpoint,
    run_checkpoint_dir,
    write_manifest,
)

REPO = Path(__file__).resolve().parents[2]


def _fake_checkpoint(root: Path, step_no: int, fingerprint: str = "fp", name: str | None = None) -> Path:
    """A checkpoint directory as save_checkpoint leaves it, with made-up state bytes."""
    path = root / (name or f"step-{step_no:08d}")
    path.mkdir(parents=True)
    (path / DATA_FILE).write_text(json.dumps({"step": step_no}) + "\n")
    (path / TENSORS_FILE).write_bytes(bytes(range(256)) * (step_no + 1))
    write_manifest(path, step_no, fingerprint)
    return path


def _drop_state(path: Path) -> None:
    (path / TENSORS_FILE).unlink()


def _truncate_state(path: Path) -> None:
    data = (path / TENSORS_FILE).read_bytes()
    (path / TENSORS_FILE).write_bytes(data[: len(data) // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray((path / TENSORS_FILE).read_bytes())
    data[7] ^= 0xFF
    (path / TENSORS_FILE).write_bytes(bytes(data))


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
        (_drop_state, "state.safetensors is missing"),
        (_truncate_state, "state.safetensors has"),
        (_flip_a_byte, "does not match the sha256"),
        (_drop_manifest, "no valid manifest.json"),
        (_cut_manifest, "no valid manifest.json"),
        (_empty_manifest, "lists no state.json"),
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


def test_other_settings_checkpoints_are_refused_not_skipped(tmp_path: Path) -> None:
    mine = _fake_checkpoint(tmp_path, 2, fingerprint="mine")
    theirs = _fake_checkpoint(tmp_path, 4, fingerprint="theirs")
    skipped: list[Path] = []
    refused: list[tuple[Path, str]] = []
    assert newest_checkpoint(tmp_path, "mine", on_skip=lambda p, _: skipped.append(p),
                             on_refuse=lambda p, w: refused.append((p, w))) == mine
    assert skipped == [] and [p for p, _ in refused] == [theirs] and "other settings or data" in refused[0][1]


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


# --------------------------------------------------------------------------- a checkpoint volume shared by runs


def test_run_checkpoint_dirs_are_keyed_by_run_and_never_meet(tmp_path: Path) -> None:
    a, b = run_checkpoint_dir(tmp_path, "run-a", "finetune"), run_checkpoint_dir(tmp_path, "run-b", "finetune")
    assert a == tmp_path / "run-a" / "finetune" and a != b
    # ids that differ only in characters a path cannot hold stay apart, and none climbs out of the root
    odd = [run_checkpoint_dir(tmp_path, rid, "finetune") for rid in ("x/y", "x-y", "x:y", "../x-y", "..")]
    assert len(set(odd)) == len(odd) and all(p.parent.parent == tmp_path for p in odd)
    with pytest.raises(InputError, match="no pipeline_run id"):
        run_checkpoint_dir(tmp_path, "", "finetune")


def test_two_runs_with_the_same_settings_sharing_the_volume_never_resume_from_each_other(tmp_path: Path) -> None:
    """Same settings, same data: the same fingerprint. Only the run's own directory keeps them apart."""
    torch = pytest.importorskip("torch")
    from components.training.checkpointing import save_checkpoint

    net = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters())
    mine, theirs = run_checkpoint_dir(tmp_path, "run-a", "finetune"), run_checkpoint_dir(tmp_path, "run-b", "finetune")
    save_checkpoint(mine, 4, net, opt, "same-fp")
    assert newest_checkpoint(theirs, "same-fp") is None  # run-b starts from step 0
    save_checkpoint(theirs, 2, net, opt, "same-fp")
    found_a, found_b = newest_checkpoint(mine, "same-fp"), newest_checkpoint(theirs, "same-fp")
    assert found_a is not None and found_a.name == "step-00000004" and found_a.parent == mine
    assert found_b is not None and found_b.name == "step-00000002" and found_b.parent == theirs


def test_finetune_puts_checkpoints_under_the_runs_directory_on_the_volume(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from components.steps.finetune import checkpoint_root

    out = tmp_path / "out"
    monkeypatch.delenv(settings.CHECKPOINT_ROOT.name, raising=False)
    assert checkpoint_root("", out) == (out / "checkpoints", True)  # dies with the pod
    assert checkpoint_root(str(tmp_path / "mine"), out) == (tmp_path / "mine", False)  # the user's: kept
    monkeypatch.setenv(settings.CHECKPOINT_ROOT.name, str(tmp_path / "pvc"))
    ctx = RunContext(run_group="g", pipeline_run="run-7", orchestrator="argo", mode="cluster", submitted_at=0.0)
    reporting.begin(StepTelemetry(ctx, "finetune", tmp_path / "events.jsonl"))
    try:
        assert checkpoint_root("", out) == (tmp_path / "pvc" / "run-7" / "finetune", True)
        assert checkpoint_root(str(tmp_path / "mine"), out) == (tmp_path / "mine", False)  # an explicit dir wins
    finally:
        reporting.end()


TUNE = ("components.steps.finetune:finetune",)
ADAPTER = Path("adapter") / "adapter_model.safetensors"


def _env(root: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", settings.CHECKPOINT_ROOT.name: str(root), **extra}


def _finetune(tokens: Path, out: Path, run: str) -> list[str]:
    """The compiled finetune task's command (its checkpoint_dir empty: the pod's volume decides)."""
    return [sys.executable, "-m", "components.run", *TUNE, f"--input=tokens={tokens}", f"--output=model={out}",
            "--param=max_steps=16", "--param=batch_size=4", "--param=checkpoint_every=4", f"--param=pipeline_run={run}"]


def _wait_for(cond: Callable[[], bool], proc: subprocess.Popen[str], timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert proc.poll() is None, f"finetune ended before the kill ({proc.returncode}): {proc.communicate()}"
        assert time.monotonic() < deadline, "timed out waiting for the moment to kill"
        time.sleep(0.005)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_a_retry_pod_resumes_this_runs_checkpoint_from_the_volume_byte_identical(tmp_path: Path) -> None:
    """The retry-from-volume check: each attempt a fresh output directory (a new pod), the volume shared.

    Run A: SIGTERM mid-training (a preemption) -> its retry resumes from A's checkpoint, while run B
    (same settings, same volume) starts beside it from step 0; run C: SIGKILL inside a checkpoint
    write -> its retry never loads the partial one. Every adapter equals an uninterrupted run's.
    """
    for ref, args in (("components.steps.prepare_data:prepare_data", [f"--output=dataset={tmp_path / 'data'}",
                                                                      "--param=builtin_size=64"]),
                      ("components.steps.tokenize:tokenize", [f"--input=dataset={tmp_path / 'data'}",
                                                              f"--output=tokens={tmp_path / 'tokens'}",
                                                              "--param=seq_len=64"])):
        r = subprocess.run([sys.executable, "-m", "components.run", ref, *args], cwd=REPO, env=_env(tmp_path / "none"),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    tokens, pvc = tmp_path / "tokens", tmp_path / "pvc"
    slow_writes = _env(pvc, **{settings.CHAOS_CHECKPOINT_PAUSE_S.name: "0.4"})
    r = subprocess.run(_finetune(tokens, tmp_path / "ref", "ref"), cwd=REPO, env=_env(pvc), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    reference = (tmp_path / "ref" / ADAPTER).read_bytes()
    assert not (pvc / "ref").exists()  # a finished run's checkpoints are scratch

    # Run A, attempt 0: preempted (SIGTERM) after step 6; it checkpoints that step and exits 143.
    a0 = subprocess.Popen(_finetune(tokens, tmp_path / "a0", "run-a"), cwd=REPO, env=slow_writes, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _wait_for(lambda: _lines(tmp_path / "a0" / "train_log.jsonl") >= 6, a0)
    a0.send_signal(signal.SIGTERM)
    out, _ = a0.communicate(timeout=120)
    assert a0.returncode == 143, out
    kept = newest_checkpoint(pvc / "run-a" / "finetune")
    assert kept is not None and int(kept.name.split("-")[1]) >= 6, out

    # Attempt 1 of run A (a new pod: fresh output) and run B (same settings) side by side on the volume.
    a1 = subprocess.Popen(_finetune(tokens, tmp_path / "a1", "run-a"), cwd=REPO,
                          env={**_env(pvc), "LLMPACK_ATTEMPT": "1"},
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    b0 = subprocess.Popen(_finetune(tokens, tmp_path / "b0", "run-b"), cwd=REPO, env=_env(pvc), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out_a, _ = a1.communicate(timeout=300)
    out_b, _ = b0.communicate(timeout=300)
    assert a1.returncode == 0 and b0.returncode == 0, out_a + out_b
    assert f"resumed from {kept} at step {int(kept.name.split('-')[1])}" in out_a
    assert "resumed from" not in out_b  # B never reads A's state, though its fingerprint is the same
    assert (tmp_path / "a1" / ADAPTER).read_bytes() == reference == (tmp_path / "b0" / ADAPTER).read_bytes()

    # Run C, attempt 0: SIGKILL inside the write of step 8's checkpoint (step 4's is whole). Its writes pause
    # 5 s, not 0.4: it is killed in the pause anyway, and a loaded machine may take longer than 0.4 s to kill it.
    killed_in_writes = _env(pvc, **{settings.CHAOS_CHECKPOINT_PAUSE_S.name: "5"})
    c0 = subprocess.Popen(_finetune(tokens, tmp_path / "c0", "run-c"), cwd=REPO, env=killed_in_writes, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _wait_for(lambda: any((pvc / "run-c" / "finetune").glob(".tmp-step-00000008-*")), c0)
    time.sleep(0.1)
    c0.kill()
    c0.communicate(timeout=60)
    c1 = subprocess.run(_finetune(tokens, tmp_path / "c1", "run-c"), cwd=REPO, env=_env(pvc), capture_output=True,
                        text=True, timeout=300)
    assert c1.returncode == 0, c1.stdout + c1.stderr
    assert f"resumed from {pvc / 'run-c' / 'finetune' / 'step-00000004'} at step 4" in c1.stdout
    assert (tmp_path / "c1" / ADAPTER).read_bytes() == reference
    assert not (pvc / "run-a").exists() and not (pvc / "run-c").exists()


@pytest.mark.slow
def test_checkpoint_minutes_checkpoints_by_time_and_the_write_time_is_logged(tmp_path: Path) -> None:
    """``checkpoint_every=0`` and ``LLMPACK_CHECKPOINT_MINUTES`` = 1 ms: a checkpoint after every step, by time
    alone; the longest write and the compiled grace period reach the step's record."""
    import json

    for ref, args in (("components.steps.prepare_data:prepare_data", [f"--output=dataset={tmp_path / 'data'}",
                                                                      "--param=builtin_size=32"]),
                      ("components.steps.tokenize:tokenize", [f"--input=dataset={tmp_path / 'data'}",
                                                              f"--output=tokens={tmp_path / 'tokens'}",
                                                              "--param=seq_len=64"])):
        r = subprocess.run([sys.executable, "-m", "components.run", ref, *args], cwd=REPO, env=_env(tmp_path / "none"),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    env = _env(tmp_path / "pvc", **{settings.CHECKPOINT_MINUTES.name: str(1 / 60000),
                                    settings.GRACE_PERIOD_S.name: "45"})
    cmd = [sys.executable, "-m", "components.run", *TUNE, f"--input=tokens={tmp_path / 'tokens'}",
           f"--output=model={tmp_path / 'out'}", "--param=max_steps=5", "--param=batch_size=4",
           f"--param=checkpoint_dir={tmp_path / 'kept'}", "--param=pipeline_run=run-t"]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["step-00000003", "step-00000004"]  # newest two
    metrics = {rec["name"]: rec["value"] for rec in map(json.loads, (tmp_path / "out" / "llmpack-events.jsonl").open())
               if rec["kind"] == "metric"}
    assert 0 < metrics["checkpoint_save_s"] < metrics["train_s"] and metrics["grace_period_s"] == 45
