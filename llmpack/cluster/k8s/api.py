"""The Kubernetes API client the pod watcher and the cluster session use, and its errors in one line.

:func:`build_api_client` reaches the API from an explicit host and token, a kubeconfig, or the
in-cluster service account (by :mod:`components.servers.kube`'s one precedence); :func:`api_error` turns
any failure into an :class:`~components.errors.InputError` a user can act on (unreachable,
401/403, unknown namespace), never carrying the token. ``kubernetes`` is imported inside the
functions, so importing this module is cheap.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from components import settings
from components.errors import InputError
from components.servers import kube


def build_api_client(
    *,
    host: str | None = None,
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    ca_cert: str | os.PathLike[str] | None = None,
    verify_ssl: bool = True,
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
) -> Any:
    """A ``kubernetes.client.ApiClient`` by the one precedence of :mod:`components.servers.kube`.

    An explicit ``host`` (+ ``token`` or ``token_file``), else ``kubeconfig`` / ``context``, else
    ``$KUBECONFIG``, else the in-cluster service account, else ``~/.kube/config`` (the file is never
    written back); ``ca_cert`` / ``verify_ssl=False`` override a kubeconfig's TLS settings, as
    kubectl's flags do. Raises :class:`InputError` (one line, never the token) when none is usable.
    """
    from kubernetes import client

    cfg, _ = kube.configuration(
        host=str(host) if host else None, token=token, token_file=str(token_file) if token_file else None,
        kubeconfig=str(kubeconfig) if kubeconfig else None, context=context,
        ca_cert=str(ca_cert) if ca_cert else None, insecure_skip_tls_verify=not verify_ssl,
        otherwise=f"; or give a host and token: {settings.K8S_HOST.name}, {settings.K8S_TOKEN.name}")
    cfg.retries = _retries()
    return client.ApiClient(cfg)


def _retries() -> Any:
    """Connection failures are retried (urllib3's three); a read that timed out is not.

    urllib3 retries a GET whose answer timed out three times by default, so a server that
    answers slowly held every call four times its timeout (a 4 s watch ran past a minute).
    """
    import urllib3

    return urllib3.util.Retry(total=3, connect=3, read=0, redirect=3, status=0, other=0)


def _scrub(message: str, tokens: Iterable[str]) -> str:
    for token in sorted(set(tokens), key=len, reverse=True):
        message = message.replace(token, "***")
    return message


def api_error(exc: BaseException, api_client: Any, doing: str) -> InputError:
    """One line for a failed API call: what we tried, where, what the server (or network) said."""
    failed = kube.failure(exc, api_client)
    host, status = failed.host, failed.status
    if failed.api_exception:
        if status == 401:
            msg = f"Kubernetes API at {host}: 401 Unauthorized: the token or kubeconfig credentials were rejected"
        elif status == 403:
            msg = f"Kubernetes API at {host}: 403 Forbidden: not allowed to {doing} (needs get, list and watch on pods)"
        elif status == 0:  # the client wraps urllib3's SSLError as status 0, "SSLError\n<detail>"
            lines = failed.reason.strip().splitlines()
            detail = " ".join(lines[1:]).strip()[:200] or (lines[0] if lines else "SSLError")
            msg = f"Kubernetes API at {host}: TLS error while trying to {doing} ({detail})"
        else:
            msg = f"Kubernetes API at {host}: {status} {failed.message or failed.reason} while trying to {doing}"
    else:
        msg = f"cannot reach the Kubernetes API at {host} ({_network_reason(exc)}) while trying to {doing}"
    return InputError(_scrub(" ".join(msg.split()), kube.secrets_of(getattr(api_client, "configuration", None))))


def _network_reason(exc: BaseException) -> str:
    import ssl

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLError):
            return f"TLS error: {str(cur).splitlines()[0][:160]}"
        if isinstance(cur, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cur, TimeoutError) or "Timeout" in type(cur).__name__:
            return "timed out"
        if "NameResolution" in type(cur).__name__ or "gaierror" in type(cur).__name__:
            return "host name not resolved"
        reason = getattr(cur, "reason", None)
        cur = reason if isinstance(reason, BaseException) else (cur.__cause__ or cur.__context__)
    text = str(exc).lower()
    if "refused" in text:
        return "connection refused"
    return type(exc).__name__


def read_json(resp: Any) -> Any:
    """The JSON body of an unpreloaded (``_preload_content=False``) response; the connection goes back to the pool.

    An answer that is not JSON (a proxy's HTML page, a server that is not Kubernetes) is one line
    with a short, redacted excerpt, not a decoder traceback.
    """
    from components.redaction import redact_text

    data = b""
    try:
        data = resp.data
        return json.loads(data)
    except ValueError:
        text = bytes(data or b"")[:60].decode("utf-8", errors="replace")
        raise InputError("the Kubernetes API answered with something that is not JSON "
                         f"(it starts {redact_text(text)!r}); is the host a Kubernetes API server?") from None
    finally:
        resp.release_conn()


def is_network_error(exc: BaseException) -> bool:
    import urllib3

    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)
