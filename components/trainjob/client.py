"""The launcher's Kubernetes access: its client and namespace, its TrainJob calls, and their errors as one line.

Client loading follows :mod:`components.servers.kube`'s one precedence. Errors
(:func:`api_error`): credentials, RBAC, namespace, CRD or a refused object are
:class:`InputError` (exit 2); an unreachable or failing API server is :class:`StepFailed`
(exit 1, worth a retry). Tokens are never in a message.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

from components.dsl import is_dns1123_label
from components.errors import InputError, StepFailed
from components.servers import kube
from components.servers.kube import SERVICE_ACCOUNT_DIR
from components.servers.remote import REQUEST_TIMEOUT_S, is_unreachable, one_line, server_message, tls_failure
from components.trainjob.rbac import GROUP, RBAC_VERBS, RESOURCE
from components.trainjob.spec import API_VERSION, PLURAL

VERSION = API_VERSION.split("/", 1)[1]
_TRANSIENT = frozenset((429, 500, 502, 503, 504))


class Cluster(NamedTuple):
    """A ``kubernetes.client.ApiClient`` and the namespace to work in."""

    api: Any
    namespace: str


def load_config(*, kubeconfig: str | None = None, context: str | None = None,
                service_account_dir: str | os.PathLike[str] = SERVICE_ACCOUNT_DIR) -> Cluster:
    """A client by the one precedence of :mod:`components.servers.kube`, and the namespace to work in.

    Raises :class:`InputError` (one line, never a token) when no cluster is configured.
    """
    from kubernetes import client

    cfg, context_namespace = kube.configuration(kubeconfig=kubeconfig, context=context,
                                                service_account_dir=service_account_dir)
    return Cluster(client.ApiClient(cfg), current_namespace(context_namespace, service_account_dir=service_account_dir))


def current_namespace(context_namespace: str | None = None, *,
                      service_account_dir: str | os.PathLike[str] = SERVICE_ACCOUNT_DIR) -> str:
    """The service account's namespace file, else ``POD_NAMESPACE``, else ``context_namespace``, else ``default``."""
    namespace = None
    try:
        namespace = (Path(service_account_dir) / "namespace").read_text(encoding="utf-8").strip() or None
    except OSError:
        pass
    namespace = namespace or os.environ.get("POD_NAMESPACE", "").strip() or context_namespace or "default"
    if not is_dns1123_label(namespace):
        raise InputError(f"Kubernetes namespace {namespace!r} is not a valid DNS-1123 label")
    return namespace


def api_error(exc: BaseException, api: Any, doing: str, *, namespace: str, verb: str) -> InputError | StepFailed:
    """One line for a failed call (``doing``: e.g. ``create TrainJob llmpack/ft-1``; ``verb``: its RBAC verb).

    Configuration problems (credentials, RBAC, namespace, CRD, a refused object) are
    :class:`InputError`; an unreachable or failing API server is :class:`StepFailed`.
    """
    failed = kube.failure(exc, api)
    where = f"Kubernetes API at {failed.host}"
    if failed.answered:
        message = failed.message or one_line(failed.reason)
        if failed.status == 401:
            return InputError(f"{where} rejected the credentials (401 Unauthorized) trying to {doing}: check the "
                              "service account token or the kubeconfig")
        if failed.status == 403 and "admission webhook" in message:
            return InputError(f"{where} refused to {doing}: {message}")
        if failed.status == 403:
            found = re.search(r'User "([^"]+)" cannot (\S+) resource "([^"]+)" in API group "([^"]*)"', message)
            who, verb, what, group = found.groups() if found else ("the service account", verb, PLURAL, GROUP)
            name = f"{what}.{group}" if group else what
            return InputError(
                f"{where}: 403 Forbidden: {who} may not {verb} {name} in namespace {namespace!r} (trying to {doing}); "
                f'grant it a Role with apiGroups ["{GROUP}"], resources ["{PLURAL}"], verbs '
                f"[{', '.join(json.dumps(v) for v in RBAC_VERBS)}]")
        if failed.status == 404 and "namespaces" in message:
            return InputError(f"{where}: namespace {namespace!r} not found (trying to {doing})")
        if failed.status == 404 and "could not find the requested resource" in message:
            return InputError(f"{where} does not serve {RESOURCE}/{VERSION} (trying to {doing}): is Kubeflow Trainer "
                              f"v2 installed? (kubectl get crd {RESOURCE})")
        if failed.status in (400, 409, 422):
            refused = f"{where} refused to {doing} ({failed.status} {failed.reason}): {message}"
            return InputError(refused.replace(" )", ")"))
        return StepFailed(f"{where} answered {failed.status} {failed.reason} trying to {doing}: {message}".rstrip(": "))
    if failed.tls:
        return InputError(f"Kubernetes API at {failed.tls}")
    if failed.api_exception:  # status 0: the client wraps urllib3's SSLError so
        return InputError(f"{where}: {one_line(failed.reason or failed.detail.split(': ', 1)[-1])} (trying to {doing})")
    if failed.unreachable:
        return StepFailed(f"{where} is unreachable ({type(exc).__name__}) trying to {doing}")
    return StepFailed(f"{where}: {failed.detail} (trying to {doing})")


