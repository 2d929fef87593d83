"""Calls on the real API server as kubectl makes them: create with strict field validation and dry run, the answer
kept whole."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Answer:
    """The API server's answer to one write: its status code, the Status message when refused, warnings."""

    status: int
    message: str
    warnings: tuple[str, ...]
    body: dict[str, Any]


def resource_path(api: Any, obj: dict[str, Any], namespace: str | None) -> str:
    """The collection path of ``obj``'s kind, found by discovery (a kind the server does not serve: KeyError)."""
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    client = DynamicClient(api)
    client.resources.invalidate_cache()
    try:
        resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    except ResourceNotFoundError as err:
        raise KeyError(f"{obj['apiVersion']} {obj['kind']} not served") from err
    return resource.path(namespace=namespace if resource.namespaced else None)


def create(api: Any, obj: dict[str, Any], *, namespace: str | None = None, dry_run: bool = True,
           validation: str = "Strict") -> Answer:
    """POST ``obj`` with server-side field validation ``validation`` (and ``dryRun=All``): the server's answer."""
    from kubernetes.client.exceptions import ApiException

    path = resource_path(api, obj, namespace)
    query = [("fieldValidation", validation), *([("dryRun", "All")] if dry_run else [])]
    try:
        response, status, headers = api.call_api(
            path, "POST", {}, query, {"Content-Type": "application/json", "Accept": "application/json"},
            body=obj, auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=False)
    except ApiException as err:
        body = json.loads(err.body or "{}")
        return Answer(status=err.status, message=body.get("message", ""), body=body,
                      warnings=tuple(_warnings(err.headers)))
    return Answer(status=status, message="", body=json.loads(response.data or b"{}"),
                  warnings=tuple(_warnings(headers)))


def _warnings(headers: Any) -> list[str]:
    """The ``Warning`` headers' texts (``299 - "text"``), as kubectl prints them."""
    raw = headers.getlist("Warning") if hasattr(headers, "getlist") else [headers.get("Warning")] if headers else []
    out = []
    for value in raw:
        if value:
            out += [part.split('"', 1)[1].rsplit('"', 1)[0] if '"' in part else part for part in value.split(", 299 ")]
    return out


def wait_until(check: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    """Poll ``check`` until it returns a truthy value (returned), failing with ``what`` after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.2)


def make_namespace(api: Any, name: str, labels: dict[str, str] | None = None) -> str:
    """Create namespace ``name`` and wait for its ``default`` ServiceAccount (the controller-manager makes it; pods
    need it)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name, "labels": labels or {}}})

    def has_default_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    wait_until(has_default_sa, timeout_s=30, what=f"ServiceAccount default in namespace {name}")
    return name
