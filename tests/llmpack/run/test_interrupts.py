"""Ctrl-C or SIGTERM in ``submit``, ``sync`` and ``compare``.

Every command exits 130 on SIGINT and 143 on SIGTERM with one line (no traceback) that says what
was left and what to do about it:

- ``submit --wait``: stops waiting, as ``argo submit --wait`` does; the run goes on on the
  cluster and closes its own record, and the line names the command that stops it;
- ``sync``: the run directory is unchanged and a second ``sync`` sends the rest (idempotent);
- ``compare``: the run in progress ends KILLED, its directory is kept as ``.failed`` and named,
  the runs before it keep their FINISHED records, no step process outlives the client
  (``llmpack run`` is checked the same way in ``tests/components/test_record.py``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standins.argo_server import ArgoServerStandIn

LLMPACK_CLI = Path(sys.executable).with_name("llmpack")
TOKEN = "argo-standin-token-interrupts-S3CRET"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k == "LLMPACK_SIGNING_KEY_FILE" or not k.startswith(("MLFLOW_", "LLMPACK_", "ARGO_", "KFP_"))}
    return {**env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            "HF_HUB_OFFLINE": "1", **extra}


def _interrupt_when(proc: subprocess.Popen[str], ready: Any, sig: int, timeout_s: float = 60) -> tuple[str, str]:
    deadline = time.time() + timeout_s
    while time.time() < deadline and not ready():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    assert ready(), "the command never reached the point to interrupt"
    time.sleep(0.3)
    proc.send_signal(sig)
    return proc.communicate(timeout=60)


# --------------------------------------------------------------------------- submit --wait


@pytest.fixture()
def argo() -> Iterator[ArgoServerStandIn]:
    # The workflow never leaves Running: only an interrupt ends the wait.
    with ArgoServerStandIn(token=TOKEN, phases=("Pending", "Running")) as server:
        yield server


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_submit_wait_interrupted_leaves_the_run_to_the_cluster(argo: ArgoServerStandIn, tmp_path: Path,
                                                               sig: int, code: int) -> None:
    proc = subprocess.Popen([str(LLMPACK_CLI), "cluster", "submit", "argo", "--host", argo.url, "--wait",
                             "--timeout", "600"],
                            cwd=tmp_path, env=_env(ARGO_TOKEN=TOKEN, ARGO_SECURE="false"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = _interrupt_when(proc, lambda: len(argo.recorded("GET")) >= 1, sig)
    assert proc.returncode == code, err
    ((ns, name),) = argo.workflows
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("llmpack: interrupted; argo run ")
    assert "keeps running on the cluster and closes its own MLflow record" in lines[0]
    assert f"stop it with: argo stop {name} -n {ns}" in lines[0]
    assert TOKEN not in out + err
    # Nothing was deleted or stopped behind the user's back: the workflow is still there, running.
    assert not argo.recorded("DELETE") and not argo.recorded("PUT")


# --------------------------------------------------------------------------- sync


@pytest.fixture()
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A tracking URI whose server accepts connections and never answers (a hung proxy), and its connections."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", held
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    sock.close()


def _run_dir(root: Path) -> Path:
    """A run directory as ``llmpack run`` leaves it when the tracking server was down."""
    from components.record import telemetry
    from llmpack.run.local import write_run_files

    ctx = telemetry.RunContext(run_group="rg-interrupts", pipeline_run="direct-interrupted-sync",
                               orchestrator="direct", mode="local", submitted_at=1_700_000_000.0)
    records = [telemetry.make_record(ctx, "event", "finetune", name, ctx.submitted_at + i)
               for i, name in enumerate(telemetry.STEP_EVENTS)]
    run_dir = root / ctx.pipeline_run
    run_dir.mkdir(parents=True)
    write_run_files(run_dir, records, {
        "pipeline_run": ctx.pipeline_run, "run_group": ctx.run_group, "orchestrator": "direct", "mode": "local",
        "submitted_at": ctx.submitted_at, "finished_at": ctx.submitted_at + 9, "status": "succeeded",
        "metrics": {"total_s": 9.0}, "tags": ctx.tags(), "tracking": "not sent",
        "artifacts": {"run_dir": str(run_dir)}})
    return run_dir


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_sync_interrupted_changes_nothing_and_says_to_run_it_again(silent_server: tuple[str, list[socket.socket]],
                                                                   tmp_path: Path, sig: int, code: int) -> None:
    uri, connections = silent_server
    run_dir = _run_dir(tmp_path)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    proc = subprocess.Popen([str(LLMPACK_CLI), "sync", str(run_dir), "--tracking-uri", uri],
                            cwd=tmp_path, env=_env(LLMPACK_TRACKING_MAX_WAIT_S="120"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Interrupted while MLflow waits for the server's answer.
    _out, err = _interrupt_when(proc, lambda: bool(connections), sig)
    assert proc.returncode == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"{run_dir} is unchanged; run `llmpack sync {run_dir}` again" in lines[0]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


# --------------------------------------------------------------------------- compare


def _records(db: Path) -> list[Any]:
    from mlflow import MlflowClient

    mc = MlflowClient(f"sqlite:///{db}")
    return [r for e in mc.search_experiments() for r in mc.search_runs([e.experiment_id], max_results=1000)]


@pytest.mark.slow
def test_compare_interrupted_in_its_second_path(tmp_path: Path) -> None:
    """SIGTERM while argo's run trains, after direct's run finished: 143, direct's record FINISHED, argo's KILLED."""
    env = _env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    proc = subprocess.Popen([str(LLMPACK_CLI), "compare", "--backends", "direct,argo", "--max-steps", "30"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = tmp_path / "llmpack-runs"
    def argo_trains() -> bool:  # the argo run's finetune step has started (its staging dir: .argo-...partial)
        return any(str(p.relative_to(runs)).lstrip(".").startswith("argo-") for p in runs.rglob("finetune.log"))

    _out, err = _interrupt_when(proc, argo_trains,
                                signal.SIGTERM, timeout_s=600)
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    (kept,) = runs.glob("*.failed")
    assert kept.name.startswith("argo-") and f"kept {kept}" in err and "llmpack clean" in err
    records = _records(tmp_path / "mlflow.db")
    assert records and not [r for r in records if r.info.status == "RUNNING"]
    pipelines = {r.data.tags["llmpack.orchestrator"]: r.info.status for r in records
                 if r.data.tags.get("llmpack.record") == "pipeline"}
    assert pipelines == {"direct": "FINISHED", "argo": "KILLED"}
    leftover = subprocess.run(["pgrep", "-f", str(kept.with_suffix(""))], capture_output=True, text=True)
    assert not leftover.stdout.strip(), "a step process outlived the client"


# --------------------------------------------------------------------------- a new sqlite store


def test_a_new_sqlite_store_appears_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during MLflow's first-time migrations left a half-migrated mlflow.db that every later
    run refused; now the store is migrated beside it and linked into place only when whole."""
    from components.record import tracking

    db = tmp_path / "mlflow.db"

    def interrupted_link(src: str, dst: str) -> None:
        assert Path(src).stat().st_size > 0 and not Path(dst).exists()  # migrated, not yet in place
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(os, "link", interrupted_link)
        with pytest.raises(KeyboardInterrupt):
            tracking.client(f"sqlite:///{db}")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-written, no temporary left
    mc = tracking.client(f"sqlite:///{db}")
    assert tracking.experiment_id(mc) and db.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
