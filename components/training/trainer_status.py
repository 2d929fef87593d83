"""Training progress in the TrainJob: rank 0 posts to Kubeflow Trainer's status server (KEP-2779).

With the ``TrainJobStatus`` feature gate the controller gives the training pods an endpoint, its CA
and a token; a POST of progress, ETA and metrics lands in the TrainJob's ``status.trainerStatus``
(the body the kubeflow SDK's ``update_runtime_status`` sends). It never fails or blocks training
(one background thread, a refusal said once), posts at most every 5 s (the first and last step
always), and sends ``loss``, ``step``, ``tokens_per_s`` and ``time_to_first_step_s``. Stdlib only;
rank 0 alone reports. The variables and decisions: docs/internals/step-process.md.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

URL_ENV = "KUBEFLOW_TRAINER_STATUS_URL"
CA_ENV = "KUBEFLOW_TRAINER_STATUS_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_STATUS_TOKEN"
EVERY_S = 5.0
TIMEOUT_S = 5.0


def status_body(*, percent: int, eta_s: float | None, metrics: Mapping[str, float | int | str]) -> dict[str, Any]:
    """The request body (values as strings, as the Trainer's API types them)."""
    status: dict[str, Any] = {"progressPercentage": max(0, min(100, int(percent))),
                              "lastUpdatedTime": datetime.now(timezone.utc).isoformat()}
    if eta_s is not None:
        status["estimatedRemainingSeconds"] = max(0, int(round(eta_s)))
    if metrics:
        status["metrics"] = [{"name": k, "value": _text(v)} for k, v in metrics.items()]
    return {"trainerStatus": status}


class TrainerStatus:
    """Posts the newest progress from a background thread; see the module docstring."""

    def __init__(self, url: str, *, token_file: str | None, ca_file: str | None, every_s: float = EVERY_S) -> None:
        self.url, self.token_file, self.ca_file, self.every_s = url, token_file, ca_file, every_s
        self.sent = 0
        self.failures = 0
        self._pending: dict[str, Any] | None = None
        self._last_queued = -float("inf")
        self._said = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="trainer-status", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TrainerStatus | None:
        """A reporter when the Trainer injected its status URL, else None."""
        env = os.environ if env is None else env
        url = env.get(URL_ENV, "").strip()
        if not url:
            return None
        return cls(url, token_file=env.get(TOKEN_ENV) or None, ca_file=env.get(CA_ENV) or None)

    def update(self, body: dict[str, Any], *, force: bool = False) -> None:
        """Hand over the newest state; sent at once when ``force`` or ``every_s`` has passed since the last."""
        now = time.monotonic()
        with self._cond:
            if self._closed or (not force and now - self._last_queued < self.every_s):
                return
            self._pending, self._last_queued = body, now
            self._cond.notify()

    def close(self, timeout_s: float = TIMEOUT_S + 1.0) -> None:
        """Send what is pending (bounded by ``timeout_s``), then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                body, self._pending = self._pending, None
                closing = self._closed
            if body is not None:
                self._post(body)
            if closing and body is None:
                return

    def _post(self, body: dict[str, Any]) -> None:
        try:
            headers = {"Content-Type": "application/json"}
            if self.token_file:
                from components.bounded import read_bytes  # a FIFO or device refused; a projected token's link kept

                token = read_bytes(self.token_file, 1 << 16, follow_symlinks=True)  # re-read: it rotates
                headers["Authorization"] = f"Bearer {token.decode('utf-8', 'replace').strip()}"
            context = ssl.create_default_context(cafile=self.ca_file) if self.url.startswith("https") else None
            request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
            from components.record.rest_auth import NoRedirect  # the token never follows a Location

            opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), NoRedirect())
            with opener.open(request, timeout=TIMEOUT_S) as resp:
                resp.read()
            self.sent += 1
        except (OSError, ValueError, ssl.SSLError) as exc:
            self.failures += 1
            if not self._said:
                self._said = True
                reason = f"HTTP {exc.code}" if isinstance(exc, urllib.error.HTTPError) else type(exc).__name__
                print(f"finetune: warning: Trainer status server did not take progress ({reason}); training goes on",
                      file=sys.stderr, flush=True)


def _text(value: float | int | str) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
