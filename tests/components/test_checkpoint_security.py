"""A checkpoint is data: a planted pickle runs nothing, garbage falls back, another run's state is refused.

Whoever can write the checkpoint directory (on a cluster the shared ``--checkpoint-pvc``) can also
write a manifest whose sha256 matches. These tests plant what such a writer would and show the
resume: no code runs (the payload's marker file stays absent), an undecodable newest checkpoint is
skipped with one warning and the previous one used, and one whose manifest names other settings
or another run is refused with one line. The slow test does the same to the real finetune step.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from components.training.checkpoint_state import DATA_FILE, TENSORS_FILE, decode, encode
from components.training.checkpointing import (
    MANIFEST,
    load_checkpoint,
    newest_checkpoint,
    resume_newest,
    save_checkpoint,
    write_manifest,
)
from tests.conftest import REPO

torch = pytest.importorskip("torch")
OWNER = {"pipeline_run": "run-a", "step": "finetune"}


class MarkerPayload:
    """A pickle that, when loaded, creates ``marker``: what a hostile writer puts where a state file goes."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def _trained(seed: int = 0) -> tuple[Any, Any]:
    """A small model and an AdamW that took three steps (moments and step counts filled)."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, betas=(0.9, 0.95))
    for _ in range(3):
        net(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    return net, opt


def _plant(path: Path, files: dict[str, bytes]) -> None:
    """Replace a checkpoint's state files and write the manifest a careful attacker would: sizes and sha256 match."""
    manifest = json.loads((path / MANIFEST).read_text())
    for name in list(manifest["files"]):
        (path / name).unlink()
    for name, data in files.items():
        (path / name).write_bytes(data)
    write_manifest(path, manifest["step"], manifest["fingerprint"], manifest["owner"])


def _two_checkpoints(root: Path) -> tuple[Any, Any]:
    net, opt = _trained()
    save_checkpoint(root, 2, net, opt, "fp", owner=OWNER)
    save_checkpoint(root, 4, net, opt, "fp", owner=OWNER)
    return net, opt


