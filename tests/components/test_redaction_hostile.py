"""The one redaction path against hostile secrets (issue 46, items 6 and 7).

Item 6: a userinfo password holding ``/`` was printed whole (error line and ``--debug``); with ``#`` or ``?``
its prefix was printed as "the port". Item 7: urllib3's retry warnings printed ``?token=...`` unredacted, and
``?jwt=``, ``?pw=``, ``?passphrase=`` were never redacted. Here random passwords holding every URI delimiter
go into URIs, error lines, tracebacks and library log lines; the password, and every 6-character piece of it,
must be gone from what comes out, by structure alone (no list of known secrets). The real library paths are
exercised too: urllib3's own retry warning, a warning, a step process's crash, and the CLI with ``--debug``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import socket
import string
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from components.errors import InputError
from components.redaction import MASK, redact_text, redact_uri, secrets_in
from components.uri_checks import uri_problem
from tests.conftest import REPO

DELIMITERS = ":/?#[]@!$&'()*+,;=%\"<>\\^`{|}~"
SECRET_NAMES = ("token", "access_token", "jwt", "pw", "pwd", "password", "passphrase", "secret", "key", "api_key",
                "sig", "signature", "auth", "credential", "credentials", "client_secret", "X-Amz-Signature",
                "refresh-token", "private_key", "session_token")


def _pieces(secret: str, n: int = 6) -> set[str]:
    return {secret[i:i + n] for i in range(len(secret) - n + 1)}


def _leaked(secret: str, text: str, out: str) -> list[str]:
    """The 6-character pieces of ``secret`` in ``out`` that the text around the secret does not hold itself."""
    around = text.replace(secret, " ") + " " + MASK * 3
    return sorted(p for p in _pieces(secret) if p in out and p not in around)


passwords = st.tuples(st.text(alphabet=string.ascii_letters + string.digits + DELIMITERS, min_size=4, max_size=14),
                      st.sampled_from(DELIMITERS),
                      st.text(alphabet=string.ascii_letters + string.digits + DELIMITERS, min_size=4, max_size=14)
                      ).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(password=passwords, scheme=st.sampled_from(["http", "https", "HTTPS", "postgresql", "s3"]),
       host=st.sampled_from(["127.0.0.1", "mlflow.example", "[::1]", "[fe80::1%25eth0]"]),
       port=st.sampled_from(["", ":5000", ":50OO", ":99999"]),
       path=st.sampled_from(["", "/", "/api/2.0/mlflow?x=1", "/p#frag", "?q=1"]))
def test_a_userinfo_password_with_any_delimiter_never_shows(password: str, scheme: str, host: str, port: str,
                                                            path: str) -> None:
    uri = f"{scheme}://alice:{password}@{host}{port}{path}"
    line = f"llmpack: error: MLFLOW_TRACKING_URI {uri}: does not answer"
    try:
        try:
            raise ValueError(f"Failed to parse: {uri}")
        except ValueError as inner:
            raise RuntimeError(f"cannot reach {uri!r} (port {port!r})") from inner
    except RuntimeError as exc:
        tb = "".join(traceback.format_exception(exc))
    outputs = {"redact_uri": (uri, redact_uri(uri)), "line": (line, redact_text(line, secrets=())),
               "traceback": (tb, redact_text(tb, secrets=()))}
    problem = uri_problem(uri)
    if problem is not None:
        outputs["uri_problem"] = (uri, problem)
    if scheme.lower().startswith("http"):
        from components.record.tracking import tracking_uri

        try:
            tracking_uri(uri)
        except InputError as exc:  # the one line `llmpack` prints for it
            outputs["tracking_uri"] = (f"--tracking-uri {uri}", str(exc))  # the line names its source
    for name, (text, out) in outputs.items():
        assert password not in out, (name, out)
        assert not _leaked(password, text, out), (name, _leaked(password, text, out), out)
    if len(password) >= 6:  # the process's own secrets are blanked verbatim too, wherever they reappear
        assert password in secrets_in(argv=["llmpack", "--tracking-uri", uri], env={})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=passwords, name=st.sampled_from(SECRET_NAMES), encoded=st.booleans(),
       where=st.sampled_from(["?", "&", "#", ";"]))
def test_a_query_secret_with_any_delimiter_never_shows(secret: str, name: str, encoded: bool, where: str) -> None:
    value = quote(secret, safe="") if encoded else secret
    # A raw value runs to white space or the next '&name=' / ';name=': only such a piece could end it early.
    assume(encoded or not re.search(r"[&;][A-Za-z0-9_.%+\[\]-]+=", value))  # a key may hold + and [ ] (token[0]=)
    assume(encoded or not any(c.isspace() for c in value))
    lead = "?run=1&" if where in "&;" else where
    lead = lead if where != ";" else "?run=1;"
    uri = f"http://127.0.0.1:5000/api/2.0/mlflow/runs/get{lead}{name}={value}"
    retry = (f"Retrying (Retry(total=1, connect=1)) after connection broken by 'NewConnectionError(\"HTTPConnection("
             f"host='127.0.0.1', port=5000): refused\")': /api/2.0/mlflow/runs/get{lead}{name}={value}")
    for text, out in ((uri, redact_uri(uri)), (f"error: {uri} failed", redact_text(f"error: {uri} failed", secrets=())),
                      (retry, redact_text(retry, secrets=()))):
        assert value not in out and secret not in out, out
        assert not _leaked(value, text, out) and not _leaked(secret, text, out), out


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_every_known_secret_name_is_blanked_in_a_uri_and_a_bare_path(name: str) -> None:
    value = "CANARY-v4lue-46"
    for text in (f"https://h/p?a=1&{name}={value}&b=2", f"/api/2.0/x?{name}={value}", f"https://h/cb#{name}={value}"):
        out = redact_text(text, secrets=())
        assert value not in out and f"{name}={MASK}" in out, out


@pytest.mark.parametrize("value", ["Ab12Cd34Ef56Gh78Ij90Kl", "xK9mQ2vL8nR4tY6wZ1pB3cD5", "AKIAABCDEFGHIJKLMNOP"])
def test_a_long_random_looking_value_is_blanked_whatever_its_name(value: str) -> None:
    assert value not in redact_text(f"https://h/p?custom_thing={value}&x=1", secrets=())
    assert value not in redact_uri(f"https://h/p?opaque={value}")


@pytest.mark.parametrize("text", [
    "https://h/api?run_id=0123456789abcdef0123456789abcdef&max_tokens=5",  # an MLflow run id is no secret
    "https://h/api?model=Qwen2.5-0.5B-Instruct&experiment_name=llmpack",
    "token: missing; max_tokens=5, tokens_per_s=3.1",
    "models:/finetuned@champion",
    "sqlite:////tmp/runs/mlflow.db",
])
def test_ordinary_values_are_kept(text: str) -> None:
    assert redact_text(text, secrets=()) == text


@pytest.mark.parametrize("text", [
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLWJ5dGVz",
    "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345",
])
def test_tokens_known_by_their_form_are_blanked_anywhere(text: str) -> None:
    assert text not in redact_text(f"the server said: bad credentials {text} (401)", secrets=())


# ------------------------------------------------------------------ the real library paths: logs and warnings


@pytest.fixture()
def log_redaction() -> Iterator[None]:
    """Whatever :func:`install_log_redaction` changes is put back after the test."""
    from components.redaction import RedactingFilter

    def plain() -> None:  # no redaction installed: as before an earlier test in this process (a CLI run) installed it
        factory = logging.getLogRecordFactory()
        logging.setLogRecordFactory(getattr(factory, "_llmpack_original", factory))
        warnings.formatwarning = getattr(warnings.formatwarning, "_llmpack_original", warnings.formatwarning)
        loggers = [v for v in logging.root.manager.loggerDict.values() if isinstance(v, logging.Logger)]
        for logger in [*loggers, logging.getLogger()]:
            for holder in [logger, *logger.handlers]:
                holder.filters = [f for f in holder.filters if not isinstance(f, RedactingFilter)]

    factory, formatwarning = logging.getLogRecordFactory(), warnings.formatwarning
    plain()
    yield
    plain()
    logging.setLogRecordFactory(factory)
    warnings.formatwarning = formatwarning


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SECRETS = {"token": "CANARY-tok-46x", "jwt": "CANARY-jwt-46x", "pw": "CANARY-pw-46x", "passphrase": "CANARY-pp-46x"}


def _urllib3_retry_lines() -> str:
    """What urllib3 itself logs when it retries a URL with secrets in its query (a closed loopback port)."""
    import urllib3

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    keep = Keep()
    logger = logging.getLogger("urllib3")
    logger.addHandler(keep)
    level, logger_level = logging.getLogger().level, logger.level
    logger.setLevel(logging.WARNING)
    try:
        query = "&".join(f"{k}={v}" for k, v in SECRETS.items())
        with contextlib.suppress(urllib3.exceptions.MaxRetryError):
            urllib3.PoolManager().request("GET", f"http://127.0.0.1:{_free_port()}/api?{query}",
                                          retries=urllib3.Retry(total=2, backoff_factor=0))
    finally:
        logger.removeHandler(keep)
        logger.setLevel(logger_level)
        logging.getLogger().setLevel(level)
    return "\n".join(lines)


def test_urllib3s_own_retry_warning_is_redacted(log_redaction: None) -> None:
    from components.redaction import install_log_redaction

    raw = _urllib3_retry_lines()
    assert "Retrying" in raw and SECRETS["jwt"] in raw  # the control: the library does log them
    install_log_redaction()
    install_log_redaction()  # idempotent
    out = _urllib3_retry_lines()
    assert "Retrying" in out and not [v for v in SECRETS.values() if v in out], out


def test_a_warning_and_a_logged_traceback_are_redacted(log_redaction: None, capsys: pytest.CaptureFixture[str]) -> None:
    from components.redaction import install_log_redaction

    install_log_redaction()
    secret = "CANARY/pass#46?x"
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("mlflow.store")
    logger.addHandler(handler)
    logging.getLogger("py.warnings").addHandler(handler)
    try:
        with warnings.catch_warnings():  # warnings logged, as llmpack.ui.display.library_logs_to has them
            warnings.simplefilter("always")
            logging.captureWarnings(True)
            warnings.warn(f"could not reach http://alice:{secret}@h:5000/?jwt={SECRETS['jwt']}", UserWarning,
                          stacklevel=1)
            logging.captureWarnings(False)
        print(warnings.formatwarning(f"https://h/?pw={SECRETS['pw']}", UserWarning, "x.py", 1), file=sys.stderr)
        try:
            raise ConnectionError(f"https://bob:{secret}@h/x?pw={SECRETS['pw']}")
        except ConnectionError:
            logger.error("upload failed for %s", f"/api?passphrase={SECRETS['passphrase']}", exc_info=True)
    finally:
        logger.removeHandler(handler)
        logging.getLogger("py.warnings").removeHandler(handler)
    both = capsys.readouterr().err + stream.getvalue()
    assert "could not reach" in both and "ConnectionError" in both and "upload failed" in both, both
    assert not [v for v in [secret, *SECRETS.values()] if v in both] and "CANARY" not in both, both


def test_a_step_processs_crash_and_its_library_logs_are_redacted(monkeypatch: pytest.MonkeyPatch, log_redaction: None,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from components.process import lifeline, runner, startup

    secret = "CANARY/step#46?pw"

    def crash(_argv: list[str]) -> int:
        logging.getLogger("urllib3.connectionpool").warning("Retrying after connection broken: %s",
                                                            f"/api?token={SECRETS['token']}")
        raise RuntimeError(f"could not log to https://alice:{secret}@mlflow:5000/")

    for module, name in ((lifeline, "at_start"), (startup, "pause_full_collections"), (startup, "settle")):
        monkeypatch.setattr(module, name, lambda: None)
    monkeypatch.setattr(runner, "run", crash)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logging.getLogger().addHandler(handler)
    try:
        assert runner.main([]) == 1
    finally:
        logging.getLogger().removeHandler(handler)
    both = capsys.readouterr().err + stream.getvalue()
    assert "Traceback" in both and "Retrying" in both, both
    assert "CANARY" not in both, both


# ------------------------------------------------------------------ the CLI, end to end (a subprocess each)

CLI_PASSWORDS = {"slash": "Pfx123/Sfx456", "hash": "Pfx123#Sfx456", "question": "Pfx123?Sfx456",
                 "at": "Pfx123@Sfx456", "quotes": "Pfx123'\"Sfx456", "all": "Pfx123:/?#[]@!$&'()*+,;=Sfx456"}
# each form once, by MLFLOW_TRACKING_URI or by --tracking-uri (both reach the same check; six processes, not twelve)
CLI_CASES = [("slash", "env"), ("slash", "flag"), ("hash", "env"), ("question", "flag"), ("at", "env"),
             ("quotes", "flag"), ("all", "env")]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMPACK_", "MLFLOW_", "PYTEST_"))}
    return {**env, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0", **extra}


def _report(cwd: Path, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(parents=True)
    return subprocess.run([sys.executable, "-m", "llmpack", "--debug", "report", "--run-group", "rg-x", "--out", "r",
                           *flags], cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    root = tmp_path_factory.mktemp("hostile-redaction")
    port = _free_port()
    jobs = {}
    for form, via in CLI_CASES:
        uri = f"http://alice:{CLI_PASSWORDS[form]}@127.0.0.1:{port}/"
        jobs[f"{form}-{via}"] = ((root / f"{form}-env", _env(MLFLOW_TRACKING_URI=uri), ()) if via == "env"
                                 else (root / f"{form}-flag", _env(), ("--tracking-uri", uri)))
    query = "&".join(f"{k}={v}" for k, v in SECRETS.items())
    jobs["query-retries"] = (root / "query", _env(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{port}/?{query}"), ())
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(_report, cwd, env, *flags) for name, (cwd, env, flags) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize(("form", "via"), CLI_CASES)
def test_the_cli_never_prints_a_password_with_delimiters_even_with_debug(
        form: str, via: str, cli_runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    result = cli_runs[f"{form}-{via}"]
    both = result.stdout + result.stderr
    assert "Pfx123" not in both and "Sfx456" not in both, both  # neither whole, nor as "the port", nor in a frame
    assert result.returncode in (1, 2) and result.stderr.rstrip().splitlines()[-1].startswith("llmpack: error: "), both
    if form in ("slash", "hash", "question", "all"):  # it cannot be right: refused up front, and says why
        assert result.returncode == 2 and "percent-encode" in both and "Traceback" in both, both


def test_the_clis_retry_lines_and_error_line_blank_query_secrets(
        cli_runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    result = cli_runs["query-retries"]
    both = result.stdout + result.stderr
    assert result.returncode != 0 and "llmpack: error: " in result.stderr, both
    assert not [v for v in SECRETS.values() if v in both], both
