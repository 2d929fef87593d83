"""Kubeflow Trainer's status server (KEP-2779) on 127.0.0.1: what a TrainJob's trainer posts progress to.

The controller serves it over https with its own CA and takes a projected service-account token
as a bearer token; a POST of ``{"trainerStatus": {...}}`` becomes the TrainJob's
``status.trainerStatus``. This stand-in checks the token and the body's shape as the Trainer's API
types it (``progressPercentage`` an integer 0-100, ``estimatedRemainingSeconds`` an integer ≥ 0,
``metrics`` a list of ``{"name", "value"}`` strings, ``lastUpdatedTime`` RFC 3339), keeps the
accepted statuses in order, and can be told to answer every post with an error.
"""

from __future__ import annotations

from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

from standins.base import StandInHandler, StandInServer


def shape_error(body: Any) -> str | None:
    """What is wrong with a status body, as the Trainer's validation would refuse it; None when well-formed."""
    status = body.get("trainerStatus") if isinstance(body, dict) else None
    if not isinstance(status, dict):
        return "body: no trainerStatus object"
    pct = status.get("progressPercentage")
    if pct is not None and (not isinstance(pct, int) or not 0 <= pct <= 100):
        return "progressPercentage: an integer 0-100"
    eta = status.get("estimatedRemainingSeconds")
    if eta is not None and (not isinstance(eta, int) or eta < 0):
        return "estimatedRemainingSeconds: an integer >= 0"
    for m in status.get("metrics", []):
        if not (isinstance(m, dict) and isinstance(m.get("name"), str) and isinstance(m.get("value"), str)):
            return "metrics: a list of {name, value} strings"
    try:
        datetime.fromisoformat(status["lastUpdatedTime"])
    except (KeyError, TypeError, ValueError):
        return "lastUpdatedTime: RFC 3339"
    return None


class TrainerStatusStandIn(StandInServer):
    """The status endpoint; ``statuses`` are the accepted ``trainerStatus`` objects, oldest first."""

    thread_name = "trainer-status-standin"
    poll_interval_s = 0.05

    def __init__(self, *, token: str, tls: Any = None, fail_with: int | None = None) -> None:
        super().__init__(token=token, tls=tls)
        self.fail_with = fail_with
        self.statuses: list[dict[str, Any]] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(StandInHandler):
            def _handle(self, method: str) -> None:
                _, _, body, authorized = self._receive(api, method)
                if method != "POST":
                    return self._json(405, {"message": "POST only"})
                if not authorized:
                    return self._json(401, {"message": "Unauthorized"})
                if api.fail_with is not None:
                    return self._json(api.fail_with, {"message": "planted failure"})
                problem = shape_error(body)
                if problem is not None:
                    return self._json(422, {"message": problem})
                api.statuses.append(body["trainerStatus"])
                return self._json(200, {})

        return Handler
