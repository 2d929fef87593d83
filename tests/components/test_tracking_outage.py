"""Tracking outages and ``llmpack clean``.

Quick: the bounded retry (fake clock), ``llmpack sync`` against a sqlite store (a partial upload
completed, a second sync a no-op), a RUN_DIR that is not one, a server that never answers, and
``llmpack clean``. Slow: a real ``mlflow server`` (sqlite backend) on 127.0.0.1 that is down at
the start of a run (and comes back while ``llmpack sync`` waits for it), or killed mid-run. After
every outage each JSONL key is in MLflow exactly once, on exactly one record. One server process
is started twice for the module (it takes seconds, tens of them on a loaded 2-core machine).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from components import settings
from components.errors import InputError
from components.record import telemetry, tracking
from tests.conftest import llmpack

WAIT_S = 3  # LLMPACK_TRACKING_MAX_WAIT_S for runs that must give up quickly


# --------------------------------------------------------------------------- helpers


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k == "LLMPACK_SIGNING_KEY_FILE" or not k.startswith(("MLFLOW_", "LLMPACK_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}


def _synthetic_run_dir(root: Path, *, status: str = "succeeded") -> Path:
    """A run directory as ``llmpack run`` leaves it after an outage: events.jsonl + summary.json, not sent."""
    from llmpack.run.local import write_run_files

    pipeline_run = f"direct-test-{uuid.uuid4().hex[:8]}"
    ctx = telemetry.RunContext(run_group=f"rg-{pipeline_run}", pipeline_run=pipeline_run, orchestrator="direct",
                               mode="local", submitted_at=1_700_000_000.25)
    records = []
    t = ctx.submitted_at
    for step in ("prepare-data", "tokenize", "finetune", "evaluate", "register"):
        for name in ("process_started", "model_loaded", "finished"):
            t += 0.75
            records.append(telemetry.make_record(ctx, "event", step, name, t))
    records.append(telemetry.make_record(ctx, "event", "finetune", "first_step", t - 1.5))
    records.append(telemetry.make_record(ctx, "metric", "finetune", "train_s", 1.25))
    records.append(telemetry.make_record(ctx, "metric", "evaluate", "eval_loss", 4.5))
    run_dir = root / pipeline_run
    run_dir.mkdir(parents=True)
    write_run_files(run_dir, records, {
        "run_group": ctx.run_group, "pipeline_run": pipeline_run, "orchestrator": "direct", "mode": "local",
        "status": status, "error": None, "submitted_at": ctx.submitted_at, "finished_at": t + 1.0,
        "metrics": {"total_s": t + 1.0 - ctx.submitted_at, "eval_loss": 4.5, "mfu": None},
        "tags": {**ctx.tags(), "llmpack.gpu_type": "nvidia-l4", "llmpack.status": status},
        "params": {"max_steps": 2, "seed": 0}, "tracking": "not sent",
        "artifacts": {"run_dir": str(run_dir), "events_file": str(run_dir / "events.jsonl"), "mlflow_run_id": None},
    })
    return run_dir


def _jsonl_records(run_dir: Path) -> list[telemetry.Record]:
    return telemetry.read_records([run_dir / "events.jsonl", *telemetry.find_event_files(run_dir)])


def _assert_each_key_once(uri: str, run_dir: Path) -> str:
    """Every JSONL record is on the run's one MLflow record exactly once, with its value; nothing else is."""
    from mlflow.tracking import MlflowClient

    summary = json.loads((run_dir / "summary.json").read_text())
    records = _jsonl_records(run_dir)
    assert records, run_dir
    mc = MlflowClient(uri)
    experiment = mc.get_experiment_by_name(tracking.DEFAULT_EXPERIMENT)
    runs = mc.search_runs([experiment.experiment_id],
                          filter_string=f"tags.`llmpack.pipeline_run` = '{summary['pipeline_run']}'")
    assert len(runs) == 1, [r.info.run_id for r in runs]
    run = runs[0]
    for rec in records:
        history = mc.get_metric_history(run.info.run_id, rec.mlflow_key)
        assert len(history) == 1, (rec.mlflow_key, history)
        assert history[0].value == pytest.approx(rec.value, rel=1e-12, abs=1e-9), rec.mlflow_key
    logged = {k for k in run.data.metrics if k.startswith(("event.", "metric."))}
    assert logged == {r.mlflow_key for r in records}
    assert run.data.tags["llmpack.status"] == summary["status"]
    assert run.info.status == {"succeeded": "FINISHED", "failed": "FAILED", "killed": "KILLED"}[summary["status"]]
    return run.info.run_id


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- the bounded retry


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def _down() -> Exception:
    from mlflow.exceptions import MlflowException

    return MlflowException("API request to http://127.0.0.1:9/api/2.0/mlflow/runs/get failed with exception "
                           "HTTPConnectionPool(...): Max retries exceeded (Connection refused)")


