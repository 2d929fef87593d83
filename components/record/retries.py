"""Bounded uploads to the tracking store: how long one upload may wait in all (``LLMPACK_TRACKING_MAX_WAIT_S``),
which failures are worth asking again, and the one retry layer around a call (MLflow's own off inside it).

:mod:`components.record.tracking` uploads through :func:`with_retries` and keeps these names as its own
(``tracking.with_retries``). The retry rules: docs/internals/record-internals.md.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from components import settings
from components.errors import InputError

DEFAULT_MAX_WAIT_S = 30.0
# Answers worth asking again: the server is there but busy (5xx are transient too).
_TRANSIENT_STATUS = frozenset({408, 429})

T = TypeVar("T")
# Who holds MLflow's HTTP settings right now (one retry layer: MLflow's own off inside ours).
_http_env_lock = threading.Lock()
_http_env_users = 0
_http_env_saved: dict[str, str | None] = {}


@dataclass(frozen=True, kw_only=True)
class UploadRetry:
    """How long one upload may wait for the tracking store in all, and how it backs off."""

    max_wait_s: float = DEFAULT_MAX_WAIT_S  # attempts and sleeps together; 0: one attempt
    first_backoff_s: float = 0.5
    backoff_factor: float = 2.0
    max_backoff_s: float = 8.0
    request_timeout_s: int = 10  # each HTTP request (connect, then read); MLflow's own retries off


def upload_retry(env: Mapping[str, str] | None = None) -> UploadRetry:
    """The retry bound from ``LLMPACK_TRACKING_MAX_WAIT_S`` (seconds, >= 0), else the 30 s default."""
    raw = (os.environ if env is None else env).get(settings.TRACKING_MAX_WAIT_S.name, "").strip()
    if not raw:
        return UploadRetry()
    try:
        max_wait_s = float(raw)
    except ValueError:
        max_wait_s = -1.0
    if not math.isfinite(max_wait_s) or max_wait_s < 0:
        raise InputError(f"{settings.TRACKING_MAX_WAIT_S.name}={raw!r}: must be a number of seconds >= 0 (e.g. 30)")
    return UploadRetry(max_wait_s=max_wait_s)


def mlflow_http_env(retry: UploadRetry, env: Mapping[str, str]) -> dict[str, str]:
    """MLflow's own HTTP retry settings, bounded by ``retry``, for processes that call MLflow directly.

    The register step logs the model through MLflow's client (no :func:`with_retries` there). With
    backoff factor 1, urllib3 sleeps 0, 2, 4, 8... s (plus up to 1 s jitter) between tries: as many
    retries as keep that sum within ``retry.max_wait_s`` (30 s: 4 retries, 14 s), each request
    timing out after ``retry.request_timeout_s``. Settings the user made are kept.
    """
    retries = int(math.log2(retry.max_wait_s + 1)) if retry.max_wait_s >= 1 else 0
    bounded = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(min(retries, 10)), "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": str(retry.request_timeout_s)}
    return {k: v for k, v in bounded.items() if k not in env}


class TrackingUnavailable(RuntimeError):
    """The tracking store did not answer within the upload's bounded wait."""

    def __init__(self, waited_s: float, cause: BaseException) -> None:
        super().__init__(f"tracking store unreachable after {waited_s:.1f} s ({type(cause).__name__})")
        self.waited_s = waited_s
        self.cause = cause


def is_transient(exc: BaseException) -> bool:
    """Worth another try: no answer (refused, reset, timed out) or a 5xx/408/429 answer; never a 4xx."""
    from components.record.rest import RestError

    if isinstance(exc, RestError):  # the REST client's: an answer's status, or none (an untrusted certificate)
        return exc.status is not None and (exc.status >= 500 or exc.status in _TRANSIENT_STATUS)
    if "mlflow" not in sys.modules:  # not MLflow's: the REST path never imports it
        return isinstance(exc, (OSError, TimeoutError))
    from mlflow.exceptions import InvalidUrlException, MlflowException

    if isinstance(exc, InvalidUrlException):
        return False
    if isinstance(exc, MlflowException):  # MLflow wraps "no answer" as INTERNAL_ERROR (500)
        status = exc.get_http_status_code()
        return status >= 500 or status in _TRANSIENT_STATUS
    return isinstance(exc, (OSError, TimeoutError))  # requests' ConnectionError/Timeout are OSErrors


@contextmanager
def _one_retry_layer(request_timeout_s: int) -> Iterator[None]:
    """MLflow's own HTTP retries off, its request timeout capped and its run links unprinted, while a bounded
    upload runs.

    MLflow reads ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` (default 7, backoff factor 2, jitter 1 s) and
    ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (default 120 s) from the environment at every request and takes
    no argument for them through ``MlflowClient``; left alone, one request to a dead server retries
    for minutes, under whatever bound we set. And ``set_terminated`` on an HTTP store writes
    "View run ... at: URL" to stdout (unless ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT``), which
    would corrupt ``llmpack run --json``. So these are set for the duration of the call (a user's
    shorter timeout is kept) and restored after it; the last of concurrent users restores.
    """
    global _http_env_users
    with _http_env_lock:
        if _http_env_users == 0:
            names = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT",
                     "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT")
            _http_env_saved.clear()
            _http_env_saved.update({name: os.environ.get(name) for name in names})
            try:
                user_timeout = int(_http_env_saved["MLFLOW_HTTP_REQUEST_TIMEOUT"] or request_timeout_s)
            except ValueError:
                user_timeout = request_timeout_s
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
            os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, min(user_timeout, request_timeout_s)))
            os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        _http_env_users += 1
    try:
        yield
    finally:
        with _http_env_lock:
            _http_env_users -= 1
            if _http_env_users == 0:
                for name, value in _http_env_saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value


def with_retries(
    call: Callable[[], T],
    retry: UploadRetry,
    *,
    until: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``call()``, retried with backoff on transient errors until ``retry.max_wait_s`` (or ``until``,
    a ``clock()`` time shared by several calls) is spent; then :class:`TrackingUnavailable`.

    ``call`` must be idempotent: every upload here is (keys already present are not logged again).
    """
    start = clock()
    deadline = start + retry.max_wait_s if until is None else until
    backoff = retry.first_backoff_s
    while True:
        try:
            with _one_retry_layer(retry.request_timeout_s):
                return call()
        except Exception as exc:  # noqa: BLE001 - sorted right here: transient ones retried, others raised
            if not is_transient(exc):
                raise
            remaining = deadline - clock()
            if remaining <= 0:
                raise TrackingUnavailable(clock() - start, exc) from exc
        # the wait outside the except block: a Ctrl-C in it carries no context of the store's error (MLflow's
        # words hold the tracking URI whole: round 22)
        sleep(min(backoff, remaining))
        backoff = min(backoff * retry.backoff_factor, retry.max_backoff_s)
