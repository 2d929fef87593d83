"""examples/tutorials/show_record.py: the newest record, or yours with --run-id; KFP's first-pod timings shown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a whole run through a step process: the slow tier

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "tutorials" / "show_record.py"


def _show(uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)


def test_run_id_picks_yours_and_first_pod_timings_are_shown(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from components.record import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mc = MlflowClient(uri)
    exp = mc.create_experiment("t")
    # start times set apart: two runs made in the same millisecond have no "newest"
    mine = mc.create_run(exp, start_time=1_700_000_000_000,
                         tags={tracking.RECORD_TAG: "pipeline", "llmpack.orchestrator": "kfp",
                               "llmpack.submit_time_source": "first_pod"}).info.run_id
    mc.log_metric(mine, "spinup_from_first_pod_s", 4.25)
    newer = mc.create_run(exp, start_time=1_700_000_060_000,
                          tags={tracking.RECORD_TAG: "pipeline", "llmpack.orchestrator": "argo"}).info.run_id
    mc.log_metric(newer, "spinup_s", 2.5)

    r = _show(uri, "--run-id", mine)
    assert r.returncode == 0, r.stderr
    assert f"run {mine}" in r.stdout and "spinup_from_first_pod_s" in r.stdout and "4.25" in r.stdout
    assert "first_pod" in r.stdout and newer not in r.stdout
    r = _show(uri)  # without it: the newest
    assert r.returncode == 0 and f"run {newer}" in r.stdout
    for bad in ("../../etc", "0" * 32):
        r = _show(uri, "--run-id", bad)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--run-id" in r.stderr
