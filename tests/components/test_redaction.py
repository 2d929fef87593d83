"""The one redaction path: URIs, headers, tokens and the process's own secrets never reach a message.

``redact_uri`` must not raise on anything (the old one raised on ``urlsplit(...).port`` with the
port in its message, and the traceback then printed the URI whole); ``redact_text`` must clean a
library's real message (MLflow's ``InvalidUrlException``) and a whole traceback.
"""

from __future__ import annotations

import re
import string
import traceback

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.record.tracking import redact_uri as tracking_redact_uri
from components.redaction import redact_text, redact_uri, secrets_in
from components.uri_checks import uri_problem

CANARY = "CANARYPASS"


@pytest.mark.parametrize(("uri", "want"), [
    ("https://alice:CANARYPASS@host:50OO", "https://***@host:50OO"),
    ("https://alice:CANARYPASS@host:99999/api", "https://***@host:99999/api"),
    ("https://alice:CANARYPASS@[::1:5000", "https://***@[::1:5000"),
    ("https://alice:CANARYPASS@[fe80::1%25eth0]:5000/x", "https://***@[fe80::1%25eth0]:5000/x"),
    ("http://alice:CANARY#PASS@host/", "http://***@host/"),  # a '#' inside the password: still userinfo
    ("https://host/p?a=1&token=CANARYPASS&b=2", "https://host/p?a=1&token=***&b=2"),
    ("https://host/p?access_token=CANARYPASS;password=CANARYPASS", "https://host/p?access_token=***;password=***"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Signature=CANARYPASS&X-Amz-Credential=CANARYPASS",
     "https://b.s3.amazonaws.com/k?X-Amz-Signature=***&X-Amz-Credential=***"),
    ("https://acct.blob.core.windows.net/c?sv=2020&sig=CANARYPASS", "https://acct.blob.core.windows.net/c?sv=***&sig=***"),
    ("https://host/cb#access_token=CANARYPASS&state=x", "https://host/cb#access_token=***&state=x"),
    ("alice:CANARYPASS@[::1]:8888", "***@[::1]:8888"),  # a bare host:port with userinfo
    ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
])
def test_redact_uri(uri: str, want: str) -> None:
    assert redact_uri(uri) == want
    assert tracking_redact_uri(uri) == redact_uri(uri, every_value=True)  # the user's own URI: every value blanked


def test_the_users_tracking_uri_prints_no_query_value_whatever_its_key() -> None:
    """Round 9 (B8): ``?x-mlflow-tok=CANARYpw7Q9z`` (a key no list knows, a value too short to look random) was
    printed by ``run --json`` and in ``report``'s error line."""
    from components.redaction import redact_text, secrets_in

    uri = "http://127.0.0.1:9/api?x-mlflow-tok=CANARYpw7Q9z&region=eu#frag=CANARYfr4g99"
    assert tracking_redact_uri(uri) == "http://127.0.0.1:9/api?x-mlflow-tok=***&region=***"  # the fragment with it
    handed = secrets_in(["llmpack", "report", "--tracking-uri", uri], {})
    assert {"CANARYpw7Q9z", "CANARYfr4g99"} <= handed and "eu" not in handed
    assert "CANARY" not in redact_text(f"cannot reach {uri}: refused", secrets=handed)


def test_a_userinfo_typed_without_a_scheme_is_refused_and_never_printed() -> None:
    """Round 9 (B6): ``sync --tracking-uri 'alice:PW@127.0.0.1:9'`` printed the password in MLflow's error."""
    from components.errors import InputError
    from components.record.tracking import tracking_uri
    from components.redaction import redact_text, secrets_in

    uri = "alice:CANARYpw7Q9z@127.0.0.1:9"
    with pytest.raises(InputError) as err:
        tracking_uri(uri)
    assert "no scheme" in str(err.value) and "CANARY" not in str(err.value)
    assert "CANARY" not in redact_text(f"got unsupported URI '{uri}'", secrets=())
    assert "CANARYpw7Q9z" in secrets_in(["llmpack", "sync", "--tracking-uri", uri], {})
    for kept in ("models:/llmpack-finetuned@champion", "user@example.com", "10:30 at 127.0.0.1"):
        assert redact_text(kept, secrets=()) == kept


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheme=st.sampled_from(["http", "https", "", "s3", "HTTPS"]), user=st.text(max_size=8),
       password=st.text(alphabet=string.ascii_letters + string.digits + "!$%&'()*+,;=:#?[]~-._",
                        min_size=6, max_size=16),
       host=st.text(max_size=30), tail=st.text(max_size=30))
def test_redact_uri_never_raises_and_never_shows_the_password(scheme: str, user: str, password: str, host: str,
                                                              tail: str) -> None:
    uri = f"{scheme}://{user}:{password}@{host.replace('/', '')}/{tail}" if scheme else f"{user}:{password}@{host}"
    out = redact_uri(uri)
    assert isinstance(out, str)
    if "/" not in user + password:  # a '/' ends the authority: what follows is a path, as every URL parser reads it
        assert password not in out.split("@", 1)[0]
    assert uri_problem(uri) is None or isinstance(uri_problem(uri), str)  # never raises either


