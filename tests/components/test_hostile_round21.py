"""The twenty-first independent round's findings (helper-47, issue 46), replayed: on the mlflow path, with the
tracking server gone mid-run, MLflow's exception text (``API request to http://alice:PW@host/... failed``) reached
``logs/mlflow.log`` (the driver's uncaught traceback and ``mlflow run``'s own) and ``summary.json``'s error; with the
server down from the start, the run ended in five tracebacks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from components.errors import InputError

SECRET = "Cn21-pw-9zq7k"
URI = f"http://alice:{SECRET}@127.0.0.1:9"


def test_a_logged_commands_output_goes_through_the_redaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from components.commands import run_logged

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    code = f"print('API request to {URI}/api/2.0/mlflow/runs/get failed'); import sys; sys.exit(3)"
    rc, line = run_logged([sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin"}, log_path=tmp_path / "x.log")
    text = (tmp_path / "x.log").read_text()
    assert rc == 3 and SECRET not in text and "http://***@127.0.0.1:9/api/2.0/mlflow/runs/get" in text, text
    assert SECRET not in line


def test_the_mlflow_driver_prints_an_unhandled_error_redacted(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow_projects import driver

    def fails(*_a: object, **_k: object) -> int:
        raise RuntimeError(f"API request to {URI}/api/2.0/mlflow/runs/get failed with exception")

    monkeypatch.setattr(driver, "_main", fails)
    assert driver.main([]) == 1
    err = capsys.readouterr().err
    assert SECRET not in err and "http://***@127.0.0.1:9" in err and "RuntimeError" in err


def test_the_mlflow_paths_failure_line_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow_projects.local import _failure_line

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    assert SECRET not in _failure_line(f"Traceback...\nMlflowException: API request to {URI}/x failed\n")


def test_the_mlflow_path_with_its_store_down_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow_projects.local import experiment_id

    env = {"MLFLOW_TRACKING_URI": URI, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(InputError, match="the mlflow path needs its tracking store") as err:
        experiment_id(env)
    assert SECRET not in str(err.value) and "\n" not in str(err.value)
