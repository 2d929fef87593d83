"""The registry the hand-run serving commands ask (``python -m components.serving.promote`` / ``verify``): the
user's tracking URI checked as ``llmpack`` checks it, a sqlite file that is not there refused (never created),
MLflow's HTTP retries bounded by ``LLMPACK_TRACKING_MAX_WAIT_S``, and MLflow's errors told apart in one line:
no such version, or a store that could not be asked."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from components.errors import InputError

SQLITE = "sqlite:///"


def store_uri(explicit: str | None = None) -> str:
    """``explicit``, else ``MLFLOW_TRACKING_URI``, else ``./mlflow.db``: checked, and a sqlite file that exists."""
    from components.record import tracking

    uri = tracking.tracking_uri(explicit)
    path = Path(uri[len(SQLITE):]) if uri.startswith(SQLITE) else None
    if path is not None and (not path.is_file() or path.stat().st_size == 0):  # an empty file: no store either
        raise InputError(f"MLflow tracking URI {tracking.redact_uri(uri)}: no such database "
                         "(set MLFLOW_TRACKING_URI to the store the model was registered in)")
    return uri


def bound_retries() -> None:
    """MLflow's own HTTP retries in this process bounded as ``llmpack``'s commands bound them."""
    from components.record.retries import mlflow_http_env, upload_retry

    os.environ.update(mlflow_http_env(upload_retry(), os.environ))


def client(uri: str) -> Any:
    """MLflow's client for ``uri``; a scheme MLflow has no store for is one line."""
    from mlflow.tracking import MlflowClient

    from components.record import tracking

    try:
        return MlflowClient(tracking_uri=uri)
    except Exception as exc:  # noqa: BLE001 - MLflow's error for a URI it has no store for: one line
        raise InputError(f"MLflow tracking URI {tracking.redact_uri(uri)}: not a store MLflow can open "
                         f"({type(exc).__name__})") from None


def lookup_error(what: str, exc: BaseException) -> InputError:
    """One line for MLflow's error asking the registry for ``what``: absent, or the store could not be asked."""
    code = str(getattr(exc, "error_code", "") or "")
    if code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
        return InputError(f"{what}: the registry has no such version ({code})")
    return InputError(f"{what}: the registry could not be asked ({type(exc).__name__}: an unreachable or "
                      "refusing store?); nothing was changed")
