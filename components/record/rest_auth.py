"""What MLflow's HTTP client would send and check, read from the environment as MLflow reads it: the credentials
(username and password, else the token; ``~/.mlflow/credentials``) and TLS verification (the server CA,
``REQUESTS_CA_BUNDLE``, certifi), for :class:`components.record.rest.RestClient`. Never printed.
"""

from __future__ import annotations

import base64
import os
import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from components.errors import InputError

_TRUE, _FALSE = ("true", "1"), ("false", "0")


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """What MLflow's HTTP client would send and check, from the environment (never printed)."""

    authorization: str | None = field(default=None, repr=False)
    insecure: bool = False
    server_cert_path: str | None = None
    client_cert_path: str | None = None


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw and raw not in _TRUE + _FALSE:
        raise InputError(f"{name}={env[name]!r}: expected true or false")
    return raw in _TRUE


def _file_credentials() -> tuple[str | None, str | None]:
    """``~/.mlflow/credentials``'s ``[mlflow]`` username and password, as MLflow reads them."""
    path = Path(os.path.expanduser("~/.mlflow/credentials"))
    if not path.exists():
        return None, None
    import configparser  # only for ~/.mlflow/credentials: not on every step's path

    config = configparser.ConfigParser()
    config.read(path)
    section = config["mlflow"] if "mlflow" in config else {}
    return section.get("mlflow_tracking_username"), section.get("mlflow_tracking_password")


def credentials(env: Mapping[str, str] | None = None) -> Credentials:
    """MLflow's precedence: username and password (env, else the credentials file) as Basic.

    Else the token as Bearer.
    """
    env = os.environ if env is None else env
    file_user, file_password = _file_credentials()
    user = env.get("MLFLOW_TRACKING_USERNAME") or file_user
    password = env.get("MLFLOW_TRACKING_PASSWORD") or file_password
    token = env.get("MLFLOW_TRACKING_TOKEN")
    if user and password:
        authorization: str | None = "Basic " + base64.standard_b64encode(f"{user}:{password}".encode()).decode()
    else:
        authorization = f"Bearer {token}" if token else None
    insecure = _flag(env, "MLFLOW_TRACKING_INSECURE_TLS")
    server_cert = env.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or None
    if insecure and server_cert:
        raise InputError("MLFLOW_TRACKING_INSECURE_TLS and MLFLOW_TRACKING_SERVER_CERT_PATH: set one of them, not both")
    return Credentials(authorization=authorization, insecure=insecure, server_cert_path=server_cert,
                       client_cert_path=env.get("MLFLOW_TRACKING_CLIENT_CERT_PATH") or None)


def tls_context(creds: Credentials, env: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """Verification as ``requests`` does it for MLflow: the server CA given, else ``REQUESTS_CA_BUNDLE``/
    ``CURL_CA_BUNDLE``, else certifi's bundle; off only by ``MLFLOW_TRACKING_INSECURE_TLS``."""
    env = os.environ if env is None else env
    if creds.insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        bundle = creds.server_cert_path or env.get("REQUESTS_CA_BUNDLE") or env.get("CURL_CA_BUNDLE") or _certifi()
        if bundle and Path(bundle).is_dir():
            ctx = ssl.create_default_context(capath=bundle)
        else:
            ctx = ssl.create_default_context(cafile=bundle)
    if creds.client_cert_path:
        ctx.load_cert_chain(creds.client_cert_path)
    return ctx


def _certifi() -> str | None:
    try:
        import certifi
    except ImportError:
        return None
    return str(certifi.where())


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect: urllib would resend the body and every header (``Authorization`` included) to
    wherever ``Location`` points. The 3xx becomes an HTTPError, so nothing is resent: credentials go only to
    the configured address (the tracking client of every step, the trace sender)."""

    def redirect_request(self, req: urllib.request.Request, fp: object, code: int, msg: str, headers: object,
                         newurl: str) -> None:
        return None
