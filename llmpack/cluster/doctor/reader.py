"""What ``llmpack cluster doctor`` reads from a Kubernetes API: one small reader over the real ``kubernetes`` client.

Every read answers a plain dict (the object as the API server sent it), ``None`` for 404, or
raises :class:`Unanswered` with one line that never holds a token (:func:`components.servers.kube.secrets_of`).
A 403 is :class:`Forbidden`, so a check can say *you may not read it* rather than *it is missing*.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from components.doctor_facts import DoctorCheck
from components.servers import kube
from components.servers.remote import one_line

REQUEST_TIMEOUT_S = 10.0  # one read; a doctor that hangs on an unreachable API helps no one


class Unanswered(Exception):
    """A read the API server did not answer (unreachable, 5xx, or refused): one line, no token."""


class Forbidden(Unanswered):
    """403: the caller's identity may not make this read."""


class Missing(Exception):
    """404 for the resource type itself: the API (a CRD, a version) is not served."""


class ClusterReader:
    """Reads through one ``kubernetes.client.ApiClient`` (built by :func:`components.servers.kube.api_client`)."""

    Unanswered = Unanswered  # what a failed read raises: a backend's own checks catch it (components.backend)

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.api = api_client
        self.host = str(api_client.configuration.host)
        self._secrets = kube.secrets_of(api_client.configuration)
        self.core = client.CoreV1Api(api_client)
        self.rbac = client.RbacAuthorizationV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.authz = client.AuthorizationV1Api(api_client)
        self.version_api = client.VersionApi(api_client)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            response = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                if not _names_an_object(exc.body):
                    raise Missing(self._message(exc)) from None
                return None
            text = self._message(exc)
            raise (Forbidden if exc.status == 403 else Unanswered)(f"HTTP {exc.status}: {text}") from None
        except Exception as exc:  # noqa: BLE001 - unreachable, TLS, timeout: one line for the checklist
            raise Unanswered(f"{self.host}: {one_line(type(exc).__name__ + ': ' + str(exc), self._secrets)}") from None
        return json.loads(response.data or b"{}")

    def _message(self, exc: BaseException) -> str:
        """The server's message of a failed call (:func:`components.servers.kube.failure`), else its reason."""
        failed = kube.failure(exc, self.api)
        return one_line(failed.message or failed.reason, self._secrets)

    def version(self) -> str:
        """The API server's ``gitVersion``."""
        return str((self._call(self.version_api.get_code) or {}).get("gitVersion", "?"))

    def namespace(self, name: str) -> dict[str, Any] | None:
        return self._call(self.core.read_namespace, name)

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(self.core.read_namespaced_secret, name, namespace)

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(self.core.read_namespaced_config_map, name, namespace)

    def unread(self, exc: Exception, what: str, namespace: str = "") -> DoctorCheck:
        """As :func:`unread` (the contract's ``DoctorReader``: a backend's own checks call it)."""
        return unread(exc, what, namespace)

    def pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(self.core.read_namespaced_persistent_volume_claim, name, namespace)

    def service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(self.core.read_namespaced_service_account, name, namespace)

    def role(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(self.rbac.read_namespaced_role, name, namespace)

    def role_binding(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(self.rbac.read_namespaced_role_binding, name, namespace)

    def nodes(self, label_selector: str) -> list[dict[str, Any]]:
        return list((self._call(self.core.list_node, label_selector=label_selector) or {}).get("items") or [])

    def cluster_object(self, group: str, version: str, plural: str, name: str) -> dict[str, Any] | None:
        """A cluster-scoped custom object; raises :class:`Missing` when the CRD (at that version) is not served."""
        return self._call(self.custom.get_cluster_custom_object, group, version, plural, name)

    def namespaced_object(self, group: str, versions: tuple[str, ...], namespace: str, plural: str,
                          name: str) -> dict[str, Any] | None:
        """A namespaced custom object at the first served of ``versions``; :class:`Missing` when none is served."""
        for version in versions:
            try:
                return self._call(self.custom.get_namespaced_custom_object, group, version, namespace, plural, name)
            except Missing:
                continue
        raise Missing(f"{plural}.{group} is not served (at {', '.join(versions)})")

    def listed(self, group: str, version: str, namespace: str, plural: str,
               limit: int | None = None) -> list[dict[str, Any]]:
        """The objects of ``plural`` in ``namespace`` (``group`` "" for the core API); :class:`Missing` when the
        resource is not served."""
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        query = [("limit", limit)] if limit else []
        found = self._call(self.api.call_api, f"{base}/namespaces/{namespace}/{plural}", "GET", query_params=query,
                           header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
                           _return_http_data_only=True)
        return list((found or {}).get("items") or [])

    def everywhere(self, group: str, version: str, plural: str, field_selector: str = "") -> list[dict[str, Any]]:
        """The objects of ``plural`` in every namespace (or cluster-scoped ones), ``field_selector`` applied
        (``metadata.name=X``); :class:`Missing` when the resource is not served."""
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        query = [("fieldSelector", field_selector)] if field_selector else []
        found = self._call(self.api.call_api, f"{base}/{plural}", "GET", query_params=query,
                           header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
                           _return_http_data_only=True)
        return list((found or {}).get("items") or [])

    def may(self, verb: str, resource: str, group: str = "", namespace: str = "") -> bool:
        """A ``SelfSubjectAccessReview``: whether this client's identity may ``verb`` ``resource``."""
        from kubernetes.client import V1ResourceAttributes, V1SelfSubjectAccessReview, V1SelfSubjectAccessReviewSpec
        from kubernetes.client.exceptions import ApiException

        attrs = V1ResourceAttributes(verb=verb, resource=resource, group=group, namespace=namespace or None)
        body = V1SelfSubjectAccessReview(spec=V1SelfSubjectAccessReviewSpec(resource_attributes=attrs))
        try:
            review = self.authz.create_self_subject_access_review(body, _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as exc:
            raise Unanswered(f"SelfSubjectAccessReview: HTTP {exc.status}: {self._message(exc)}") from None
        except Exception as exc:  # noqa: BLE001
            raise Unanswered(f"{self.host}: {one_line(type(exc).__name__ + ': ' + str(exc), self._secrets)}") from None
        return bool(review.status and review.status.allowed)


def reader(**options: Any) -> ClusterReader:
    """A :class:`ClusterReader` by the one precedence of :mod:`components.servers.kube` (an :class:`InputError` when
    nothing is configured); one attempt per request, no retries."""
    from kubernetes import client

    cfg, _ = kube.configuration(**options)
    cfg.retries = 0
    return ClusterReader(client.ApiClient(cfg))


def _status_body(body: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(body) if body else {}
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _names_an_object(body: Any) -> bool:
    """A 404 ``Status`` naming an object (``details.name``): the object is missing, not its API."""
    return bool((_status_body(body).get("details") or {}).get("name"))


def unread(exc: Exception, what: str, namespace: str = "") -> DoctorCheck:
    """The failed check of a read that raised :class:`Unanswered`: forbidden (with the can-i line) or unanswered."""
    if isinstance(exc, Forbidden):
        scope = f" -n {shlex.quote(namespace)}" if namespace else ""
        return DoctorCheck(False, f"{what}: you may not read it ({exc})",
                           f"kubectl auth can-i get {what.split()[0].lower()}s"
                           f"{scope}  # ask your cluster admin for read access")
    return DoctorCheck(False, f"{what}: the API did not answer ({exc})", "kubectl cluster-info")
