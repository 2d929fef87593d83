"""The seventeenth independent round's findings (helper-40, issue 46), replayed: an output sealed outside any
pipeline run taken by every run (F1, kept as a limit: the user's own by-hand output), a FIFO handed as a YAML file
(F2), the hand-run serving commands without the CLI's guards (F3), a known secret percent-encoded or inside base64
(F4), a store's text in a report (F5), Unicode format characters (F6)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from components.errors import InputError

SECRET = "TokQz7/pw43x"


def _seal(out: Path, run: str) -> None:
    from components.serving import sealed

    with sealed.sealed_output(out, sealed.DATASET, run) as private:
        (private / "train.jsonl").write_text('{"prompt": "a", "answer": "b"}\n')


def test_an_output_sealed_by_hand_outside_any_run_is_the_users_own_and_another_runs_is_refused(
        tmp_path: Path) -> None:
    """F1, kept as a limit: a step the user ran by hand (no run name) seals with the user's key, and a run takes
    it (the user's own output, as a by-hand debugging session hands it on); another run's output is refused."""
    from components.serving import sealed

    _seal(tmp_path / "hand", "")
    assert sealed.verified_seal(tmp_path / "hand", "pr-b", sealed.DATASET)["files"]
    _seal(tmp_path / "run", "pr-a")
    with pytest.raises(InputError, match="the output is pipeline run 'pr-a''s, not 'pr-b''s"):
        sealed.verified_seal(tmp_path / "run", "pr-b", sealed.DATASET)


def test_a_fifo_handed_as_a_yaml_file_is_one_line_never_a_hang(tmp_path: Path) -> None:
    """F2: `--control-plane-costs FIFO`, `--package FIFO`, `--workflow FIFO`, `--arguments FIFO` blocked for ever."""
    from components import yamltext

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result: list[BaseException | None] = []

    def read() -> None:
        try:
            yamltext.load_file(fifo, f"--package {fifo}")
            result.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            result.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # unblock the reader so the test process can end, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail("a FIFO blocked the YAML reader")
    assert isinstance(result[0], InputError) and "not a regular file" in str(result[0])
    link = tmp_path / "link.yaml"
    (tmp_path / "real.yaml").write_text("a: 1\n")
    link.symlink_to(tmp_path / "real.yaml")
    assert yamltext.load_file(link, "x") == {"a": 1}  # the user's own symlink is still followed


@pytest.mark.parametrize("module", ["promote", "verify"])
def test_the_hand_run_serving_commands_refuse_a_missing_store_in_one_line(tmp_path: Path, module: str) -> None:
    """F3: `python -m components.serving.promote|verify` made a `mlflow.db` where none was, and an unknown scheme
    was two tracebacks; now one line, exit 2, no store created."""
    args = ["m", "1"] if module == "promote" else ["models:/m/1", str(tmp_path / "copy")]
    for uri, says in ((None, "no such database"), (f"sqlite:///{tmp_path}/missing.db", "no such database"),
                      ("nosuch://x", "not a store MLflow can open")):
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        if uri:
            env["MLFLOW_TRACKING_URI"] = uri
        r = subprocess.run([sys.executable, "-m", f"components.serving.{module}", *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert says in r.stderr.strip().splitlines()[-1], r.stderr
        assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "missing.db").exists()


def test_an_unreachable_registry_is_not_called_no_such_version() -> None:
    """F3: a store that could not be asked was worded as a version the registry does not have."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST

    from components.serving.registry_store import lookup_error

    gone = MlflowException("no such version", error_code=RESOURCE_DOES_NOT_EXIST)  # as the registry raises it
    assert "has no such version" in str(lookup_error("models:/m/1", gone))
    assert "could not be asked" in str(lookup_error("models:/m/1", ConnectionError("refused")))


@pytest.mark.parametrize("prefix", ["", "a", "ab", "alice:", "bob:"])
def test_a_known_secret_is_blanked_percent_encoded_and_inside_base64(prefix: str) -> None:
    """F4: the raw token was blanked, its `%2F` form and a Basic credential's base64 were not."""
    from components.redaction import redact_text

    b64 = base64.b64encode(f"{prefix}{SECRET}".encode()).decode()
    urlsafe = base64.urlsafe_b64encode(f"{prefix}{SECRET}".encode()).decode()
    text = redact_text(f"failed: {b64} / {urlsafe} / TokQz7%2Fpw43x / TokQz7%2fpw43x / end", secrets={SECRET})
    assert "TokQz7" not in text and b64 not in text and urlsafe not in text, text
    assert text.startswith("failed: ") and text.endswith(" / end")


def test_secret_named_environment_variables_are_known_secrets() -> None:
    """F4: SSHPASS, DB_PASS and *_PWD were not read as secrets (the query-key rules knew pass and pwd)."""
    from components.redaction import secrets_in

    found = secrets_in([], {"SSHPASS": "Zq8sshpw", "DB_PASS": "Zq8dbpass", "ADMIN_PWD": "Zq8adminpwd", "HOME": "/h"})
    assert {"Zq8sshpw", "Zq8dbpass", "Zq8adminpwd"} <= found and "/h" not in found


def test_the_error_tag_is_blanked_on_its_way_to_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """F4: the `llmpack.error` tag reached the store with the secret's encoded forms. (Round 19: only the free-text
    error tag; identity tags and parameters go exact, a weak password blanked them for good.)"""
    from components.record import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET)
    sent: dict[str, list] = {}

    class Store:
        def log_batch(self, run_id: str, **kw: list) -> None:
            sent.update(kw)

        def get_run(self, run_id: str):  # noqa: ANN201 - a run with no params yet
            return type("R", (), {"data": type("D", (), {"params": {}})()})()

    b64 = base64.b64encode(f"alice:{SECRET}".encode()).decode()
    tracking.set_tags(Store(), "r", {"llmpack.error": f"step said Basic-less {b64} and TokQz7%2Fpw43x"})
    assert SECRET not in str(sent) and b64 not in str(sent) and "TokQz7%2F" not in str(sent)
    tracking.log_summary(Store(), "r", {}, {"llmpack.error": f"x {SECRET}", "llmpack.status": "FAILED"}, {"p": "1"})
    assert SECRET not in str(sent["tags"]) and {p.value for p in sent["params"]} == {"1"}


def test_a_store_text_in_a_report_is_redacted_and_format_characters_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    """F5, F6: a planted tag's URI password (a known secret of the report process too) reached report.md/.html/.json
    whole; U+0600, U+06DD, U+FFF9 and U+1D173 passed through the escaping."""
    from llmpack.report.escape import html_text, md, terminal

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cr3tRPT9q")
    planted = "https://alice:s3cr3tRPT9q@127.0.0.1:9/ ?token=s3cr3tRPT9q \u0600\u06dd\ufff9\U0001d173"
    for shown in (md(planted), html_text(planted), terminal(planted)):
        assert "s3cr3tRPT9q" not in shown, shown
        assert not any(c in shown for c in "\u0600\u06dd\ufff9\U0001d173"), shown
        assert "\\u0600" in shown.replace("\\\\", "\\")


def test_report_json_blanks_the_known_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """F5: report.json held a planted tag's password, a known secret of the report process."""
    from components.redaction import blank_known

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cr3tRPT9q")
    assert "s3cr3tRPT9q" not in blank_known('{"llmpack.promotion": "https://alice:s3cr3tRPT9q@h/"}')
