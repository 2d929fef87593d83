"""The tenth independent round's breaks (helper-31, issue 46), each replayed: the Trainer status client's token
across a redirect, a schemeless ``user:password@host:PORT`` with '/' or '@' in the password (or an e-mail user),
a model's config.json nested to the recursion limit, and a token path that is a FIFO."""

from __future__ import annotations

import http.server
import os
import threading
import time
from pathlib import Path

import pytest

from components.errors import InputError


def test_the_trainer_status_token_never_follows_a_redirect(tmp_path: Path) -> None:
    """R10-1: urllib's default handler resent ``Authorization: Bearer`` to the Location host on 301/302/303."""
    from components.training.trainer_status import TrainerStatus

    heard: list[dict[str, str]] = []

    class Catch(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            heard.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    catcher = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Catch)

    class Redirect(Catch):
        def do_POST(self) -> None:  # noqa: N802
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{catcher.server_port}/status")
            self.end_headers()

    redirector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for server in (catcher, redirector):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("tok-R10-CANARY\n")
    try:
        status = TrainerStatus(f"http://127.0.0.1:{redirector.server_port}/status", token_file=str(token),
                               ca_file=None)
        status._post({"progressPercentage": 10})
        assert status.failures == 1 and status.sent == 0
    finally:
        for server in (catcher, redirector):
            server.shutdown()
    assert heard == []


@pytest.mark.parametrize("uri", ["alice:Pw/77qXYZ@localhost:5000", "alice:Pw@77qXYZ@localhost:5000",
                                 "alice@corp.com:Pw77qXYZ@localhost:5000", "kubeuser:KubeSrv/Pw77qXYZ@127.0.0.1:1"])
def test_a_schemeless_userinfo_with_any_password_is_refused_and_blanked(uri: str) -> None:
    """R10-2: a port after the host passed ``uri_problem``; '/' or '@' in the password, or an e-mail user, passed
    the redactor (``cluster plan --tracking-uri`` printed it in a traceback; ``doctor --json`` from a kubeconfig)."""
    from components.redaction import redact_text, secrets_in
    from components.uri_checks import uri_problem

    password = uri.rsplit("@", 1)[0].split(":", 1)[1]
    assert uri_problem(uri) is not None and password not in (uri_problem(uri) or "")
    out = redact_text(f"got unsupported URI '{uri}' for the store", secrets=())
    assert password not in out and "77qXYZ" not in out and "KubeSrv" not in out, out
    assert password in secrets_in(["llmpack", "--tracking-uri", uri], {})
    for kept in ("models:/llmpack-finetuned@champion", "sqlite:///a@b.db", "mlruns"):
        assert redact_text(kept, secrets=()) == kept and uri_problem(kept) is None
    assert uri_problem("/tmp/a:b@c/mlruns") is None  # a path (its 'b' is blanked in text: more, never less)


def test_a_model_config_nested_past_the_limit_is_one_line(tmp_path: Path) -> None:
    """R10-4: ``--model ./m`` whose config.json is ``[`` x 200,000: a RecursionError traceback, exit 1."""
    from components.training.modeling import check_model_ref

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("[" * 200_000)
    with pytest.raises(InputError, match="config.json"):
        check_model_ref(str(tmp_path / "m"))


def test_a_token_path_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """R10-5: ``KF_PIPELINES_SA_TOKEN_PATH`` naming a FIFO hung ``cluster submit kfp`` (and the Kubernetes and
    Trainer token files were read the same way)."""
    from components.servers.kube import from_host
    from kfp_pipelines.submit import connection

    fifo = tmp_path / "tok.fifo"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(InputError, match="FIFO"):
        connection("http://127.0.0.1:1", None, {"KF_PIPELINES_SA_TOKEN_PATH": str(fifo)})
    with pytest.raises(InputError, match="FIFO"):
        from_host("https://127.0.0.1:1", None, fifo)
    assert time.monotonic() - start < 10
