"""A run directory names its tracking store only as a hint: credentials go where the user configured, nowhere else.

Issue 46, item 1: ``llmpack sync``/``clean`` took the tracking URI from the run directory
(``summary.json``, ``llmpack-owner.json`` of a dead client's ``.<run>.partial``) over the user's, so a
planted directory made a plain ``llmpack clean`` send ``Authorization: Bearer <the user's token>`` to the
planter's listener. Each case here plants a directory naming a loopback listener that records every
connection and request, with the user's token and Basic password in the environment: the listener must
receive nothing, the command must exit 2 with one line naming both stores, and the directory must be
left as it was. The control (an explicit ``--tracking-uri`` naming the listener) shows it does hear.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from components.errors import InputError
from llmpack.run import orphans
from tests.conftest import REPO

TOKEN = "CANARYTOKEN-46-bearer"
PASSWORD = "CANARYPASS-46-basic"
RUN = "direct-20261204-000000-planted"


class Listener:
    """A loopback HTTP server that records every connection and request (answers 400, so a client stops at once)."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[tuple[str, str, str | None]] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                listener.requests.append((self.command, self.path, self.headers.get("Authorization")))
                body = b'{"error_code": "BAD_REQUEST", "message": "a listener"}'
                self.send_response(400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer  # noqa: N815

            def log_message(self, *_args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def verify_request(self, request: Any, client_address: Any) -> bool:
                listener.connections += 1
                return True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def planter() -> Iterator[Listener]:
    listener = Listener()
    yield listener
    listener.close()


def _env(configured: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMPACK_", "MLFLOW_"))}
    return {**env, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "MLFLOW_TRACKING_URI": configured, "MLFLOW_TRACKING_TOKEN": TOKEN, "MLFLOW_TRACKING_USERNAME": "alice",
            "MLFLOW_TRACKING_PASSWORD": PASSWORD, "LLMPACK_TRACKING_MAX_WAIT_S": "3", **extra}


def _llmpack(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmpack", *args], cwd=cwd, env=env, text=True, capture_output=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout)


def _planted_staging(runs: Path, uri: str) -> Path:
    """A dead client's staging directory, as a stranger who can write ``runs`` plants it."""
    staging = runs / f".{RUN}.partial"
    (staging / "finetune").mkdir(parents=True)
    identity = {"run_group": "rg-planted", "pipeline_run": RUN, "orchestrator": "direct", "mode": "local",
                "submitted_at": 1.0}
    orphans.write_owner(staging, identity=identity, run_id=None, tracking_uri=uri, tags={}, params={},
                        pid=_dead_pid())
    return staging


def _planted_run_dir(runs: Path, uri: str) -> Path:
    """A kept run directory whose summary was edited to name ``uri``."""
    run_dir = runs / f"{RUN}.failed"
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("")
    (run_dir / "summary.json").write_text(json.dumps({
        "run_group": "rg-planted", "pipeline_run": RUN, "orchestrator": "direct", "mode": "local",
        "status": "failed", "submitted_at": 1.0, "finished_at": 2.0, "tracking": "not sent",
        "artifacts": {"run_dir": str(run_dir), "mlflow_run_id": None, "tracking_uri": uri}}))
    return run_dir


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(root.rglob("*"))}


def _refused(result: subprocess.CompletedProcess[str], planter: Listener, configured: str) -> str:
    both = result.stdout + result.stderr
    assert planter.connections == 0 and planter.requests == [], (planter.requests, both)  # nothing reached it
    assert result.returncode == 2, both
    assert TOKEN not in both and PASSWORD not in both and "Traceback" not in both
    errors = [line for line in result.stderr.splitlines() if line.startswith("llmpack: error: ")]
    assert len(errors) == 1, both
    line = errors[0]
    assert f"it names the tracking store {planter.url}, not the configured one" in line, line
    assert configured.split("://")[0] + "://" in line and "nothing was sent" in line, line
    return line


@pytest.mark.parametrize("configured", ["sqlite", "http-other-port"])
def test_sync_sends_nothing_to_a_store_an_edited_summary_names(tmp_path: Path, planter: Listener,
                                                               configured: str) -> None:
    users = Listener()  # the user's own server: a refusal happens before anything is sent anywhere
    try:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}" if configured == "sqlite" else users.url
        run_dir = _planted_run_dir(tmp_path / "runs", planter.url)
        before = _snapshot(tmp_path / "runs")
        result = _llmpack("sync", str(run_dir), cwd=tmp_path, env=_env(uri))
        _refused(result, planter, uri)
        assert users.requests == [] and _snapshot(tmp_path / "runs") == before
        assert not (tmp_path / "mlflow.db").exists()  # not even the configured store was opened
    finally:
        users.close()


def test_clean_sends_nothing_to_a_store_a_dead_clients_staging_directory_names(tmp_path: Path,
                                                                                planter: Listener) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    staging = _planted_staging(tmp_path / "runs", planter.url)
    before = _snapshot(tmp_path / "runs")
    result = _llmpack("clean", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, env=_env(uri))
    line = _refused(result, planter, uri)
    assert line.startswith(f"llmpack: error: left {staging}: ") and "llmpack sync" in line
    assert _snapshot(tmp_path / "runs") == before  # not taken over, not moved


def test_sync_of_a_planted_staging_directory_sends_nothing_and_touches_nothing(tmp_path: Path,
                                                                               planter: Listener) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    staging = _planted_staging(tmp_path / "runs", planter.url)
    before = _snapshot(tmp_path / "runs")
    _refused(_llmpack("sync", str(staging), cwd=tmp_path, env=_env(uri)), planter, uri)
    assert _snapshot(tmp_path / "runs") == before


def test_an_explicit_tracking_uri_is_the_users_choice_and_the_listener_hears_it(tmp_path: Path,
                                                                                planter: Listener) -> None:
    """The control: the listener does receive what is sent to it, when the user names it on the command line."""
    run_dir = _planted_run_dir(tmp_path / "runs", planter.url)
    result = _llmpack("sync", str(run_dir), "--tracking-uri", planter.url, cwd=tmp_path,
                      env=_env(f"sqlite:///{tmp_path / 'mlflow.db'}"))
    assert planter.requests and all(auth for _m, _p, auth in planter.requests), planter.requests  # with credentials
    assert result.returncode == 1 and TOKEN not in result.stdout + result.stderr, result.stderr  # the 400: refused


def test_the_library_path_clean_uses_refuses_too(tmp_path: Path, planter: Listener,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from llmpack.run.sync import sync_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", TOKEN)
    with pytest.raises(InputError, match="it names the tracking store"):
        sync_run(_planted_run_dir(tmp_path / "runs", planter.url))
    assert planter.connections == 0


@pytest.mark.parametrize(("recorded", "configured"), [
    ("http://***@127.0.0.1:5000", "http://alice:pw@127.0.0.1:5000"),  # stored redacted: the same store
    ("http://mlflow.svc", "http://MLflow.svc:80/"),  # default port, case, a path
    ("https://h:443/mlflow", "https://h"),
    ("sqlite:////tmp/x/mlflow.db", "sqlite:////tmp/x/mlflow.db"),
    ("", "http://h:5000"),  # an older run without a recorded store
], ids=["redacted", "default-port", "https-path", "sqlite", "none"])
def test_the_same_store_is_not_refused(recorded: str, configured: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmpack.run.sync import store_for

    monkeypatch.setenv("MLFLOW_TRACKING_URI", configured)
    assert store_for(recorded, None, what="RUN_DIR x") == configured


@pytest.mark.parametrize("recorded", [
    "http://127.0.0.1:5001", "https://127.0.0.1:5000", "http://evil.example:5000", "http://user:pw@evil:5000",
    "http://127.0.0.1:5000@evil:5000", "sqlite:////tmp/elsewhere.db", "databricks", "\x1b]52;c;AAAA\x07http://e:1",
    "http://e/" + "x" * 5000, ["not", "a", "string"], {"uri": "http://127.0.0.1:5000"},
], ids=[f"hint{i}" for i in range(11)])  # an id holding a URI would reach PYTEST_CURRENT_TEST, a secret to blank
def test_another_store_is_one_safe_line_naming_both(recorded: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmpack.run.sync import store_for

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    with pytest.raises(InputError) as caught:
        store_for(recorded, None, what="RUN_DIR x")
    line = str(caught.value)
    assert "\n" not in line and "\x1b" not in line and "\x07" not in line and len(line) < 700, line
    assert "not the configured one http://127.0.0.1:5000 (MLFLOW_TRACKING_URI)" in line and "pw@" not in line
    assert store_for(recorded, "http://127.0.0.1:5000", what="RUN_DIR x") == "http://127.0.0.1:5000"  # explicit