@pytest.mark.parametrize(("uri", "problem"), [
    ("https://alice:CANARYPASS@host:50OO", "port '50OO' is not a number from 1 to 65535"),
    ("https://alice:CANARYPASS@host:99999", "port '99999' is not a number from 1 to 65535"),
    ("https://alice:CANARYPASS@[::1:5000", "an IPv6 address needs its closing ']'"),
    ("https://[::g]:5000", "not an IPv6 address"),
    ("https://::1:5000", "more than one ':'"),
    ("https://:5000", "no host"),
    ("http://h:٥٠٠٠", "not a number"),  # Arabic-Indic digits: isdigit() says yes, a socket says no
])
def test_uri_problem_names_the_host_part_only(uri: str, problem: str) -> None:
    found = uri_problem(uri)
    assert found is not None and problem in found and CANARY not in found


@pytest.mark.parametrize("uri", ["https://alice:pw@host:5000/x?y=1", "https://[::1]:5000", "http://mlflow.svc",
                                 "sqlite:///x.db", "file:///tmp/mlruns", "databricks"])
def test_uri_problem_accepts_good_uris(uri: str) -> None:
    assert uri_problem(uri) is None


def test_redact_text_cleans_headers_pairs_and_secrets_from_the_environment() -> None:
    env = {"HF_TOKEN": "hf_CANARYTOKEN1", "MLFLOW_TRACKING_PASSWORD": "CANARY-pw-2", "TOKENIZERS_PARALLELISM": "false",
           "MLFLOW_TRACKING_URI": "https://bob:CANARY-pw-3@mlflow:5000"}
    found = secrets_in(argv=["llmpack", "--tracking-uri=https://alice:CANARY-pw-4@h:1?sig=CANARY-sig-5"], env=env)
    assert {"hf_CANARYTOKEN1", "CANARY-pw-2", "CANARY-pw-3", "CANARY-pw-4", "CANARY-sig-5"} <= found
    assert "false" not in found
    text = ("Authorization: Bearer eyJCANARY.abc.def; password=CANARY-x1 'token': 'CANARY-x2' "
            "quoted the password CANARY-pw-3 without its URI; https://u:CANARY-pw-4@h:50OO/x")
    out = redact_text(text, found)
    assert "CANARY" not in out, out
    assert "Authorization: Bearer ***" in out and "password=***" in out and "https://***@h:50OO/x" in out
    assert (redact_text("token: missing; max_tokens=5, tokens_per_s=3.1")
            == "token: missing; max_tokens=5, tokens_per_s=3.1")


def test_mlflows_own_invalid_url_message_and_traceback_are_redacted() -> None:
    """The real library path the report named: MLflow quotes the raw URL in InvalidUrlException."""
    from mlflow.exceptions import InvalidUrlException
    from mlflow.utils.rest_utils import MlflowHostCreds, http_request

    uri = f"https://alice:{CANARY}@host:50OO"
    with pytest.raises(InvalidUrlException) as caught:
        http_request(MlflowHostCreds(uri), "/api/2.0/mlflow/experiments/get", "GET", max_retries=0, timeout=1)
    raw = "".join(traceback.format_exception(caught.value))
    assert CANARY in raw  # the control: the library does print it
    for text in (str(caught.value), raw):
        assert CANARY not in redact_text(text, set())  # by structure alone, without knowing the secret


def test_print_traceback_under_debug_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    from llmpack.cli import print_traceback

    try:
        try:
            raise ValueError(f"Port could not be cast to integer value as '50OO' in https://alice:{CANARY}@host:50OO")
        except ValueError as inner:
            raise RuntimeError("token=" + CANARY) from inner
    except RuntimeError as exc:
        print_traceback(exc)
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError" in err and CANARY not in err
    assert re.search(r"https://\*\*\*@host:50OO", err)


@pytest.mark.parametrize("placeholder", ["--docker-password=TOKEN", '"token":"<token>"', "password=$HF_TOKEN",
                                         "token=${KFP_TOKEN}", "--password=YOUR_PASSWORD"])
def test_a_placeholder_in_a_printed_command_is_kept(placeholder: str) -> None:
    """doctor's fix lines name where the user's secret goes; a placeholder is no secret to blank."""
    from components.redaction import redact_text

    assert (redact_text(f"fix: kubectl create secret x {placeholder}", secrets=())
            == f"fix: kubectl create secret x {placeholder}")


@pytest.mark.parametrize("real", ["--docker-password=Tr0ub4dor", '"token":"ghp_abc123def"', "password=hunter2",
                                  "token=TOKENS1"])
def test_a_real_value_beside_a_secret_key_is_still_blanked(real: str) -> None:
    from components.redaction import redact_text

    assert "***" in redact_text(real, secrets=())
