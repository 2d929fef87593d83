"""The one Kubernetes client builder: every part of llmpack that talks to a Kubernetes API uses it.

Precedence, first found wins (documented once, here, and in docs/cluster.md):

1. ``host`` (with ``token`` or ``token_file``): that API server, as ``kubectl --server --token``;
2. ``kubeconfig`` or ``context`` given explicitly: that file / context;
3. ``$KUBECONFIG`` set: its first file;
4. inside a pod (``KUBERNETES_SERVICE_HOST`` set): the pod's service account;
5. ``~/.kube/config``.

That is client-go's order (an explicit kubeconfig beats the in-cluster account) with one
difference: in a pod, a stray ``~/.kube/config`` baked into an image never beats the service
account the pod was given. ``ca_cert`` / ``insecure_skip_tls_verify`` override the kubeconfig's
TLS settings as kubectl's flags do. Every error is one :class:`InputError` line that never holds a
token (:func:`secrets_of`); a failed call is read once, by :func:`failure`. Exec credential plugins run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.errors import InputError
from components.servers.remote import is_unreachable, one_line, server_message, tls_failure

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"  # Kubernetes sets it in every pod
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def secrets_of(cfg: Any) -> tuple[str, ...]:
    """What a client configuration holds that must never be printed.

    Tokens (with and without ``Bearer``), a password.
    """
    found: list[str] = []
    for value in [*(getattr(cfg, "api_key", None) or {}).values(), getattr(cfg, "password", None)]:
        if value:
            found += [str(value), str(value).removeprefix("Bearer ").strip()]
    return tuple(dict.fromkeys(s for s in found if len(s) >= 4))


@dataclass(frozen=True, kw_only=True)
class KubeFailure:
    """A failed call to a Kubernetes API, read once by :func:`failure`: what the server or the network said.

    The one reader of the ``kubernetes`` client's ``ApiException``: each caller words its own
    line from it (what it was trying, the fix it knows). Every text in it has the client's
    secrets blanked out.
    """

    host: str
    status: int  # the HTTP status; 0 when no answer came
    reason: str  # the status line's reason; with status 0, the client's own ("SSLError\n<detail>")
    message: str  # the Status body's message (one line), else the body's text, else ""
    answered: bool  # an ApiException with a status: the server answered
    api_exception: bool  # raised by the client as an ApiException (status 0: it wraps urllib3's SSLError)
    tls: str | None  # a certificate the client would not trust: one line naming the fix, else None
    unreachable: bool  # the server was never reached
    detail: str  # the exception's type and text as one line


def failure(exc: BaseException, api_client: Any) -> KubeFailure:
    """``exc``, raised by a call through ``api_client`` (or its configuration's host), as a :class:`KubeFailure`."""
    from kubernetes.client.exceptions import ApiException

    cfg = getattr(api_client, "configuration", None)
    host = str(getattr(cfg, "host", "?"))
    secrets = secrets_of(cfg)
    api = isinstance(exc, ApiException)
    status = int(getattr(exc, "status", 0) or 0) if api else 0
    reason = str(getattr(exc, "reason", "") or "") if api else ""
    for secret in secrets:  # the reason keeps its lines (status 0: the SSL error's detail is on the second)
        reason = reason.replace(secret, "***")
    return KubeFailure(host=host, status=status, reason=reason,
                       message=one_line(server_message(getattr(exc, "body", None)), secrets) if api else "",
                       answered=api and bool(status), api_exception=api, tls=tls_failure(exc, host),
                       unreachable=not api and is_unreachable(exc),
                       detail=one_line(f"{type(exc).__name__}: {exc}", secrets))


def _tls(cfg: Any, ca_cert: str | None, insecure_skip_tls_verify: bool) -> None:
    if insecure_skip_tls_verify:
        cfg.verify_ssl = False
    elif ca_cert:
        if not Path(ca_cert).is_file():
            raise InputError(f"{ca_cert}: CA certificate file not found")
        cfg.ssl_ca_cert = str(ca_cert)


def from_host(host: str, token: str | None, token_file: str | os.PathLike[str] | None) -> Any:
    """A configuration for the API server at ``host`` with a bearer token (given, or read from ``token_file``)."""
    from kubernetes import client

    if not str(host).startswith(("http://", "https://")):
        raise InputError(f"Kubernetes host {host!r} must be an http:// or https:// URL")
    if token_file and not token:
        try:
            from components.bounded import read_bytes  # a FIFO or device refused, not waited on

            token = read_bytes(token_file, 1 << 16, follow_symlinks=True).decode("utf-8", "replace").strip()
        except OSError as exc:
            raise InputError(f"{token_file}: cannot read the token file ({exc.strerror or exc})") from None
    token = (token or "").strip().removeprefix("Bearer ").strip() or None
    return client.Configuration(host=str(host).rstrip("/"),
                                api_key={"authorization": f"Bearer {token}"} if token else None)


def kubeconfig_secrets(path: str) -> set[str]:
    """What the kubeconfig files at ``path`` hold that must never be printed: each server's userinfo and
    secret query values, each user's token, password and key data, its auth-provider's config values, its exec
    plugin's env values and the args that could be secrets (a failing plugin echoes them). An unreadable file
    gives none (the client's own error follows)."""
    import yaml

    from components import bounded
    from components.redaction import text_secrets

    found: set[str] = set()
    for one in filter(None, path.split(os.pathsep)):
        one = os.path.expanduser(one)  # as the client expands it (`~/kc.yaml` quoted, or in KUBECONFIG)
        try:
            data = bounded.read_bytes(one, MAX_KUBECONFIG_BYTES, follow_symlinks=True)
        except FileNotFoundError:
            continue  # the client's own error follows
        except OSError as exc:
            raise InputError(f"kubeconfig {one}: cannot read ({exc.strerror or exc})") from None
        try:  # read as the client reads it (aliases too): what it can load, this reads first, or nothing loads
            doc = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a SafeLoader
        except (yaml.YAMLError, RecursionError, ValueError):
            raise InputError(f"kubeconfig {one}: not a usable kubeconfig (not valid YAML)") from None
        doc = doc if isinstance(doc, dict) else {}
        for entry in _entries(doc, "clusters"):
            cluster = entry.get("cluster")
            server = cluster.get("server") if isinstance(cluster, dict) else None
            if isinstance(server, str):
                found |= text_secrets(server)
        for entry in _entries(doc, "users"):
            user = entry.get("user")
            if not isinstance(user, dict):
                continue
            # every value of a user entry is its credentials' (a token, a password, key data, an auth-provider's
            # config, an exec plugin's env and args, a field the client does not know but quotes in its error):
            # all known, more blanked, never less
            found |= _leaves(user, depth=0)
            token_file = user.get("tokenFile")
            if isinstance(token_file, str) and token_file:  # the client reads it unbounded: checked first
                try:
                    where = os.path.join(os.path.dirname(os.path.abspath(one)), token_file)  # as the client: beside
                    found.add(bounded.read_bytes(where, 1 << 20,  # the kubeconfig, no ~ expansion
                                                 follow_symlinks=True).decode("utf-8", "replace").strip())
                except FileNotFoundError:
                    pass
                except (OSError, InputError) as exc:
                    raise InputError(f"kubeconfig {one}: its tokenFile {token_file!r}: "
                                     f"{exc.strerror if isinstance(exc, OSError) else exc}") from None
    return found


# A kubeconfig larger than this is refused before the client loads it (its secrets could not all be read first).
MAX_KUBECONFIG_BYTES = 64 << 20


def _entries(doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """A kubeconfig's ``clusters`` or ``users`` list, its entries that are mappings (any other shape: none)."""
    value = doc.get(key)
    return [e for e in value if isinstance(e, dict)] if isinstance(value, list) else []


def _leaves(value: Any, *, depth: int) -> set[str]:
    """Every text (``!!binary`` as text) under ``value`` but mapping keys, at most 16 levels down."""
    if depth > 16:
        return set()
    if isinstance(value, dict):
        return {t for v in value.values() for t in _leaves(v, depth=depth + 1)}
    if isinstance(value, list):
        return {t for v in value for t in _leaves(v, depth=depth + 1)}
    if isinstance(value, (str, bytes, int, float)) and not isinstance(value, bool):
        text = _text(value)
        return {text, text.split("=", 1)[1]} if text.startswith("-") and "=" in text else {text}
    return set()


def _text(value: Any) -> str:
    """A kubeconfig value as the exec plugin or the client sees it (``!!binary``: its bytes as text)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _from_kubeconfig(path: str, context: str | None) -> tuple[Any, str | None]:
    """A configuration from the kubeconfig at ``path`` (``os.pathsep``-joined files) and its context's namespace.

    Its secrets are remembered first (:func:`components.redaction.remember_secrets`): every printed line, log
    record and traceback of this process blanks them, whatever the client or an exec plugin says."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    from components.redaction import remember_secrets

    remember_secrets(kubeconfig_secrets(path))

    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg, persist_config=False)
        contexts, active = config.list_kube_config_contexts(config_file=path)
    except ConfigException as exc:
        raise InputError(f"kubeconfig {path}: {one_line(exc, secrets_of(cfg))}") from None
    except Exception as exc:  # noqa: BLE001 - YAML errors quote the file, which may hold credentials: the type only
        raise InputError(f"kubeconfig {path}: not a usable kubeconfig ({type(exc).__name__})") from None
    if context:
        active = next((c for c in contexts if c.get("name") == context), active)
    return cfg, ((active or {}).get("context") or {}).get("namespace")


def _in_cluster(service_account_dir: Path) -> Any:
    from kubernetes import client
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    cfg = client.Configuration()
    try:
        InClusterConfigLoader(token_filename=str(service_account_dir / "token"),
                              cert_filename=str(service_account_dir / "ca.crt")).load_and_set(cfg)
    except (ConfigException, OSError) as exc:
        raise InputError(f"in-cluster Kubernetes config: {one_line(exc)}") from None
    return cfg


def configuration(*, host: str | None = None, token: str | None = None, token_file: str | None = None,
                  kubeconfig: str | None = None, context: str | None = None, ca_cert: str | None = None,
                  insecure_skip_tls_verify: bool = False,
                  service_account_dir: str | os.PathLike[str] = SERVICE_ACCOUNT_DIR,
                  otherwise: str = "") -> tuple[Any, str | None]:
    """A ``kubernetes.client.Configuration`` by the precedence above, and the namespace its kubeconfig context names.

    ``otherwise``: what else the caller takes, named in the error when nothing is configured (the
    pod watcher: a host and token), so that one line says every way out.
    """
    namespace = None
    if host:
        cfg = from_host(host, token, token_file)
    elif kubeconfig or context or os.environ.get("KUBECONFIG"):
        path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())
        if kubeconfig and not Path(kubeconfig).expanduser().is_file():
            raise InputError(f"--kubeconfig {kubeconfig}: no such file")
        if not any(Path(p).expanduser().is_file() for p in path.split(os.pathsep) if p):
            raise InputError("no Kubernetes cluster configured: not in a pod (KUBERNETES_SERVICE_HOST unset) and no "
                             f"kubeconfig at {path} (set KUBECONFIG)")
        cfg, namespace = _from_kubeconfig(path, context)
    elif os.environ.get(IN_CLUSTER_ENV):
        cfg = _in_cluster(Path(service_account_dir))
    elif (default := Path("~/.kube/config").expanduser()).is_file():
        cfg, namespace = _from_kubeconfig(str(default), None)
    else:
        raise InputError("no Kubernetes cluster configured: not in a pod (KUBERNETES_SERVICE_HOST unset) and no "
                         f"kubeconfig (pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config{otherwise})")
    _tls(cfg, ca_cert, insecure_skip_tls_verify)
    return cfg, namespace


def api_client(**options: Any) -> Any:
    """A ``kubernetes.client.ApiClient`` by the precedence above (keywords as :func:`configuration` takes them)."""
    from kubernetes import client

    cfg, _ = configuration(**options)
    return client.ApiClient(cfg)