def test_the_payload_is_live_under_pickle(tmp_path: Path) -> None:
    """The control: loading the planted bytes as a pickle (what ``torch.load(weights_only=False)`` did) runs it."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(MarkerPayload(marker)))  # noqa: S301 - the point of the control
    assert marker.exists()


@pytest.mark.parametrize("where", ["every state file", "an old-format state.pt"])
def test_a_planted_pickle_with_a_matching_manifest_runs_no_code(tmp_path: Path, where: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    root = tmp_path / "ckpt"
    net, opt = _two_checkpoints(root)
    payload = pickle.dumps(MarkerPayload(marker))
    files = ({DATA_FILE: payload, TENSORS_FILE: payload, "state.pt": payload} if where == "every state file"
             else {"state.pt": payload})
    _plant(root / "step-00000004", files)
    fresh, fresh_opt = _trained(seed=1)
    resumed = resume_newest(root, "fp", fresh, fresh_opt, owner=OWNER)
    assert not marker.exists(), "a planted pickle ran on resume"
    assert resumed == (root / "step-00000002", 2)
    out = capsys.readouterr().out
    assert "step-00000004" in out and len([line for line in out.splitlines() if "step-00000004" in line]) == 1


@pytest.mark.parametrize("target", [TENSORS_FILE, DATA_FILE])
def test_garbage_with_a_matching_manifest_falls_back_to_the_previous_checkpoint(
        tmp_path: Path, target: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "ckpt"
    _two_checkpoints(root)
    newest = root / "step-00000004"
    files = {name: (newest / name).read_bytes() for name in (DATA_FILE, TENSORS_FILE)}
    files[target] = os.urandom(4096)
    _plant(newest, files)
    assert newest_checkpoint(root, "fp") == newest  # whole by its manifest ...
    fresh, fresh_opt = _trained(seed=1)
    assert resume_newest(root, "fp", fresh, fresh_opt, owner=OWNER) == (root / "step-00000002", 2)  # ... yet skipped
    warnings = [line for line in capsys.readouterr().out.splitlines() if "unreadable" in line]
    assert len(warnings) == 1 and str(newest) in warnings[0] and target in warnings[0]


def test_a_checkpoint_of_another_run_or_other_settings_is_refused(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "ckpt"
    net, opt = _trained()
    save_checkpoint(root, 2, net, opt, "fp", owner={"pipeline_run": "run-b", "step": "finetune"})  # planted from run-b
    fresh, fresh_opt = _trained(seed=1)
    before = [p.detach().clone() for p in fresh.parameters()]
    assert resume_newest(root, "fp", fresh, fresh_opt, owner=OWNER) is None
    assert resume_newest(root, "other-settings", fresh, fresh_opt) is None
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 2 and all(line.startswith("finetune: refusing checkpoint") for line in lines), lines
    assert "another run or step" in lines[0] and "other settings or data" in lines[1]
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters(), strict=True))  # nothing was loaded
    assert resume_newest(root, "fp", fresh, fresh_opt) is not None  # an explicit checkpoint_dir: settings alone decide


def test_resume_restores_weights_optimizer_and_rngs_exactly(tmp_path: Path) -> None:
    net, opt = _trained()
    np.random.seed(7)
    np.random.standard_normal()  # a cached gaussian in the numpy state
    torch.manual_seed(11)
    torch.rand(3)
    saved = save_checkpoint(tmp_path, 3, net, opt, "fp")
    want_torch, want_np = torch.get_rng_state(), np.random.get_state()
    want_opt = opt.state_dict()
    torch.rand(5)
    np.random.rand(5)
    fresh, fresh_opt = _trained(seed=3)
    assert load_checkpoint(saved, fresh, fresh_opt) == 3
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), fresh.parameters(), strict=True))
    got_opt = fresh_opt.state_dict()
    assert got_opt["param_groups"] == want_opt["param_groups"]
    for key, state in want_opt["state"].items():
        assert all(torch.equal(state[k], got_opt["state"][key][k]) for k in state)
    assert torch.equal(torch.get_rng_state(), want_torch)
    got_np = np.random.get_state()
    assert got_np[0] == want_np[0] and np.array_equal(got_np[1], want_np[1]) and got_np[2:] == want_np[2:]


def test_the_state_codec_round_trips_plain_data_and_refuses_objects() -> None:
    state = {"step": 3, "groups": [{"betas": (0.9, 0.95), "lr": 1e-3, "foreach": None, "nan": math.nan}],
             "state": {0: {"step": torch.tensor(3.0)}}, "$tensor": "a key that looks like a tag"}
    tensors: dict[str, Any] = {}
    data = json.loads(json.dumps(encode(state, tensors)))
    back = decode(data, tensors)
    assert back["groups"][0]["betas"] == (0.9, 0.95) and math.isnan(back["groups"][0]["nan"])
    assert torch.equal(back["state"][0]["step"], torch.tensor(3.0)) and back["$tensor"] == state["$tensor"]
    with pytest.raises(TypeError, match="only tensors and plain data"):
        encode({"x": MarkerPayload(Path("never"))}, {})


@pytest.mark.slow
def test_the_finetune_step_resumes_past_a_planted_pickle_without_running_it(tokens: Path, tmp_path: Path) -> None:
    """The reported case, on the real step: checkpoint_every=2 into checkpoint_dir, the newest one replaced
    by a pickle with a matching manifest, the same command again: no code runs, step 2 is resumed."""
    marker, ckpt = tmp_path / "ran", tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(REPO), "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1"}

    def finetune(out: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "components.run", "components.steps.finetune:finetune",
                               f"--input=tokens={tokens}", f"--output=model={tmp_path / out}", "--param=max_steps=6",
                               "--param=batch_size=4", "--param=checkpoint_every=2", f"--param=checkpoint_dir={ckpt}"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    first = finetune("first")
    assert first.returncode == 0, first.stdout + first.stderr
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000002", "step-00000004"]
    payload = pickle.dumps(MarkerPayload(marker))
    _plant(ckpt / "step-00000004", {DATA_FILE: payload, TENSORS_FILE: payload, "state.pt": payload})
    again = finetune("again")
    assert again.returncode == 0, again.stdout + again.stderr
    assert not marker.exists(), "a planted pickle ran in the finetune step"
    assert ("skipping unreadable checkpoint" in again.stdout
            and f"resumed from {ckpt / 'step-00000002'} at step 2" in again.stdout)
    adapter = Path("adapter") / "adapter_model.safetensors"
    assert (tmp_path / "again" / adapter).read_bytes() == (tmp_path / "first" / adapter).read_bytes()
