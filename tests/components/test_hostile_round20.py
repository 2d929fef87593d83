"""The twentieth independent round's findings (helper-46, issue 46): MLflow printed the tracking URI whole (its
password too) at each run's end, straight to stdout, into the mlflow path's step logs and their uploaded artifacts
(the whole case: tests/llmpack/test_canary_scan.py, mlflow). ``$`` in a store's text (maths on GitHub) is kept as
a limit: escaping it would escape every money figure of a report line, and it only changes how the text looks."""

from __future__ import annotations

import pytest


def test_mlflow_is_told_not_to_print_a_runs_address_even_when_the_user_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from components.redaction import MLFLOW_NO_URL, install_log_redaction

    monkeypatch.setenv(MLFLOW_NO_URL, "false")
    install_log_redaction()
    assert os.environ[MLFLOW_NO_URL] == "true"
    from mlflow.environment_variables import MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT

    assert MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.get() is True  # the switch MLflow itself reads