def _reason(exc: Any) -> str:
    """A ``Status`` error body's ``reason`` (``AlreadyExists``, ``NotFound``, ``Conflict``...), else ""."""
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else exc.body
    try:
        parsed = json.loads(body) if isinstance(body, str) else None
    except ValueError:
        return ""
    return str(parsed.get("reason") or "") if isinstance(parsed, dict) else ""


def _transient(exc: BaseException) -> bool:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException) and exc.status:
        return exc.status in _TRANSIENT
    return not isinstance(exc, ApiException) and is_unreachable(exc) and tls_failure(exc, "") is None


def _custom_api(api: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api)


def delete(name: str, namespace: str, *, api: Any = None, uid: str | None = None, custom: Any = None,
           request_timeout: float = REQUEST_TIMEOUT_S) -> bool:
    """Delete a TrainJob with ``propagationPolicy: Foreground`` (its JobSet, Jobs and pods go first).

    ``uid``: only that object (a precondition; a same-named newer one is left alone). True when
    deleted, False when there was none (or, with ``uid``, only another one).
    """
    from kubernetes.client.exceptions import ApiException

    custom = custom or _custom_api(api if api is not None else load_config().api)
    options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
    if uid:
        options["preconditions"] = {"uid": uid}
    try:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, body=options,
                                               _request_timeout=request_timeout)
    except ApiException as exc:
        precondition = exc.status == 409 and uid and "Precondition failed" in (server_message(exc.body) or "")
        if exc.status == 404 or precondition:
            return False
        raise api_error(exc, custom.api_client, f"delete TrainJob {namespace}/{name}", namespace=namespace,
                        verb="delete") from None
    except Exception as exc:  # noqa: BLE001 - network errors, one line
        raise api_error(exc, custom.api_client, f"delete TrainJob {namespace}/{name}", namespace=namespace,
                        verb="delete") from None
    return True


def _get(custom: Any, namespace: str, name: str, doing: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                   _request_timeout=REQUEST_TIMEOUT_S)
    except ApiException as exc:
        if exc.status == 404 and "could not find the requested resource" not in (server_message(exc.body) or ""):
            return None
        raise api_error(exc, custom.api_client, f"{doing} ({namespace}/{name})", namespace=namespace,
                        verb="get") from None
    except Exception as exc:  # noqa: BLE001 - network errors, one line
        raise api_error(exc, custom.api_client, f"{doing} ({namespace}/{name})", namespace=namespace,
                        verb="get") from None


def _read(custom: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                   _request_timeout=REQUEST_TIMEOUT_S)
    except ApiException as exc:
        if exc.status == 404 and "could not find the requested resource" not in (server_message(exc.body) or ""):
            raise StepFailed(f"TrainJob {namespace}/{name} was deleted before it finished (kubectl delete, or its "
                             "namespace went away)") from None
        raise
