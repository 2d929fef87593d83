"""Issue 46, the independent hostile check's findings (second round), each replayed.

A tester who did not write the fixes broke these with payloads of its own: an S3 secret in a presigned
URL's path, the provenance key in an environment dump, direction and tag characters and bare links in
report texts, a request whose prompt is not text. Each test failed before its fix.
"""

from __future__ import annotations

import pytest

from components.redaction import redact_text, redact_uri, secrets_in

S3_SECRET = "wJalrXUtnFEMI%2FK7MDENG%2FbPxRfiCYEXAMPLEKEY"


def test_every_secret_segment_of_a_presigned_path_is_blanked() -> None:
    uri = f"https://bucket.s3.amazonaws.com/AKIAIOSFODNN7EXAMPLE/{S3_SECRET}/obj"
    out = redact_uri(uri)
    assert "wJalrXUt" not in out and "AKIAIOSF" not in out and out.endswith("/obj")
    plain = "https://host/models/SmolLM2-135M-Instruct/llmpack-finetuned/artifacts/model"
    assert redact_uri(plain) == plain  # ordinary path words stay


def test_the_signing_key_is_a_secret_by_name_and_by_value() -> None:
    key = "ab12" * 16
    assert key not in redact_text(f"LLMPACK_SIGNING_KEY={key}")
    assert key in secrets_in([], {"LLMPACK_SIGNING_KEY": key})


@pytest.mark.parametrize("char", ["\u061c", "\U000e0041", "\xad", "\u034f", "\ufe0f", "\u3164"])
def test_report_texts_show_direction_tag_and_filler_characters(char: str) -> None:
    from llmpack.report.escape import html_text, inert, md

    for shown in (inert(f"a{char}b"), md(f"a{char}b"), html_text(f"a{char}b")):
        assert char not in shown and "\\" in shown


def test_a_bare_link_in_a_report_text_is_not_a_link() -> None:
    from llmpack.report.escape import md

    out = md("see https://evil.example/x or www.evil.example")
    assert "https://" not in out and "www.evil" not in out and "evil.example" in out


@pytest.mark.parametrize("request_body", [{"prompt": None}, {"prompt": 7}, {"prompt": {"prompt": "x"}}, 42])
def test_a_request_whose_prompt_is_not_text_is_one_refusal(request_body: object) -> None:
    from mlflow.exceptions import MlflowException

    from components.serving.pyfunc_model import prompts_of

    with pytest.raises(MlflowException, match="must be"):
        prompts_of(request_body)


def _deep(n: int) -> list:
    value: list = []
    for _ in range(n):
        value = [value]
    return value


@pytest.mark.parametrize("request_body", [
    [_deep(100_000)],  # a prompt that is a 100,000-deep list: str() of it was a RecursionError
    ["ok", {"prompt": "x"}],
    {"prompt": ["ok", ["nested"]]},
])
def test_a_prompt_that_is_a_list_or_a_dict_is_one_refusal_naming_its_index(request_body: object) -> None:
    from mlflow.exceptions import MlflowException

    from components.serving.pyfunc_model import prompts_of

    with pytest.raises(MlflowException, match=r"^prompt \d is not text \((list|dict)\)$"):
        prompts_of(request_body)
