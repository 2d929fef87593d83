"""Warm-ahead: a fused member with a warm-up runs in a process parked for it, with the same result."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components import fusion, settings
from components.finetune_pipeline import build
from components.process import warm_ahead
from tests.conftest import run_step

# A first step that leaves what finetune and evaluate leave, then the real register: fused, register
# (the member with a warm-up) is parked. No torch needed.
PROBE = '''
import json
from pathlib import Path
from components.dsl import Input, Metrics, Model, Output, pipeline, step
from components.fusion import FusedStep, fuse, fused_steps
from components.steps.register import register


@step(name="trained")
def trained(model: Output[Model], metrics: Output[Metrics], fail: bool = False, no_metrics: bool = False) -> None:
    """What finetune and evaluate leave for register."""
    if fail:
        raise RuntimeError("trained: asked to fail")
    from components.serving.sealed import MODEL, sealed_output, verified_model

    # sealed as finetune seals its output (components.serving.sealed)
    with sealed_output(Path(model.path), MODEL, "", weights="adapter", meta="llmpack-model.json") as private:
        (private / "adapter").mkdir()
        (private / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
        (private / "llmpack-model.json").write_text(json.dumps({"method": "lora", "base_model": "tiny"}))
    files = verified_model(Path(model.path), "")["files"]
    if not no_metrics:  # an evaluation as evaluate writes it: signed, for these files (components.serving.signed)
        from components.serving.signed import SIGNATURE_FILE, sign_evaluation

        figures, seal = sign_evaluation({"eval_loss": 1.25}, pipeline_run="", model=files)
        (Path(metrics.path) / "metrics.json").write_text(json.dumps(figures))
        (Path(metrics.path) / SIGNATURE_FILE).write_text(json.dumps(seal))


def _nothing_to_warm() -> None:
    pass


@step(name="peek", warm_up=_nothing_to_warm)
def peek(registration: Input[Metrics], seen: Output[Metrics], hold_s: float = 0.0) -> None:
    """A later parked member: what its process sees, then a hold (to signal it mid-turn)."""
    import os, time
    (Path(seen.path) / "seen.json").write_text(json.dumps({"pid": os.getpid(),
                                                           "parked_env": "LLMPACK_PARKED_MEMBER" in os.environ}))
    time.sleep(hold_s)


@pipeline(name="warm-probe")
def probe(fail: bool = False, no_metrics: bool = False, hold_s: float = 0.0):
    t = trained(fail=fail, no_metrics=no_metrics)
    r = register(model=t.outputs["model"], metrics=t.outputs["metrics"])
    peek(registration=r.outputs["registration"], hold_s=hold_s)


__getattr__ = fused_steps(probe)  # this module resolves its own fused steps
fused = next(t.step for t in fuse(probe(), "all").tasks.values() if isinstance(t.step, FusedStep))
'''


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("warm-probe")
    (root / "llmpack_warm_probe.py").write_text(PROBE, encoding="utf-8")
    return root


def _run(probe_dir: Path, root: Path, *params: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_step("llmpack_warm_probe:fused", *_args(root, *params), cwd=probe_dir, env=_env(probe_dir, root, **env))


def _args(root: Path, *params: str) -> list[str]:
    root.mkdir(exist_ok=True)
    return [f"--output=trained_model={root / 'model'}", f"--output=trained_metrics={root / 'metrics'}",
            f"--output=register_registration={root / 'reg'}", f"--output=peek_seen={root / 'seen'}",
            "--param=pipeline_run=warm-test",
            "--param=run_group=rg-warm", f"--param=submitted_at={time.time()}", *params]


def _env(probe_dir: Path, root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMPACK_")}
    return {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
            "LLMPACK_CLIENT_UPLOADS": "1",  # as local runs
            "PYTHONPATH": f"{probe_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **extra}


def _registration(root: Path) -> dict[str, str]:
    return json.loads((root / "reg" / "registration.json").read_text())


def test_only_later_members_with_a_warm_up_are_parked():
    step = fusion.fuse(build(), "all").tasks[fusion.ALL_STEPS_TASK].step
    assert isinstance(step, fusion.FusedStep)
    with_warm_up = [n for n, m in enumerate(step.members) if m.step.warm_up is not None]
    assert [step.members[n].task for n in with_warm_up] == ["register"]
    gpu = fusion.fuse(build(), "gpu")
    assert all(m.step.warm_up is None for t in gpu.tasks.values() if isinstance(t.step, fusion.FusedStep)
               for m in t.step.members)  # finetune + evaluate: nothing to park


def test_the_hand_over_line_is_read_and_end_of_file_means_no_turn():
    assert warm_ahead.wait_for_go(io.StringIO("1796217047.5 0.25\n")) == (1796217047.5, 0.25)
    assert warm_ahead.wait_for_go(io.StringIO("")) is None


def test_switched_off_nothing_is_parked(monkeypatch: pytest.MonkeyPatch):
    step = fusion.fuse(build(), "all").tasks[fusion.ALL_STEPS_TASK].step
    assert isinstance(step, fusion.FusedStep)
    monkeypatch.setenv(settings.WARM_AHEAD.name, "0")
    assert warm_ahead.park(step.members, []) == {}


@pytest.mark.slow  # a fused run and an unfused one (~20 s)
def test_a_parked_member_gives_the_same_registration_and_record(probe_dir: Path, tmp_path: Path):
    results = {}
    for switch in ("1", "0"):
        root = tmp_path / f"warm-{switch}"
        r = _run(probe_dir, root, LLMPACK_WARM_AHEAD=switch)
        assert r.returncode == 0, r.stderr
        assert ("warm-ahead: register's start-up ran beside the steps before it" in r.stdout) == (switch == "1")
        reg = _registration(root)
        assert reg["registered"] is True and reg["version"] == "1"
        events = _events(root / "reg")
        assert [e["name"] for e in events if e["kind"] == "event"] == ["process_started", "finished"]
        before = next(e["value"] for e in _events(root / "model") if e["name"] == "finished")
        start = next(e["value"] for e in events if e["name"] == "process_started")
        assert 0 <= start - before < 1.0  # its start is the hand-over, not when the parked process began
        results[switch] = {k: v for k, v in reg.items() if k not in ("run_id", "source")}
        assert json.loads((root / "seen" / "seen.json").read_text())["parked_env"] is False  # not passed on
    assert results["1"] == results["0"]


@pytest.mark.slow  # a fused step's processes: the slow tier
def test_a_sigterm_in_a_parked_members_turn_ends_it_and_the_fused_step_with_143(probe_dir: Path, tmp_path: Path):
    root = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "components.run", "llmpack_warm_probe:fused",
                             *_args(root, "--param=hold_s=60")],
                            cwd=probe_dir, env=_env(probe_dir, root), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen = root / "seen" / "seen.json"
    deadline = time.time() + 120
    while not seen.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert seen.exists(), proc.communicate()
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # to the fused process only, as a pod's end or a kill sends it
    out, err = proc.communicate(timeout=30)  # returns once the parked process, holding the pipes, is gone too
    assert proc.returncode == 143, err
    pid = json.loads(seen.read_text())["pid"]
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError):
        return False
    return " Z " not in state + " "


def test_when_an_earlier_member_fails_the_parked_process_ends_without_running(probe_dir: Path, tmp_path: Path):
    # capture_output waits for every holder of the output pipe: the call returning means the parked process is gone
    r = _run(probe_dir, tmp_path / "run", "--param=fail=true")
    assert r.returncode == 1
    assert "trained: asked to fail" in r.stderr
    assert "warm-ahead" not in r.stdout
    assert not (tmp_path / "run" / "reg" / "registration.json").exists()


@pytest.mark.slow  # a fused step's processes: the slow tier
def test_the_parked_members_failure_is_the_fused_steps(probe_dir: Path, tmp_path: Path):
    r = _run(probe_dir, tmp_path / "run", "--param=no_metrics=true")  # register cannot read evaluate's metrics
    assert r.returncode == 1
    assert "metrics.json" in r.stderr
    assert "warm-ahead: register's start-up" in r.stdout  # it was parked, and its error ended the fused step
    assert not (tmp_path / "run" / "reg" / "registration.json").exists()


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "llmpack-events.jsonl").read_text().splitlines()]
