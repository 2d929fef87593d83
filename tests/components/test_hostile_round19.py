"""The nineteenth independent round's findings (helper-45, issue 46): over-redaction by rounds 17 and 18's fixes,
replayed. A weak password equal to one of llmpack's words (``mlflow``) blanked identity tags in the store for good
and the orchestrator's name in reports; ``HOST_PWD=$PWD`` blanked every path; a case variant was blanked as a
percent-encoded form; an image pinned by digest was read as ``user:password@host``; the command printed for the user
to type went through the whole redactor; an empty sqlite file was made a store by promote."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_identity_tags_reach_the_store_exact_and_only_the_error_is_blanked(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.record import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "mlflow")
    sent: dict[str, list] = {}

    class Store:
        def log_batch(self, run_id: str, **kw: list) -> None:
            sent.update(kw)

    tags = {"llmpack.orchestrator": "mlflow", "llmpack.pipeline_run": "mlflow-20261207-153252-e8fadf",
            "llmpack.error": "step said password mlflow"}
    tracking.set_tags(Store(), "r", tags)
    got = {t.key: t.value for t in sent["tags"]}
    assert got["llmpack.orchestrator"] == "mlflow" and got["llmpack.pipeline_run"] == tags["llmpack.pipeline_run"]
    assert "mlflow" not in got["llmpack.error"]


def test_a_weak_password_does_not_blank_a_reports_words(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmpack.report.escape import blanked_data as _blanked
    from llmpack.report.escape import md

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "mlflow")
    assert md("mlflow") == "mlflow" and md("mlflow-20261207-1") == "mlflow-20261207-1"
    assert md("https://alice:mlflow@h/") == "https\\://\\*\\*\\*@h/"  # a URI's password: by its structure
    assert _blanked({"mlflow_run_id": "mlflow-1", "n": 1}) == {"mlflow_run_id": "mlflow-1", "n": 1}
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "Zq9-strong-pass")
    assert "Zq9-strong-pass" not in md("note Zq9-strong-pass") and _blanked({"a": "x Zq9-strong-pass"})["a"] == "x ***"


def test_a_pwd_variable_holding_a_directory_is_not_a_secret(tmp_path: Path) -> None:
    from components.redaction import secrets_in

    found = secrets_in([], {"HOST_PWD": str(tmp_path), "DEVCONTAINER_PWD": str(tmp_path), "DB_PWD": "Zq8dbpwd1"})
    assert found == {"Zq8dbpwd1"}


def test_only_the_hex_digits_of_a_percent_form_are_lower_cased() -> None:
    from components.redaction import blank_known

    assert blank_known("--backend mlflow; tag mlflow.runName; finetune", {"Mlflow", "Finetune"}) == \
        "--backend mlflow; tag mlflow.runName; finetune"
    assert blank_known("x AB%2fcd%2fe AB%2Fcd%2Fe", {"AB/cd/e"}) == "x *** ***"


def test_an_image_pinned_by_digest_is_no_user_and_password() -> None:
    from components.redaction import redact_text, secrets_in

    image = "ghcr.io/acme/llmpack:0.1.0@sha256:" + "a" * 64
    assert redact_text(f"--image '{image}'", secrets=set()) == f"--image '{image}'"
    assert not secrets_in(["--image", image], {})
    assert redact_text("alice:pw12345@host", secrets=set()) == "alice:***@host"  # a password is still one


def test_the_command_printed_to_type_keeps_names_that_only_look_like_credentials() -> None:
    from llmpack.compare.recommend import _command

    argv = ["--output-dir", "/mnt/runs/token=abc123def", "--tracking-uri", "https://a:pw99xx@h/",
            "--tracking-uri=https://a:pw99xx@h/"]
    line = _command({"argv": argv}, {"--repeats": "3"})
    assert "/mnt/runs/token=abc123def" in line and "pw99xx" not in line and line.endswith("--repeats 3")


def test_promote_refuses_an_empty_sqlite_file(tmp_path: Path) -> None:
    (tmp_path / "empty.db").touch()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'empty.db'}"}
    r = subprocess.run([sys.executable, "-m", "components.serving.promote", "m", "1"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no such database" in r.stderr and (tmp_path / "empty.db").stat().st_size == 0
