"""Talking to a remote server: one-line errors with secrets blanked out, polling, quiet clients.

Every cluster backend (``kfp_pipelines.submit``, ``argo_workflows.submit``,
``mlflow_projects.submit``) turns its client library's exceptions into one
:class:`~components.errors.InputError` line at the boundary, and waits for a run by polling. The
pieces they share live here, once. Stdlib only at import time: ``urllib3`` and ``requests`` are
imported by the function that needs them.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from components.errors import InputError

REQUEST_TIMEOUT_S = 30.0  # one request to an orchestrator's API
WAIT_TIMEOUT_S = 24 * 3600.0  # how long a wait for a run's end lasts by default
POLL_S = 10.0  # how often a wait asks


def one_line(text: Any, secrets: tuple[str | None, ...] = (), limit: int = 300) -> str:
    """A server's message as one short line, with any secret blanked out."""
    line = " ".join(str(text).split())
    for secret in secrets:
        if secret:
            line = line.replace(secret, "***")
            bare = secret.split()[-1] if secret.split() else secret
            if len(bare) >= 6:  # "Bearer <token>": the token alone, too
                line = line.replace(bare, "***")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def server_message(body: Any) -> str:
    """The ``message`` of a gRPC-gateway / Kubernetes ``Status`` error body, else the text."""
    import json

    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return body
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or "")
    return ""


def normalize_host(host: str, *, default_scheme: str = "https") -> str:
    """``host:port`` or a URL, as a URL without a trailing slash (``default_scheme`` when none is given)."""
    host = host.strip()
    if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", host):
        host = f"{default_scheme}://{host}"
    return host.rstrip("/")


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server was never reached (connection refused, timeout, DNS, TLS)."""
    import urllib3

    if isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, OSError)):
        return True
    try:
        import requests

        return isinstance(exc, (requests.ConnectionError, requests.Timeout))
    except ImportError:  # pragma: no cover - requests comes with hera
        return False


def tls_verify(ca_cert: str | None = None, insecure_skip_tls_verify: bool = False) -> bool | str:
    """How a client checks the server's certificate: ``True`` (the system's CAs), a CA file, or ``False``.

    Verification is on unless ``--insecure-skip-tls-verify`` says otherwise, by name; ``--ca-cert``
    trusts one more CA (a cluster's own, as ``kubectl``'s ``certificate-authority`` does).
    """
    if ca_cert and insecure_skip_tls_verify:
        raise InputError("--ca-cert and --insecure-skip-tls-verify: give one or the other")
    if insecure_skip_tls_verify:
        return False
    if ca_cert:
        path = Path(ca_cert).expanduser()
        if not path.is_file():
            raise InputError(f"--ca-cert {ca_cert}: no such file")
        try:
            path.read_bytes()
        except OSError as exc:
            raise InputError(f"--ca-cert {ca_cert}: cannot read ({exc.strerror})") from None
        return str(path)
    return True


def tls_failure(exc: BaseException, host: str) -> str | None:
    """One line for a certificate the client would not trust, else None (the exception is not about TLS)."""
    text, seen = "", exc
    for _ in range(8):  # the SSL error is wrapped by urllib3 / requests / the client library
        if seen is None:
            break
        text += f" {type(seen).__name__} {seen}"
        seen = (seen.__cause__ or seen.__context__
                or (seen.args[0] if seen.args and isinstance(seen.args[0], BaseException) else None))
    if "CERTIFICATE_VERIFY_FAILED" not in text and "certificate verify failed" not in text:
        return None
    why = re.search(r"certificate verify failed: ([^(\)'\"]+)", text)
    reason = why.group(1).strip() if why else "untrusted certificate"
    return (f"{host}: TLS certificate not trusted ({reason}): pass --ca-cert FILE with the server's CA, "
            "or --insecure-skip-tls-verify to skip the check")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Client libraries print links and deprecation warnings; the CLI owns stdout."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def poll(
    read: Callable[[], tuple[str | None, dict[str, Any]]],
    *,
    timeout_s: float,
    poll_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Call ``read`` (-> (final status or None, details)) until a final status or the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, details = read()
        if status is not None:
            return {"status": status, **details, "finished_at": time.time()}
        if time.monotonic() >= deadline:
            return {"status": "timeout", **details}
        sleep(max(0.0, min(poll_s, deadline - time.monotonic())))