def test_transient_errors_are_retried_with_backoff_until_the_store_answers() -> None:
    clock, calls = _FakeClock(), []

    def call() -> str:
        calls.append(clock.now)
        if len(calls) < 4:
            raise _down()
        return "ok"

    assert tracking.with_retries(call, tracking.UploadRetry(max_wait_s=30), sleep=clock.sleep, clock=clock) == "ok"
    assert clock.sleeps == [0.5, 1.0, 2.0]


def test_the_total_wait_is_bounded_then_tracking_unavailable() -> None:
    clock = _FakeClock()

    def call() -> None:
        clock.now += 0.1  # each attempt takes a little time too
        raise _down()

    with pytest.raises(tracking.TrackingUnavailable) as info:
        tracking.with_retries(call, tracking.UploadRetry(max_wait_s=20), sleep=clock.sleep, clock=clock)
    assert 20 <= clock.now <= 20.2
    assert max(clock.sleeps) == 8.0  # backoff doubles from 0.5 s and is capped at 8 s
    assert info.value.waited_s == pytest.approx(clock.now)
    clock = _FakeClock()
    with pytest.raises(tracking.TrackingUnavailable):  # max_wait_s=0: exactly one attempt
        tracking.with_retries(call, tracking.UploadRetry(max_wait_s=0), sleep=clock.sleep, clock=clock)
    assert clock.sleeps == []


def test_a_4xx_answer_is_not_retried_and_5xx_is() -> None:
    from mlflow.exceptions import RestException

    clock, calls = _FakeClock(), []

    def refused() -> None:
        calls.append(1)
        raise RestException({"error_code": "PERMISSION_DENIED", "message": "no"})

    with pytest.raises(RestException):
        tracking.with_retries(refused, tracking.UploadRetry(max_wait_s=30), sleep=clock.sleep, clock=clock)
    assert calls == [1] and clock.sleeps == []
    assert tracking.is_transient(RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "503"}))
    assert tracking.is_transient(ConnectionRefusedError())
    assert not tracking.is_transient(RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "404"}))
    assert not tracking.is_transient(ValueError("a bug, not an outage"))


