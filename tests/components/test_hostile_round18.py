"""The eighteenth independent round's findings (helper-44, issue 46), replayed: round 17's secret names took the
shell's PWD and OLDPWD (every path under the working directory printed as ``***``), report.json kept a known secret
the JSON encoding had escaped, and default-ignorable characters outside Unicode's format category passed."""

from __future__ import annotations

import pytest


def test_the_shells_working_directories_are_not_secrets(tmp_path) -> None:  # noqa: ANN001 - pytest's tmp_path
    from components.redaction import redact_text, secrets_in

    env = {"PWD": str(tmp_path), "OLDPWD": "/work/somewhere", "DB_PASS": "Zq8dbpass", "BYPASS": "not-a-secret-1"}
    found = secrets_in([], env)
    assert str(tmp_path) not in found and "/work/somewhere" not in found and "not-a-secret-1" not in found
    assert "Zq8dbpass" in found
    assert redact_text(f"--output-dir {tmp_path}/out: exists", secrets=found) == f"--output-dir {tmp_path}/out: exists"


@pytest.mark.parametrize("secret", ['s3cr3t"Quote-Zq9', "s3cr3t\\Back-Zq9", "s3cr3t\u00c4umlaut-Zq9"])
def test_report_json_blanks_a_secret_the_encoding_escapes(secret: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from llmpack.report.escape import blanked_data as _blanked

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", secret)
    data = {"runs": [{"tags": {"llmpack.promotion": f"promoted; note {secret}", secret: 1}}], "n": 2, "x": None}
    text = json.dumps(_blanked(data), sort_keys=True)
    assert secret not in json.loads(text)["runs"][0]["tags"]["llmpack.promotion"]
    assert json.dumps(secret)[1:-1] not in text and secret not in text
    assert json.loads(text)["n"] == 2 and json.loads(text)["x"] is None


@pytest.mark.parametrize("char", ["\u17b4", "\u17b5", "\u180b", "\u180f", "\U000e0080", "\U000e0fff", "\u2800",
                                  "\u0336"])
def test_default_ignorable_and_blank_characters_are_shown_as_escapes(char: str) -> None:
    from llmpack.report.escape import html_text, md

    for shown in (md(f"a{char}b"), html_text(f"a{char}b")):
        assert char not in shown and "\\" in shown
