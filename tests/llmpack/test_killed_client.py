"""A client killed with SIGKILL loses nothing: no orphan process, its record closed KILLED once, its JSONL sent once.

The slow tests run ``llmpack run`` (tiny model, few steps, a real sqlite MLflow store), SIGKILL it
at one of five moments (before the first step; as tokenize, finetune, evaluate or register
starts: the step's ``process_started`` record in its JSONL marks it), then ``llmpack sync`` its
staging directory, twice. Processes are looked for in /proc (no psutil).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.record import telemetry
from llmpack.run import orphans
from tests.conftest import REPO

MOMENTS = ("before-first-step", "tokenize", "finetune", "evaluate", "register")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMPACK_", "MLFLOW_"))}
    return {**env, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}


def _llmpack(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmpack", *args], cwd=cwd, env=_env(), text=True, capture_output=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def processes_naming(text: str) -> list[tuple[int, str]]:
    """Live processes whose command line holds ``text`` (from /proc; zombies left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline[:200]))
    return found


def _started_steps(staging: Path) -> set[str]:
    return {r.step for r in telemetry.read_records(telemetry.find_event_files(staging))
            if r.kind == "event" and r.name == "process_started"}


# --------------------------------------------------------------------------- fast: the parts


def test_a_child_dies_with_a_parent_killed_by_sigkill(tmp_path: Path) -> None:
    """The death signal, not a process-group kill: the child has a session of its own, as every step has."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from components.process import lifeline\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)  # llmpack-lifeline-child'],\n"
        "                         start_new_session=True, preexec_fn=lifeline.preexec())\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n")], env=_env(), stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert orphans.process_identity(child) is not None
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while orphans.process_identity(child) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert orphans.process_identity(child) is None, "the child outlived its SIGKILLed parent"


def _owned_staging(root: Path, pid: int, *, run: str = "direct-20261204-000000-abcdef",
                   uri: str = "sqlite:///x.db") -> Path:
    staging = root / f".{run}.partial"
    (staging / "finetune" / "model").mkdir(parents=True)
    identity = {"run_group": "rg-k", "pipeline_run": run, "orchestrator": "direct", "mode": "local",
                "submitted_at": 1.0}
    rec = {"key": f"{run}/finetune/event/process_started", "kind": "event", "step": "finetune",
           "name": "process_started", "value": 2.0, "run_group": "rg-k", "pipeline_run": run,
           "orchestrator": "direct", "mode": "local", "attempt": 0}
    (staging / "finetune" / "model" / telemetry.EVENTS_FILE).write_text(json.dumps(rec) + "\ngarbage\n")
    orphans.write_owner(staging, identity=identity, run_id=None, tracking_uri=uri, tags={}, params={}, pid=pid)
    return staging


def test_a_live_clients_run_is_never_touched(tmp_path: Path) -> None:
    staging = _owned_staging(tmp_path, os.getpid())  # this test process: alive
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = _llmpack("sync", str(staging), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "its run is in progress" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_dead_clients_run_is_taken_over_as_killed(tmp_path: Path) -> None:
    staging = _owned_staging(tmp_path, _dead_pid())
    kept = orphans.take_over(staging)
    assert not staging.exists() and kept == tmp_path / "direct-20261204-000000-abcdef.failed"
    summary = json.loads((kept / "summary.json").read_text())
    assert summary["status"] == "killed" and summary["tracking"] == "not sent" and summary["failed_step"] == "finetune"
    assert ([json.loads(line)["name"] for line in (kept / "events.jsonl").read_text().splitlines()]
            == ["process_started"])
    assert orphans.taken_over(staging) == kept


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout)


def test_clean_takes_over_a_dead_clients_run_and_sends_it_but_a_dry_run_changes_nothing(tmp_path: Path) -> None:
    # the store the run names is the configured one (the default, mlflow.db where clean runs): sent there
    staging = _owned_staging(tmp_path / "runs", _dead_pid(), uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    dry = _llmpack("clean", "--runs-dir", str(tmp_path / "runs"), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and f"would take over {staging}" in dry.stdout and staging.is_dir(), dry.stdout
    real = _llmpack("clean", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert real.returncode == 0, real.stderr
    assert (f"took over {staging} (its client died)" in real.stdout
            and "KILLED, 1 record(s) sent" in real.stdout), real.stdout
    kept = tmp_path / "runs" / "direct-20261204-000000-abcdef.failed"
    assert not staging.exists() and json.loads((kept / "summary.json").read_text())["tracking"] == "sent"


def test_clean_leaves_a_live_run_and_names_it(tmp_path: Path) -> None:
    staging = _owned_staging(tmp_path, os.getpid())
    result = _llmpack("clean", "--runs-dir", str(tmp_path), "--older-than", "0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"left {staging}" in result.stdout and staging.is_dir()


# --------------------------------------------------------------------------- slow: a real run, SIGKILLed


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite store for the five runs (its schema made once)."""
    from components.record import tracking

    uri = f"sqlite:///{tmp_path_factory.mktemp('killed-store') / 'mlflow.db'}"
    tracking.experiment_id(tracking.client(uri))
    return uri


