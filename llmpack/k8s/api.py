"""The Kubernetes API client the pod watcher and the cluster session use, and its errors in one line.

:func:`build_api_client` reaches the API from an explicit host and token, a kubeconfig, or the
in-cluster service account (as ``kubernetes.config.load_config`` does); :func:`api_error` turns
any failure into an :class:`~components.errors.InputError` a user can act on (unreachable,
401/403, unknown namespace), never carrying the token. ``kubernetes`` is imported inside the
functions, so importing this module is cheap.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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
    """A ``kubernetes.client.ApiClient``: an explicit endpoint, else a kubeconfig, else in-cluster.

    - ``host`` (+ ``token`` or ``token_file``, ``ca_cert``, ``verify_ssl``):
      ``Configuration(host=..., api_key={"authorization": "Bearer ..."})``.
    - else ``kubeconfig`` (or ``$KUBECONFIG``, or ``~/.kube/config`` when it exists), with ``context``
      (the file is never written back; ``ca_cert`` / ``verify_ssl=False`` override its TLS settings);
    - else the in-cluster service account (``KUBERNETES_SERVICE_HOST`` set).

    Raises :class:`InputError` (one line, never the token) when none is usable.
    """
    from kubernetes import client, config

    if host:
        cfg = kube.from_host(str(host), token, token_file)
        cfg.verify_ssl = verify_ssl
        if ca_cert:
            _set_ca_cert(cfg, ca_cert)
        return client.ApiClient(cfg)

    path = kubeconfig or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or None
    if path is None:  # as kubernetes.config.load_config: the default kubeconfig first, then in-cluster
        default = Path(os.path.expanduser("~/.kube/config"))
        path = str(default) if default.is_file() else None
    if path is not None:
        if not Path(path).is_file():
            raise InputError(f"{path}: kubeconfig not found")
        cfg = client.Configuration()
        try:
            config.load_kube_config(config_file=str(path), context=context, client_configuration=cfg, persist_config=False)
        except config.ConfigException as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid kubeconfig"
            raise InputError(f"{path}: {_scrub(first, kube.secrets_of(cfg))}") from None
        except Exception as exc:  # YAML errors quote the file, which may hold credentials: name the type only
            raise InputError(f"{path}: not a usable kubeconfig ({type(exc).__name__})") from None
        if not verify_ssl:  # kubectl's --insecure-skip-tls-verify / --certificate-authority override the file
            cfg.verify_ssl = False
        elif ca_cert:
            _set_ca_cert(cfg, ca_cert)
        return client.ApiClient(cfg)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException as exc:
            raise InputError(f"in-cluster Kubernetes config: {str(exc).splitlines()[0]}") from None
        return client.ApiClient(cfg)
    raise InputError(
        "no Kubernetes endpoint: give a host and token, or a kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config)"
    )


def _set_ca_cert(cfg: Any, ca_cert: str | os.PathLike[str]) -> None:
    """Verify the API server with this CA certificate file (kubectl's ``--certificate-authority``)."""
    if not Path(ca_cert).is_file():
        raise InputError(f"{ca_cert}: CA certificate file not found")
    cfg.ssl_ca_cert = str(ca_cert)


def _scrub(message: str, tokens: Iterable[str]) -> str:
    for token in sorted(set(tokens), key=len, reverse=True):
        message = message.replace(token, "***")
    return message


def api_error(exc: BaseException, api_client: Any, doing: str) -> InputError:
    """One line for a failed API call: what we tried, where, what the server (or network) said."""
    from kubernetes.client.exceptions import ApiException

    host = getattr(getattr(api_client, "configuration", None), "host", "?")
    if isinstance(exc, ApiException):
        status = exc.status
        if status == 401:
            msg = f"Kubernetes API at {host}: 401 Unauthorized: the token or kubeconfig credentials were rejected"
        elif status == 403:
            msg = f"Kubernetes API at {host}: 403 Forbidden: not allowed to {doing} (needs get, list and watch on pods)"
        elif status == 0:  # the client wraps urllib3's SSLError as status 0, "SSLError\n<detail>"
            lines = (exc.reason or "").strip().splitlines()
            detail = " ".join(lines[1:]).strip()[:200] or (lines[0] if lines else "SSLError")
            msg = f"Kubernetes API at {host}: TLS error while trying to {doing} ({detail})"
        else:
            msg = f"Kubernetes API at {host}: {status} {_status_message(exc) or exc.reason or ''} while trying to {doing}"
    else:
        msg = f"cannot reach the Kubernetes API at {host} ({_network_reason(exc)}) while trying to {doing}"
    return InputError(_scrub(" ".join(msg.split()), kube.secrets_of(getattr(api_client, "configuration", None))))


def _status_message(exc: Any) -> str:
    try:
        body = json.loads(exc.body)
    except (TypeError, ValueError):
        return ""
    return str(body.get("message", "")) if isinstance(body, dict) else ""


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


def is_network_error(exc: BaseException) -> bool:
    import urllib3

    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)
