"""Every benchmark the docs quote still runs: each script of benchmarks/ once, with the smallest arguments it
takes (issue 52 item 8: `python benchmarks/step_upload.py` failed at once on the names gate and nothing ran it).

Marked ``slow`` (CI's slow tier, ``make test-slow``): a smoke measures nothing, it shows the script runs to its
end, exit 0, from the repository root as docs/internals/benchmarks.md types it. Whole-pipeline ones take tens
of seconds on 2 cores; the rest seconds. A new script must add its case to :data:`SMOKE` (checked here, fast).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"

# script -> its smoke arguments ("{tmp}": a fresh directory); None: a module the others import (imported here).
SMOKE: dict[str, list[str] | None] = {
    "chaos_sigkill.py": ["--kills", "1", "--max-steps", "2", "--checkpoint-every", "1", "--builtin-size", "40"],
    "checkpoint_save.py": ["--mb", "1", "--rounds", "1", "--dir", "{tmp}"],
    "floors.py": None,
    "gc_startup.py": ["--rounds", "1"],
    "gpu_sampler.py": ["--rounds", "1", "--seconds", "0.2", "--interval", "0.1"],
    "gpu_train.py": ["--tiny", "--modes", "lora", "--steps", "1", "--warmup", "0"],
    "import_time.py": [],
    "injection_bias.py": ["--pairs", "1", "--delay", "0.5", "--backends", "direct"],
    "load_mlflow.py": ["--runs", "1", "--concurrency", "1", "--max-steps", "1"],
    "mlflow_server.py": None,
    "noise_sample.py": ["--rounds", "0", "--out", "{tmp}/rounds.json"],
    "overhead.py": ["--repeats", "1", "--max-steps", "1", "--backends", "direct"],
    "pretrained_outcome.py": ["--model", "tiny", "--steps", "1", "--seeds", "0", "--eval-rows", "3", "--rows", "40"],
    "project_bench.py": ["--samples", "100", "--trials", "2", "--coverage-samples", "24"],
    "readme_figures.py": ["--check", "--smoke", "--sections", "gc"],
    "sequential_sim.py": ["--compares", "3"],
    "spinup.py": ["--pairs", "1", "--max-steps", "1", "--backends", "direct"],
    "step_upload.py": ["--smoke"],
    "tiny_task_learning.py": ["--steps", "2"],
    "tracking_outage.py": ["--repeats", "1", "--max-steps", "1", "--no-mid-run"],
    "watcher_bench.py": ["--pods", "10", "--events", "200", "--repeats", "1", "--no-memory"],
    "watcher_load.py": ["--pods", "10", "--events", "200", "--expire-every", "50", "--no-memory"],
    # a real control plane of kwok nodes (tools/cluster/up.sh, `make cluster-build`): the cluster tier
    "watcher_real.py": ["--nodes", "2", "--pods", "4", "--timeout", "120"],
    "plan_coverage/study.py": ["--seeds", "1", "--sizes", "5", "--tails", "light", "--gang-sizes", "2",
                               "--out", "{tmp}"],
}
CLUSTER = {"watcher_real.py"}


def scripts() -> list[str]:
    return sorted(p.relative_to(BENCH).as_posix() for p in BENCH.rglob("*.py")
                  if p.parent == BENCH or p.name == "study.py")


def test_every_benchmark_has_its_smoke() -> None:
    assert sorted(SMOKE) == scripts()


@pytest.mark.slow
@pytest.mark.parametrize("script", [pytest.param(s, marks=[pytest.mark.cluster] if s in CLUSTER else [])
                                    for s in sorted(SMOKE)])
def test_benchmark_runs(script: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    args = SMOKE[script]
    if args is None:  # a helper module: it imports, as the scripts that use it do
        cmd = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(BENCH)!r}); import {script[:-3]}"]
    else:
        cmd = [sys.executable, str(BENCH / script), *(a.replace("{tmp}", str(tmp_path)) for a in args)]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(cmd[1:])}: exit {done.returncode}\n{done.stderr[-3000:]}"