def _kill_at(moment: str, cwd: Path, uri: str, backend: str = "direct") -> Path:
    """Start ``llmpack run --backend BACKEND``, SIGKILL it at ``moment``; its staging directory."""
    runs = cwd / "runs"
    client = subprocess.Popen([sys.executable, "-m", "llmpack", "run", "--backend", backend, "--max-steps", "4",
                               "--param", "builtin_size=64", "--output-dir", str(runs), "--tracking-uri", uri],
                              cwd=cwd, env=_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    staging: Path | None = None
    try:
        while time.monotonic() < deadline and client.poll() is None:
            found = sorted(runs.glob(".*.partial")) if runs.is_dir() else []
            if found and (found[0] / orphans.OWNER_FILE).exists():
                staging = found[0]
                if moment == "before-first-step" or moment in _started_steps(staging):
                    break
            time.sleep(0.05)
        else:
            pytest.fail(f"the run ended or timed out before {moment} (exit {client.poll()})")
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    assert staging is not None
    if moment == "before-first-step":
        assert {"evaluate", "register"}.isdisjoint(_started_steps(staging))
    return staging


def _record(uri: str, pipeline_run: str) -> list:
    from mlflow.tracking import MlflowClient

    from components.record import tracking

    mc = MlflowClient(tracking_uri=uri)
    return mc.search_runs([tracking.experiment_id(mc)], filter_string=f"tags.`llmpack.pipeline_run` = '{pipeline_run}'")


@pytest.mark.slow
@pytest.mark.parametrize("moment", MOMENTS)
def test_sigkill_of_the_client_then_sync_loses_nothing(moment: str, tmp_path: Path, store: str) -> None:
    _killed_then_synced(moment, tmp_path, store, "direct")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["kfp", "argo", "mlflow"])
def test_sigkill_in_finetune_on_every_local_runner_leaves_no_process(backend: str, tmp_path: Path, store: str) -> None:
    """kfp.local's tasks (under ``sh -ec``), the Argo runner's and ``mlflow run``'s driver and steps die too."""
    _killed_then_synced("finetune", tmp_path, store, backend)


def _killed_then_synced(moment: str, tmp_path: Path, store: str, backend: str) -> None:
    from mlflow.tracking import MlflowClient

    staging = _kill_at(moment, tmp_path, store, backend)
    run = orphans.partial_name(staging)
    assert run

    first = _llmpack("sync", str(staging), "--tracking-uri", store, cwd=tmp_path)  # the store the run named
    assert first.returncode == 0, first.stderr
    assert "took over" in first.stdout and "KILLED" in first.stdout
    assert not processes_naming(run), "a step outlived its client"  # sync waited for them; none is left

    kept = tmp_path / "runs" / f"{run}.failed"
    records = telemetry.read_records([kept / "events.jsonl"])
    if moment != "before-first-step":
        assert moment in {r.step for r in records}
    found = _record(store, run)
    assert len(found) == 1 and found[0].info.status == "KILLED", [(r.info.run_id, r.info.status) for r in found]
    mc = MlflowClient(tracking_uri=store)
    history = {r.mlflow_key: len(mc.get_metric_history(found[0].info.run_id, r.mlflow_key)) for r in records}
    assert all(n == 1 for n in history.values()), history

    second = _llmpack("sync", str(staging), "--tracking-uri", store, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert " 0 record(s) sent" in second.stdout
    again = _record(store, run)
    assert len(again) == 1 and again[0].info.status == "KILLED"
    assert {k: len(mc.get_metric_history(again[0].info.run_id, k)) for k in history} == history
