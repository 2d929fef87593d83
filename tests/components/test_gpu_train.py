"""benchmarks/gpu_train.py: the --tiny CPU smoke run's figures, and the one-line refusal without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_train.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}  # no GPU, whatever the machine has
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=180)


def test_tiny_run_reports_positive_figures_for_both_modes(tmp_path: Path) -> None:
    out = tmp_path / "gpu_train.json"
    proc = run("--tiny", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    modes = report["modes"]
    assert set(modes) == {"lora", "full"}
    for mode, r in modes.items():
        for key in ("tokens_per_s", "step_s", "step_s_p50", "timed_s", "model_tflops", "flops_per_token",
                    "trainable_params", "total_params"):
            assert r[key] > 0, (mode, key, r[key])
        assert r["timed_steps"] == report["settings"]["steps"] > 0
        assert r["mfu"] is None and r["peak_mem_gib"] is None  # n/a on the CPU
        assert 0 < r["final_loss"] < 100
        assert f"| {mode} |" in proc.stdout
    assert modes["lora"]["trainable_params"] < modes["full"]["trainable_params"] == modes["full"]["total_params"]
    assert modes["lora"]["flops_per_token"] < modes["full"]["flops_per_token"]
    assert report["settings"]["fused_adamw"] is False and report["settings"]["autocast"] is None
    assert "n/a" in proc.stdout and "wall time" in proc.stdout
    assert report["wall_s"] > 0


def test_without_cuda_a_full_run_is_refused_in_one_line() -> None:
    proc = run("--modes", "lora")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "CUDA" in lines[0] and "--tiny" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
