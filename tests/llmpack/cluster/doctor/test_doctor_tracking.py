"""``llmpack doctor``'s tracking check: a real MLflow tracking server (its own Flask app, a sqlite store) on
loopback behind HTTP basic auth, as an ingress with auth fronts it in production.

Good credentials: ✓. Wrong ones: ✗ on a line of its own (the server's 401). Nothing listening: ✗ on a
line of its own. The password never appears in a line, nor in doctor's whole output.
"""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmpack.cluster.doctor import checks as dc

USER, PASSWORD = "ml-platform", "s3cret-Pa55-91xq"


def basic_auth(app: Any, user: str, password: str) -> Any:
    """A WSGI layer in front of ``app`` that answers 401 unless the request carries these basic-auth credentials."""
    wanted = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("HTTP_AUTHORIZATION") != wanted:
            start_response("401 UNAUTHORIZED", [("WWW-Authenticate", 'Basic realm="mlflow"'),
                                                ("Content-Type", "text/plain")])
            return [b"You are not authenticated."]
        return app(environ, start_response)

    return guarded


@pytest.fixture(scope="module")
def guarded_server(fresh_store_uri: str) -> Iterator[str]:
    """The real MLflow tracking server app on a free loopback port, behind basic auth: its URL."""
    from mlflow.server import app
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, basic_auth(app, USER, PASSWORD), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def fresh_store_uri(tmp_path_factory: pytest.TempPathFactory, mlflow_template_db: Path) -> Iterator[str]:
    """The server's backend store (a copy of the session's template sqlite store), as ``mlflow server`` passes it."""
    from mlflow.server.constants import ARTIFACT_ROOT_ENV_VAR, BACKEND_STORE_URI_ENV_VAR

    from tests.conftest import fresh_store

    root = tmp_path_factory.mktemp("tracking-server")
    uri = fresh_store(mlflow_template_db, root / "mlflow.db")
    mp = pytest.MonkeyPatch()
    mp.setenv(BACKEND_STORE_URI_ENV_VAR, uri)
    mp.setenv(ARTIFACT_ROOT_ENV_VAR, str(root / "artifacts"))
    yield uri
    mp.undo()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_good_credentials_read_the_tracking_server(guarded_server: str) -> None:
    check = dc.tracking_server(guarded_server, username=USER, password=PASSWORD, token=None, verify=True)
    assert check.ok, check.what
    assert check.what == f"MLflow tracking server at {guarded_server} answers an authenticated read"
    assert PASSWORD not in check.what + check.fix


def test_wrong_credentials_are_their_own_failure(guarded_server: str) -> None:
    check = dc.tracking_server(guarded_server, username=USER, password="not-it-" + PASSWORD, token=None, verify=True)
    assert not check.ok
    assert check.what == f"MLflow tracking server at {guarded_server} refused the read with basic auth (HTTP 401)"
    assert "MLFLOW_TRACKING_PASSWORD" in check.fix and PASSWORD not in check.what + check.fix
    bare = dc.tracking_server(guarded_server, username=None, password=None, token=None, verify=True)
    assert not bare.ok and "with no credentials (HTTP 401)" in bare.what


def test_an_unreachable_tracking_server_is_its_own_failure() -> None:
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    check = dc.tracking_server(url, username=USER, password=PASSWORD, token=None, verify=True)
    assert not check.ok
    assert check.what == f"MLflow tracking server at {url} unreachable (ConnectionError)"
    assert "port-forward" in check.fix


def test_credentials_in_the_uri_are_never_shown(guarded_server: str) -> None:
    """A URI carrying userinfo: shown without it, whatever the outcome."""
    host = guarded_server.removeprefix("http://")
    check = dc.tracking_server(f"http://{USER}:{PASSWORD}@{host}", username=None, password=None, token=None,
                               verify=True)
    assert PASSWORD not in check.what + check.fix


def test_the_cli_prints_each_outcome_on_its_own_line_and_never_the_password(guarded_server: str) -> None:
    """``tracking_checks`` as ``llmpack doctor --tracking-uri`` calls it, credentials from MLflow's variables."""
    from llmpack.cluster.doctor.command import DoctorOptions, render, tracking_checks

    tls = {"ca_cert": None, "insecure_skip_tls_verify": False}
    opts = DoctorOptions(paths=("argo",), namespace="llmpack", gpus=None, nodes=1, gpu_type=None, queue=None,
                         cache_pvc=None, compiled=Path("."), flags={"argo_controller_namespace": "argo"},
                         tracking_uri=guarded_server)
    good = {"MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    bad = {**good, "MLFLOW_TRACKING_PASSWORD": "wrong"}
    lines = []
    for env in (good, bad):
        (check,) = tracking_checks(opts, tls, env)
        lines.append(check)
    assert [c.ok for c in lines] == [True, False]
    text = render(lines, opts, "https://127.0.0.1:6443")
    assert "✓ MLflow tracking server" in text and "✗ MLflow tracking server" in text
    assert PASSWORD not in text
    assert tracking_checks(DoctorOptions(**{**opts.__dict__, "tracking_uri": None}), tls, good) == []