def test_mlflow_own_retries_are_off_inside_a_bounded_call_and_restored_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    seen = tracking.with_retries(lambda: (os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"],
                                          os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"]), tracking.UploadRetry())
    assert seen == ("0", "10")
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "7" and "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ


def test_the_bound_comes_from_the_environment() -> None:
    assert tracking.upload_retry({}).max_wait_s == tracking.DEFAULT_MAX_WAIT_S == 30.0
    assert tracking.upload_retry({settings.TRACKING_MAX_WAIT_S.name: "4.5"}).max_wait_s == 4.5
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(InputError, match=settings.TRACKING_MAX_WAIT_S.name):
            tracking.upload_retry({settings.TRACKING_MAX_WAIT_S.name: bad})
    # MLflow's own retries (the register step's client) fit in the same bound: 1+2+4+8 s for 30 s.
    assert tracking.mlflow_http_env(tracking.UploadRetry(max_wait_s=30), {}) == {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "4", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    assert tracking.mlflow_http_env(tracking.UploadRetry(max_wait_s=0), {"MLFLOW_HTTP_REQUEST_TIMEOUT": "3"}) == {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


# --------------------------------------------------------------------------- llmpack sync, no server


def test_sync_completes_a_partial_upload_and_a_second_sync_changes_nothing(tmp_path: Path, tracking_uri: str) -> None:
    from llmpack.run.sync import sync_run

    run_dir = _synthetic_run_dir(tmp_path)
    records = _jsonl_records(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    # The outage struck after the run opened its record and logged a few keys.
    ctx = telemetry.RunContext(**{k: summary[k] for k in ("run_group", "pipeline_run", "orchestrator", "mode")},
                               submitted_at=summary["submitted_at"])
    mc = tracking.client(tracking_uri)
    opened = tracking.open_pipeline_run(mc, ctx, {"llmpack.gpu_type": "nvidia-l4"})
    assert tracking.log_records(mc, opened, records[:5]) == 5

    first = sync_run(run_dir, tracking_uri)
    assert (first.mlflow_run_id, first.logged, first.already) == (opened, len(records) - 5, 5)
    after_first = (run_dir / "summary.json").read_text()
    assert json.loads(after_first)["tracking"] == "sent"
    assert json.loads(after_first)["artifacts"]["mlflow_run_id"] == opened
    second = sync_run(run_dir, tracking_uri)
    assert (second.mlflow_run_id, second.logged, second.already) == (opened, 0, len(records))
    assert (run_dir / "summary.json").read_text() == after_first

    assert _assert_each_key_once(tracking_uri, run_dir) == opened
    run = mc.get_run(opened)
    assert run.data.params["max_steps"] == "2" and float(run.data.params["submitted_at"]) == summary["submitted_at"]
    assert run.data.metrics["eval_loss"] == 4.5 and "mfu" not in run.data.metrics
    assert run.data.tags["llmpack.gpu_type"] == "nvidia-l4"
    assert run.info.end_time == int(summary["finished_at"] * 1000)
    assert len(mc.get_metric_history(opened, "total_s")) == 1  # derived metrics are not doubled either


def test_sync_creates_the_record_when_the_run_never_reached_the_store(tmp_path: Path, tracking_uri: str) -> None:
    from llmpack.run.sync import sync_run

    run_dir = _synthetic_run_dir(tmp_path, status="failed")
    result = sync_run(run_dir, tracking_uri)
    assert result.already == 0 and result.logged == len(_jsonl_records(run_dir)) and result.status == "FAILED"
    assert _assert_each_key_once(tracking_uri, run_dir) == result.mlflow_run_id


def test_a_run_cut_short_during_an_outage_is_kept_syncable(tmp_path: Path, tracking_uri: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C while the store is down: the kept ``.failed`` directory gets what ``llmpack sync`` reads."""
    from llmpack.run.local import _abandon
    from llmpack.run.sync import sync_run

    ctx = telemetry.RunContext(run_group="rg-cut", pipeline_run=f"direct-cut-{uuid.uuid4().hex[:8]}",
                               orchestrator="direct", mode="local", submitted_at=1_700_000_000.0)
    staging = tmp_path / f".{ctx.pipeline_run}.partial"
    log = telemetry.EventLog(staging / "finetune" / "model" / telemetry.EVENTS_FILE)
    for name, value in (("process_started", 1_700_000_001.0), ("model_loaded", 1_700_000_002.0)):
        log.append(telemetry.make_record(ctx, "event", "finetune", name, value))
    kept = tmp_path / f"{ctx.pipeline_run}.failed"
    _abandon(KeyboardInterrupt(), mc=None, run_id=None, ctx=ctx, uri="http://127.0.0.1:9", record_tags={},
             overrides={"max_steps": 2}, staging=staging, kept=kept)
    assert not staging.exists() and kept.is_dir()
    assert capsys.readouterr().err.strip() == (
        f"llmpack: warning: tracking server unreachable; records kept in {kept}; "
        f"send them later with: llmpack sync {kept} --tracking-uri http://127.0.0.1:9")
    summary = json.loads((kept / "summary.json").read_text())
    assert summary["status"] == "killed" and summary["tracking"] == "not sent"
    result = sync_run(kept, tracking_uri)
    assert result.status == "KILLED" and result.logged == 2
    assert _assert_each_key_once(tracking_uri, kept) == result.mlflow_run_id


def _one_error_line(r: subprocess.CompletedProcess[str], code: int) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmpack: error: "), r.stderr
    return lines[0]


def test_sync_a_bad_run_dir_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "summary.json").write_text("{oops")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "summary.json").write_text('{"status": "succeeded"}')
    for name, message in (("nosuch", "no such run directory"), ("empty", "no summary.json"),
                          ("badjson", "not readable as JSON"), ("other", "not an llmpack run summary")):
        line = _one_error_line(llmpack("sync", str(tmp_path / name), cwd=tmp_path, env=_env()), 2)
        assert message in line, line
    r = llmpack("clean", "--older-than", "7x", "--runs-dir", str(tmp_path), cwd=tmp_path, env=_env())
    assert "--older-than '7x': give a number and a unit" in _one_error_line(r, 2)


def test_sync_to_a_server_that_never_answers_is_one_line_exit_1_and_changes_nothing(tmp_path: Path) -> None:
    run_dir = _synthetic_run_dir(tmp_path / "runs")
    before = _snapshot(run_dir)
    t0 = time.monotonic()
    r = llmpack("sync", str(run_dir), "--tracking-uri", f"http://127.0.0.1:{_free_port()}", cwd=tmp_path,
                env=_env(LLMPACK_TRACKING_MAX_WAIT_S="2"))
    elapsed = time.monotonic() - t0
    line = _one_error_line(r, 1)
    assert line.startswith("llmpack: error: tracking store unreachable after 2.") and str(run_dir) in line, line
    assert elapsed < 2 + 30  # the bound plus the interpreter's start-up
    assert _snapshot(run_dir) == before


# --------------------------------------------------------------------------- llmpack clean


def _failed_run(root: Path, name: str, age_s: float, now: float, *, unsent: bool = False) -> Path:
    path = root / name
    (path / "finetune").mkdir(parents=True)
    (path / "finetune" / "log.txt").write_text("x")
    (path / "summary.json").write_text(json.dumps({"tracking": "not sent" if unsent else "sent"}))
    os.utime(path, (now - age_s, now - age_s))
    return path


def test_clean_removes_only_old_failed_run_directories(tmp_path: Path) -> None:
    from llmpack.run.clean import clean_runs, parse_age

    now = time.time()
    runs, outside = tmp_path / "runs", tmp_path / "outside"
    old = _failed_run(runs, "direct-a.failed", 8 * 86400, now)
    young = _failed_run(runs, "direct-b.failed", 3600, now)
    unsent = _failed_run(runs, "direct-c.failed", 9 * 86400, now, unsent=True)
    ok = _failed_run(runs, "direct-d", 30 * 86400, now)  # a successful run: never touched
    target = _failed_run(outside, "precious.failed", 30 * 86400, now)
    (runs / "link.failed").symlink_to(target, target_is_directory=True)
    (old / "escape").symlink_to(outside)  # a link inside an old run: removed as a link, its target stays
    os.utime(old, (now - 8 * 86400, now - 8 * 86400))
    (runs / "file.failed").write_text("not a directory")
    staging = _failed_run(runs, ".direct-e.partial", 30 * 86400, now)

    dry = clean_runs(runs, parse_age("7d"), dry_run=True, now=now)
    assert [(i.path.name, i.action) for i in dry] == [("direct-a.failed", "would remove"),
                                                      ("direct-c.failed", "kept unsent")]
    assert old.exists()
    done = clean_runs(runs, parse_age("7d"), now=now)
    assert [(i.path.name, i.action) for i in done] == [("direct-a.failed", "removed"),
                                                       ("direct-c.failed", "kept unsent")]
    assert not old.exists() and young.exists() and unsent.exists() and ok.exists() and staging.exists()
    assert target.exists() and (target / "finetune" / "log.txt").exists() and (runs / "link.failed").is_symlink()
    assert (runs / "file.failed").exists() and outside.exists()
    done = clean_runs(runs, parse_age("30m"), include_unsent=True, now=now)
    assert sorted(i.path.name for i in done if i.action == "removed") == ["direct-b.failed", "direct-c.failed"]
    assert parse_age("12h") == 43200 and parse_age("2w") == 14 * 86400 and parse_age("90s") == 90
    for bad in ("7", "d", "-1d", "7days", ""):
        with pytest.raises(InputError, match="--older-than"):
            parse_age(bad)


def test_clean_command_dry_run_prints_and_keeps(tmp_path: Path) -> None:
    now = time.time()
    old = _failed_run(tmp_path / "runs", "kfp-x.failed", 10 * 86400, now)
    r = llmpack("clean", "--runs-dir", str(tmp_path / "runs"), "--dry-run", cwd=tmp_path, env=_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines() == [f"would remove {old} (10.0d old)"] and old.exists()
    r = llmpack("clean", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env=_env())
    assert r.returncode == 0 and r.stdout.strip() == f"removed {old} (10.0d old)" and not old.exists()
    r = llmpack("clean", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env=_env())
    assert r.returncode == 0 and r.stdout.strip() == f"no failed runs older than 7d to remove in {tmp_path / 'runs'}"
    assert "no such directory" in _one_error_line(llmpack("clean", "--runs-dir", str(tmp_path / "nope"), cwd=tmp_path,
                                                          env=_env()), 2)


# --------------------------------------------------------------------------- a real mlflow server


class MlflowServer:
    """``mlflow server`` with a sqlite backend on 127.0.0.1; started, killed (SIGKILL) and restarted on one port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 180.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return  # already up (a second one could not bind the port, and /health would answer for the first)
        log = (self.root / "server.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"],
            cwd=self.root, env=_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),  # no job runner: starts faster
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"mlflow server on {self.uri} did not answer /health in {timeout_s} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One server (database, port) for the module; each test starts or kills it as its outage needs."""
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    yield srv
    srv.kill()


def _run_args(srv: MlflowServer, out: Path) -> list[str]:
    return ["run", "--backend", "direct", "--max-steps", "2", "--json", "--tracking-uri", srv.uri,
            "--output-dir", str(out)]


def _sync_twice(srv: MlflowServer, run_dir: Path, cwd: Path, *, synced_before: bool = False) -> None:
    """``llmpack sync`` (to the URI the run used) twice, or once more after an earlier one; then the key check."""
    n = len(_jsonl_records(run_dir))
    if not synced_before:
        first = llmpack("sync", str(run_dir), "--tracking-uri", srv.uri, cwd=cwd, env=_env())
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip().endswith("already there") and srv.uri in first.stdout, first.stdout
    second = llmpack("sync", str(run_dir), "--tracking-uri", srv.uri, cwd=cwd, env=_env())
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().endswith(f"0 record(s) sent, {n} already there"), second.stdout
    _assert_each_key_once(srv.uri, run_dir)


@pytest.mark.slow
def test_server_down_at_start_training_completes_then_sync_sends_everything_once(server: MlflowServer,
                                                                                 tmp_path: Path) -> None:
    server.kill()
    r = llmpack(*_run_args(server, tmp_path / "runs"), cwd=tmp_path, env=_env(LLMPACK_TRACKING_MAX_WAIT_S=str(WAIT_S)))
    ended = time.time()
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["status"] == "succeeded" and s["tracking"] == "not sent" and s["artifacts"]["mlflow_run_id"] is None
    run_dir = Path(s["artifacts"]["run_dir"])
    assert s["trace"] != "sent" and (run_dir / "trace.otlp.json").is_file()  # kept beside the records for sync
    warnings = [line for line in r.stderr.splitlines() if line.startswith("llmpack: warning")]
    assert warnings == [f"llmpack: warning: tracking server unreachable; records kept in {run_dir}; "
                        f"send them later with: llmpack sync {run_dir} --tracking-uri {server.uri}"], r.stderr
    # The pipeline ended at finished_at; the upload waited the bound, not more (plus the close-out).
    assert WAIT_S <= ended - s["finished_at"] < WAIT_S + 30, ended - s["finished_at"]
    assert s["metrics"]["time_to_first_step_s"] < 60  # training did not wait for the store
    assert json.loads((run_dir / "register" / "registration" / "registration.json").read_text())["registered"] is False

    # The server comes back while the warning's own `llmpack sync` command waits for it (bounded retries)...
    n = len(_jsonl_records(run_dir))
    command = shlex.split(warnings[0].split("send them later with: ", 1)[1])
    assert command[:2] == ["llmpack", "sync"], command
    proc = subprocess.Popen([sys.executable, "-m", "llmpack", *command[1:]], cwd=tmp_path,
                            env=_env(LLMPACK_TRACKING_MAX_WAIT_S="300"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        server.start()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.strip().endswith(f"{n} record(s) sent, 0 already there") and server.uri in out, out
    synced = json.loads((run_dir / "summary.json").read_text())
    assert synced["tracking"] == "sent" and synced["trace"] == "sent"
    # ...and a second sync sends nothing: every key once, and the run's trace once.
    _sync_twice(server, run_dir, tmp_path, synced_before=True)
    from mlflow.tracking import MlflowClient

    mc, run_id = MlflowClient(server.uri), synced["artifacts"]["mlflow_run_id"]
    traces = mc.search_traces(locations=[mc.get_run(run_id).info.experiment_id], run_id=run_id)
    assert len(traces) == 1 and "step finetune" in {sp.name for sp in traces[0].data.spans}


@pytest.mark.slow
def test_server_killed_mid_run_and_restarted_nothing_lost_nothing_doubled(server: MlflowServer, tmp_path: Path) -> None:
    server.start()
    proc = subprocess.Popen([sys.executable, "-m", "llmpack", *_run_args(server, tmp_path / "runs")], cwd=tmp_path,
                            env=_env(LLMPACK_TRACKING_MAX_WAIT_S="250"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    def wait_for(step: str) -> None:
        deadline = time.monotonic() + 240
        while not list((tmp_path / "runs").glob(f".*.partial/{step}/*/{telemetry.EVENTS_FILE}")):
            assert proc.poll() is None and time.monotonic() < deadline, f"the {step} step never started"
            time.sleep(0.1)

    try:
        wait_for("finetune")
        server.kill()  # the finetune step has started: the store goes away mid-run...
        wait_for("register")  # ...the register step starts talking to it while it is away...
        server.start()  # ...and it comes back while the run goes on
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    s = json.loads(out)
    run_dir = Path(s["artifacts"]["run_dir"])
    # Both the register step (MLflow's own bounded retries) and the run's upload waited it out.
    assert s["status"] == "succeeded" and s["tracking"] == "sent", err
    assert json.loads((run_dir / "register" / "registration" / "registration.json").read_text())["registered"] is True
    _sync_twice(server, run_dir, tmp_path)
