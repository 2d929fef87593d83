"""A real run with a canary secret in every credential setting the docs name: no canary in anything it writes or prints.

A real ``mlflow server`` (sqlite) on 127.0.0.1, reached through a tracking URI that carries a
password in its userinfo; a canary in every credential variable the docs and
``components/settings.py`` accept (MLflow's username, password and token, ``HF_TOKEN``, the cloud
keys, the orchestrator and Kubernetes tokens); then the tiny direct pipeline (``llmpack run``),
its report (``llmpack report``) and a ``llmpack sync`` of the run directory. Every file under the
working directory (run directories, JSONL, summaries, the client log, the report) and under the
server's root (its database and artifact store) is read as bytes and searched for each canary, in
plain, URL-encoded and Basic-auth (base64) form; so are stdout and stderr of every command. Slow:
the server's start and a whole pipeline run (about a minute on the shared development machine).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

# Every credential variable a user may set for llmpack, its libraries or its clusters (docs/configuration.md,
# docs/cli.md, docs/cluster.md, docs/internals/record.md; components/settings.py).
CREDENTIAL_VARIABLES = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "HF_TOKEN",
                        "HUGGING_FACE_HUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                        "AZURE_STORAGE_ACCESS_KEY", "KFP_TOKEN", "ARGO_TOKEN", "LLMPACK_K8S_TOKEN", "DATABRICKS_TOKEN")
URI_USER, URI_PASSWORD = "alice", "CANARY-uri-password-7f3"


def canary(name: str) -> str:
    return f"CANARY-{name.lower().replace('_', '-')}-7f3"


def forms(secret: str) -> set[bytes]:
    """A secret as it could appear in a file: plain, URL-encoded, and inside a Basic auth header."""
    out = {secret, urllib.parse.quote(secret, safe=""), base64.b64encode(f"{URI_USER}:{secret}".encode()).decode()}
    out.add(base64.b64encode(f"{canary('MLFLOW_TRACKING_USERNAME')}:{secret}".encode()).decode())
    return {s.encode() for s in out}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from mlflow_server import MlflowServer

    root = tmp_path_factory.mktemp("mlflow-server")
    with MlflowServer(root) as srv:
        yield root, srv.uri


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["direct", "mlflow"])  # mlflow: MLflow printed the URI whole at each run's end
def test_no_canary_in_anything_a_run_writes_or_prints(server: tuple[Path, str], tmp_path: Path, backend: str) -> None:
    server_root, plain_uri = server
    uri = plain_uri.replace("http://", f"http://{URI_USER}:{URI_PASSWORD}@")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMPACK_", "MLFLOW_", "KFP_", "ARGO_"))}
    env.update({name: canary(name) for name in CREDENTIAL_VARIABLES})
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO),
                "AWS_ACCESS_KEY_ID": "AKIACANARY0000000000"})
    secrets = [URI_PASSWORD, *(canary(name) for name in CREDENTIAL_VARIABLES)]

    def llmpack(*args: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([sys.executable, "-m", "llmpack", *args], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600, stdin=subprocess.DEVNULL)
        for secret in secrets:
            for form in forms(secret):
                assert form.decode() not in r.stdout + r.stderr, (args, secret, r.stdout + r.stderr)
        return r

    run = llmpack("run", "--backend", backend, "--max-steps", "2", "--run-group", f"rg-canary-{backend}",
                  "--output-dir", "runs", "--tracking-uri", uri)
    assert run.returncode == 0, run.stdout + run.stderr
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir() and (p / "summary.json").exists()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tracking"] == "sent", summary  # the store was reached through the URI with the password
    report = llmpack("report", "--run-group", f"rg-canary-{backend}", "--out", "report")  # URI: MLFLOW_TRACKING_URI
    assert report.returncode == 0, report.stdout + report.stderr
    sync = llmpack("sync", str(run_dir), "--tracking-uri", uri)  # already sent: nothing new, and says so
    assert sync.returncode == 0, sync.stdout + sync.stderr

    scanned = 0
    for root in (tmp_path, server_root):
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            data = path.read_bytes()
            scanned += 1
            for secret in secrets:
                for form in forms(secret):
                    assert form not in data, f"{path} holds {secret!r} ({form!r})"
    assert scanned > 20 and (server_root / "server.db").is_file() and (tmp_path / "report").is_dir()
    assert b"***@127.0.0.1" in (run_dir / "summary.json").read_bytes()  # the URI is recorded, redacted
