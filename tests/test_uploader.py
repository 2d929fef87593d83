"""A step that logs its own records does it through the uploader process, with the same records in MLflow."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components import telemetry, tracking, uploader
from tests.conftest import run_step

# Two light steps, fused: each reports whether this process holds a live uploader when it runs.
PROBE = '''
import json
from pathlib import Path
from components import runtime
from components.dsl import Input, Metrics, Output, pipeline, step
from components.fusion import FusedStep, fuse


def _seen(out):
    up = runtime._uploader
    (Path(out.path) / "seen.json").write_text(json.dumps({"uploader": up is not None and up.proc.poll() is None}))


@step(name="first")
def first(a: Output[Metrics]) -> None:
    _seen(a)


@step(name="second")
def second(a: Input[Metrics], b: Output[Metrics]) -> None:
    _seen(b)


@pipeline(name="upload-probe")
def probe():
    second(a=first().outputs["a"])


fused = next(t.step for t in fuse(probe(), "all").tasks.values() if isinstance(t.step, FusedStep))
'''


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("upload-probe")
    (root / "llmpack_upload_probe.py").write_text(PROBE, encoding="utf-8")
    return root


def _env(probe_dir: Path, uri: str, **extra: str) -> dict[str, str]:
    """A step as an orchestrator's own CLI or a cluster pod starts it: it logs its own records."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMPACK_", "MLFLOW_"))}
    return {**env, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": f"{probe_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            **extra}


def _run_fused(probe_dir: Path, root: Path, uri: str, run_id: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_step("llmpack_upload_probe:fused", f"--output=first_a={root / 'a'}", f"--output=second_b={root / 'b'}",
                    f"--param=pipeline_run={run_id}", "--param=run_group=rg-upload", "--param=orchestrator=argo",
                    "--param=mode=cluster", f"--param=submitted_at={time.time()}",
                    cwd=probe_dir, env=_env(probe_dir, uri, **extra))


def _logged(uri: str, run_id: str) -> set[str]:
    mc = tracking.client(uri)
    found = tracking.find_pipeline_run(mc, run_id)
    return set(mc.get_run(found).data.metrics) if found else set()


def _jsonl_keys(root: Path) -> set[str]:
    return {r.mlflow_key for r in telemetry.read_records(telemetry.find_event_files(root))}


def _seen(root: Path) -> list[bool]:
    return [json.loads((root / d / "seen.json").read_text())["uploader"] for d in ("a", "b")]


@pytest.mark.parametrize("switch", ["1", "0"])
def test_every_member_s_records_reach_mlflow_with_or_without_the_uploader(probe_dir: Path, tmp_path: Path,
                                                                           switch: str) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = _run_fused(probe_dir, tmp_path / "run", uri, f"up-{switch}", LLMPACK_UPLOADER=switch)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr
    assert _seen(tmp_path / "run") == [switch == "1"] * 2  # one uploader for the process, alive for both members
    expected = _jsonl_keys(tmp_path / "run")
    assert {"event.first.process_started", "event.first.finished", "event.second.finished"} <= expected
    assert _logged(uri, f"up-{switch}") == expected


def test_no_uploader_where_the_client_uploads_after_the_run(probe_dir: Path, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = _run_fused(probe_dir, tmp_path / "run", uri, "up-client", LLMPACK_CLIENT_UPLOADS="1")
    assert r.returncode == 0, r.stderr
    assert _seen(tmp_path / "run") == [False, False]
    assert not (tmp_path / "mlflow.db").exists()  # nothing logged: the client does it


def test_an_unreachable_store_is_one_warning_and_the_jsonl_keeps_every_record(probe_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    t0 = time.monotonic()
    r = _run_fused(probe_dir, tmp_path / "run", f"http://127.0.0.1:{port}", "up-down", LLMPACK_TRACKING_MAX_WAIT_S="1")
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 2 and all("MLflow logging failed" in w and "events kept in JSONL" in w for w in warnings), r.stderr
    assert "Traceback" not in r.stderr
    assert {"event.first.finished", "event.second.finished"} <= _jsonl_keys(tmp_path / "run")
    assert time.monotonic() - t0 < 60  # each batch bounded by LLMPACK_TRACKING_MAX_WAIT_S


def test_a_gone_uploader_takes_no_batch_and_the_step_uploads_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    up = uploader.Uploader.start()
    up.proc.kill()
    up.proc.wait()
    ctx = telemetry.RunContext(run_group="rg", pipeline_run="gone", orchestrator="argo", mode="cluster", submitted_at=1.0)
    assert not up.send(ctx, [telemetry.make_record(ctx, "event", "first", "finished", 2.0)])
    up.close()  # nothing was sent: no warning, no wait
    assert up.batches == 0


def test_the_uploader_logs_what_it_was_sent_before_it_exits(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ctx = telemetry.RunContext(run_group="rg", pipeline_run="direct-feed", orchestrator="argo", mode="cluster",
                               submitted_at=1.0)
    records = [telemetry.make_record(ctx, "event", "first", name, 2.0 + i) for i, name in enumerate(("process_started", "finished"))]
    proc = subprocess.run([sys.executable, "-m", "components.uploader"], input=json.dumps(
        {"ctx": {**ctx.__dict__}, "records": [r.__dict__ for r in records]}) + "\n", text=True, capture_output=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri}, timeout=120)
    assert proc.returncode == 0 and "warning" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert _logged(uri, "direct-feed") == {"event.first.process_started", "event.first.finished"}
