"""A run directory is data, never authority (issue 46, the hostile tester's four breaks).

1. The trace sender never follows a redirect: the user's token never reaches the ``Location`` it names.
2. Nothing llmpack writes in a run directory goes through a planted symlink (``events.jsonl`` of a dead client).
3. ``llmpack clean``'s owner and summary readers are bounded: a FIFO, ``/dev/zero``, 10^6 ``[`` are one line each.
4. The identity a run directory names is acted on only under the user's seal: a planted or copied
   ``summary.json`` / ``llmpack-owner.json`` is refused before any store is contacted.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.errors import InputError
from components.record import trace_export
from components.record.trace import build_trace
from llmpack.run import orphans
from tests.conftest import REPO

RUN = "direct-20261204-000000-abcdef"
IDENTITY = {"run_group": "rg-a", "pipeline_run": RUN, "orchestrator": "direct", "mode": "local", "submitted_at": 1.0}


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)


def _llmpack(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), "LLMPACK_TRACKING_MAX_WAIT_S": "3", **(env or {})}
    return subprocess.run([sys.executable, "-m", "llmpack", *args], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=90)


# 1 -------------------------------------------------------------------------------------------------------------


class _Heard(http.server.BaseHTTPRequestHandler):
    heard: list[str | None] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        type(self).heard.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.end_headers()

    do_GET = do_POST  # urllib turns a POST redirected by a 302 into a GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[tuple[int, list[str | None]]]:
    heard: list[str | None] = []
    evil_handler = type("Evil", (_Heard,), {"heard": heard})
    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), evil_handler)

    class Store(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{evil.server_port}/steal")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    store = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Store)
    for server in (evil, store):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield store.server_port, heard
    for server in (evil, store):
        server.shutdown()


@pytest.mark.parametrize("kind", ["mlflow", "otlp"])
def test_the_trace_sender_never_follows_a_redirect_with_the_users_credentials(
        servers: tuple[int, list[str | None]], kind: str) -> None:
    port, heard = servers
    url = f"http://127.0.0.1:{port}"
    env = ({"MLFLOW_TRACKING_URI": url, "MLFLOW_TRACKING_TOKEN": "CANARY-TOKEN-1"} if kind == "mlflow" else
           {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20CANARY-TOKEN-1"})
    to = trace_export.target(env, tracking_uri=env.get("MLFLOW_TRACKING_URI"), experiment_id="1", run_id="r")
    assert to is not None and to.headers["Authorization"] == "Bearer CANARY-TOKEN-1"
    trace = build_trace([], pipeline_run="x", submitted_at=0.0, tags={}, finished_at=1.0, traceparent=None)
    note = trace_export.send(trace, to, env=env)
    assert heard == []  # nothing resent: neither the token nor the body
    assert note is not None and "HTTP 302 redirect, not followed" in note and "CANARY" not in note and "\n" not in note


# 2 -------------------------------------------------------------------------------------------------------------


def test_a_dead_clients_events_file_linked_to_a_users_file_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    staging = tmp_path / "runs" / f".{RUN}.partial"
    (staging / "finetune").mkdir(parents=True)
    orphans.write_owner(staging, identity=IDENTITY, run_id=None, tracking_uri="", tags={}, params={}, pid=_dead_pid())
    os.symlink(victim, staging / "events.jsonl")
    with pytest.raises(InputError, match="events.jsonl: not a regular file") as info:
        orphans.take_over(staging)
    assert "\n" not in str(info.value)
    assert victim.read_text() == "precious\n" and staging.is_dir() and not (staging / "summary.json").exists()
    os.unlink(staging / "events.jsonl")
    os.mkfifo(staging / "events.jsonl")  # a FIFO would block the writer's open for ever
    with pytest.raises(InputError, match="events.jsonl: not a regular file"):
        orphans.take_over(staging)


def test_the_atomic_writer_replaces_a_link_never_its_target(tmp_path: Path) -> None:
    from components.bounded import write_atomic

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / "out.json")
    with pytest.raises(InputError, match="not a regular file"):
        write_atomic(tmp_path / "out.json", b"{}")
    write_atomic(tmp_path / "new.json", b"{}")
    assert victim.read_text() == "precious\n" and (tmp_path / "new.json").read_bytes() == b"{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "out.json", "victim.txt"]  # no temp left


# 3 -------------------------------------------------------------------------------------------------------------


def test_clean_reads_owner_and_summary_files_bounded_one_line_each_and_goes_on(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    bad = {
        runs / ".direct-1-fifo.partial": ("llmpack-owner.json", "fifo"),
        runs / ".direct-2-zero.partial": ("llmpack-owner.json", "zero"),
        runs / ".direct-3-deep.partial": ("llmpack-owner.json", "deep"),
        runs / "direct-4-fifo.failed": ("summary.json", "fifo"),
        runs / "direct-5-zero.failed": ("summary.json", "zero"),
        runs / "direct-6-deep.failed": ("summary.json", "deep"),
    }
    for directory, (name, how) in bad.items():
        directory.mkdir(parents=True)
        if how == "fifo":
            os.mkfifo(directory / name)
        elif how == "zero":
            os.symlink("/dev/zero", directory / name)
        else:
            (directory / name).write_text("[" * 1_000_000)
    good = runs / "direct-7-good.failed"
    good.mkdir()
    (good / "summary.json").write_text(json.dumps({"tracking": "sent"}))
    result = _llmpack("clean", "--runs-dir", str(runs), "--older-than", "0", cwd=tmp_path,
                      env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("llmpack: error: left ")]
    assert len(errors) == len(bad), result.stderr
    for directory in bad:
        assert sum(str(directory) in line for line in errors) == 1 and directory.is_dir()
    assert not good.exists() and f"removed {good}" in result.stdout


# 4 -------------------------------------------------------------------------------------------------------------


def _sealed_run_dir(root: Path) -> Path:
    """A kept run as ``llmpack run`` leaves it after an outage: events.jsonl + a sealed summary.json."""
    from llmpack.run.local import write_run_files

    run_dir = root / f"{RUN}.failed"
    run_dir.mkdir(parents=True)
    write_run_files(run_dir, [], {
        **IDENTITY, "status": "failed", "error": "x", "failed_step": None, "finished_at": 2.0,
        "metrics": {"eval_loss": 1.5}, "params": {}, "tracking": "not sent", "tags": {},
        "artifacts": {"mlflow_run_id": "0123abcd", "tracking_uri": ""}})
    return run_dir


def test_sync_acts_only_on_a_summary_the_users_llmpack_sealed_in_that_directory(tmp_path: Path) -> None:
    from llmpack.run.sync import read_run_dir

    real = _sealed_run_dir(tmp_path / "mine")
    assert read_run_dir(real)[0]["metrics"] == {"eval_loss": 1.5}  # the user's own: accepted
    copied = tmp_path / "planted" / real.name
    shutil.copytree(real, copied)  # a faithful copy elsewhere: its identity is not the planter's to replay
    forged = tmp_path / "forged" / real.name
    shutil.copytree(real, forged)
    summary = json.loads((forged / "summary.json").read_text())
    summary["tags"] = {"llmpack.promotion": "v1 -> champion (forged)"}
    (forged / "summary.json").write_text(json.dumps(summary))
    unsigned = tmp_path / "unsigned" / real.name
    shutil.copytree(real, unsigned)
    summary.pop("signature", None)
    (unsigned / "summary.json").write_text(json.dumps(summary))
    for run_dir, word in ((copied, "wrongly signed"), (forged, "wrongly signed"), (unsigned, "unsigned")):
        with pytest.raises(InputError, match=word):
            read_run_dir(run_dir)
    store = tmp_path / "m.db"
    result = _llmpack("sync", str(forged), "--tracking-uri", f"sqlite:///{store}", cwd=tmp_path)
    assert result.returncode == 2 and "wrongly signed" in result.stderr and "nothing was sent" in result.stderr
    assert "Traceback" not in result.stderr and not store.exists()  # no store was even opened


def test_clean_takes_over_only_a_staging_directory_the_users_llmpack_sealed(tmp_path: Path) -> None:
    from llmpack.run.clean import take_over_dead_runs

    runs = tmp_path / "runs"
    stranger = runs / f".{RUN}.partial"  # a stranger's hand-written owner naming a real record
    (stranger / "finetune").mkdir(parents=True)
    (stranger / orphans.OWNER_FILE).write_text(json.dumps({
        "pid": _dead_pid(), "start_ticks": None, "boot_id": None, "identity": IDENTITY, "mlflow_run_id": "0123abcd",
        "tracking_uri": "", "tags": {"llmpack.promotion": "v1 withdrawn (forged)"}, "params": {}, "written_at": 1.0}))
    mine = tmp_path / "mine" / ".direct-20261204-000000-other.partial"
    mine.mkdir(parents=True)
    orphans.write_owner(mine, identity=IDENTITY, run_id="0123abcd", tracking_uri="", tags={}, params={},
                        pid=_dead_pid())
    replay = runs / f"{mine.name}"
    replay.mkdir()
    shutil.copy(mine / orphans.OWNER_FILE, replay / orphans.OWNER_FILE)  # the user's signed owner, copied
    assert orphans.read_owner(mine)["mlflow_run_id"] == "0123abcd"
    before = sorted(p.relative_to(runs) for p in runs.rglob("*"))
    lines = take_over_dead_runs(runs)
    assert len(lines) == 2 and all(line.startswith("llmpack: error: left ") for line in lines)
    assert any(str(stranger) in line and "unsigned" in line for line in lines)
    assert any(str(replay) in line and "wrongly signed" in line for line in lines)
    assert sorted(p.relative_to(runs) for p in runs.rglob("*")) == before  # nothing taken over, nothing written


def test_a_finished_run_renamed_to_a_staging_name_is_never_taken_over(tmp_path: Path) -> None:
    """The second tester's n1: no byte forged, the user's finished run directory renamed ``.<run>.partial``
    (its sealed owner file and inode kept). It holds the run's summary.json: never a dead client's to close."""
    staging = tmp_path / "runs" / ".direct-20261204-000000-done.partial"
    staging.mkdir(parents=True)
    orphans.write_owner(staging, identity=IDENTITY, run_id="0123abcd", tracking_uri="", tags={}, params={},
                        pid=_dead_pid())
    (staging / "summary.json").write_text(json.dumps({"status": "succeeded"}))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(InputError, match="never taken over"):
        orphans.take_over(staging, wait_s=0)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_sync_sends_the_sealed_events_only_never_a_planted_event_file(tmp_path: Path) -> None:
    """The fourth check: a `zzz/llmpack-events.jsonl` planted under a genuine run directory re-keyed evaluate's
    eval_loss (0.0001 stored; 5.33 measured): every event file under the run was read, the last record winning."""
    from components.record import telemetry
    from llmpack.run.local import write_run_files
    from llmpack.run.sync import read_run_dir

    ctx = telemetry.RunContext(**IDENTITY)
    genuine = telemetry.make_record(ctx, "metric", "evaluate", "eval_loss", 5.33)
    run_dir = tmp_path / f"{RUN}.failed"
    run_dir.mkdir()
    write_run_files(run_dir, [genuine], {
        **IDENTITY, "status": "failed", "error": "x", "failed_step": None, "finished_at": 2.0, "metrics": {},
        "params": {}, "tracking": "not sent", "tags": {}, "artifacts": {"mlflow_run_id": None, "tracking_uri": ""}})
    planted = run_dir / "zzz" / telemetry.EVENTS_FILE
    planted.parent.mkdir()
    planted.write_text(json.dumps({**genuine.__dict__, "value": 0.0001}) + "\n")
    records = read_run_dir(run_dir)[1].records
    assert [r.value for r in records if r.name == "eval_loss"] == [5.33]
    (run_dir / "events.jsonl").write_text(json.dumps({**genuine.__dict__, "value": 0.0001}) + "\n")  # edited
    with pytest.raises(InputError, match="events.jsonl: not the records sealed with the run's summary"):
        read_run_dir(run_dir)
