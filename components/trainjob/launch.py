"""Create a Kubeflow Trainer v2 ``TrainJob``, follow it to its end, and delete it when the run is cancelled.

The multi-node finetune step's launcher builds the TrainJob with
:class:`components.trainjob.spec.TrainJobSpec` and calls :func:`create_and_wait`: create it
(or adopt the one a retried launcher's first attempt created; a failed one is replaced), poll
its conditions until ``Complete`` or ``Failed``, and on SIGTERM/SIGINT or ``timeout_s`` delete
it. Its jobs live beside it: RBAC (:mod:`~components.trainjob.rbac`), client, calls and
errors (:mod:`~components.trainjob.client`), status
(:mod:`~components.trainjob.status`), cancellation
(:mod:`~components.trainjob.cancel`). Why the plain ``CustomObjectsApi`` and polling,
and how adoption works: docs/internals/decisions.md (the TrainJob launcher).
"""

from __future__ import annotations

import copy
import logging
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from components.dsl import is_dns1123_label
from components.errors import InputError, Interrupted, StepFailed
from components.servers.remote import REQUEST_TIMEOUT_S
from components.trainjob.cancel import Cancel
from components.trainjob.client import (
    VERSION,
    Cluster,
    _custom_api,
    _get,
    _read,
    _reason,
    _transient,
    api_error,
    current_namespace,
    delete,
    load_config,
)
from components.trainjob.rbac import (
    GROUP,
    LAUNCHER_SERVICE_ACCOUNT,
    PLURAL,
    RBAC_FILE,
    RBAC_VERBS,
    RESOURCE,
    launcher_rbac,
    launcher_rbac_yaml,
)
from components.trainjob.spec import API_VERSION, KIND
from components.trainjob.status import (
    COMPLETE,
    FAILED,
    SUSPENDED,
    TrainJobResult,
    conditions,
    parse_time,
    result_of,
    terminal_condition,
)

__all__ = [
    "COMPLETE", "FAILED", "GROUP", "LAUNCHER_SERVICE_ACCOUNT", "RBAC_FILE", "RBAC_VERBS", "RESOURCE", "SUSPENDED",
    "VERSION", "Cluster", "TrainJobResult", "api_error", "conditions", "create_and_wait", "current_namespace", "delete",
    "launcher_rbac", "launcher_rbac_yaml", "load_config", "parse_time", "terminal_condition",
]

API_OUTAGE_S = 300.0  # how long the API may be unreachable while waiting before the launcher gives up
GONE_WAIT_S = 300.0  # how long to wait for a same-named TrainJob that is being deleted

log = logging.getLogger(__name__)


def _prepared(obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    if not isinstance(obj, Mapping) or obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        got = f"{obj.get('apiVersion')} {obj.get('kind')}" if isinstance(obj, Mapping) else type(obj).__name__
        raise InputError(f"expected a {API_VERSION} {KIND} object "
                         f"(components.trainjob.spec.TrainJobSpec.build()), got {got}")
    if not isinstance(namespace, str) or not is_dns1123_label(namespace):
        raise InputError(f"Kubernetes namespace {namespace!r} is not a valid DNS-1123 label")
    body = copy.deepcopy(dict(obj))
    meta = body.setdefault("metadata", {})
    if not isinstance(meta.get("name"), str) or not meta["name"]:
        raise InputError("TrainJob: metadata.name is required")
    if meta.get("namespace") not in (None, namespace):
        raise InputError(f"TrainJob {meta['name']}: metadata.namespace {meta['namespace']!r} is not the namespace "
                         f"it is created in ({namespace!r})")
    meta["namespace"] = namespace
    body.pop("status", None)
    return body


def _ours(existing: Mapping[str, Any], body: Mapping[str, Any]) -> str | None:
    """Why ``existing`` is not the TrainJob ``body`` describes (None: it is ours, adopt it)."""
    have = (existing.get("metadata") or {}).get("labels") or {}
    for key, value in ((body.get("metadata") or {}).get("labels") or {}).items():
        if have.get(key) != value:
            return f"label {key}={have.get(key)!r}, not {value!r}"
    mine, theirs = (body.get("spec") or {}).get("trainer") or {}, (existing.get("spec") or {}).get("trainer") or {}
    for key in ("image", "command"):
        if mine.get(key) != theirs.get(key):
            return f"another trainer {key}"
    return None


def _create_or_adopt(custom: Any, body: dict[str, Any], cancel: Cancel, *, poll_s: float,
                     replace_failed: bool) -> tuple[dict[str, Any], bool]:
    from kubernetes.client.exceptions import ApiException

    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    doing = f"create TrainJob {namespace}/{name}"
    gone_by = time.monotonic() + GONE_WAIT_S
    for _ in range(5):
        try:
            with cancel.deferred():
                created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, copy.deepcopy(body),
                                                                 _request_timeout=REQUEST_TIMEOUT_S)
                cancel.track(created)
            log.info("created TrainJob %s/%s (uid %s)", namespace, name, created["metadata"].get("uid"))
            return created, False
        except ApiException as exc:
            if exc.status != 409 or _reason(exc) != "AlreadyExists":
                raise api_error(exc, custom.api_client, doing, namespace=namespace, verb="create") from None
        except (Interrupted, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - network errors, one line
            raise api_error(exc, custom.api_client, doing, namespace=namespace, verb="create") from None
        existing = _get(custom, namespace, name, "get the existing TrainJob")
        if existing is None:  # deleted between the two calls: create again
            continue
        why = _ours(existing, body)
        if why is not None:
            raise InputError(f"TrainJob {namespace}/{name} already exists and is not this run's ({why}): delete it "
                             f"(kubectl delete {RESOURCE} {name} -n {namespace}) or run under another name")
        meta = existing["metadata"]
        cond = terminal_condition(existing)
        if not meta.get("deletionTimestamp") and not (replace_failed and cond and cond.get("type") == FAILED):
            cancel.track(existing)
            log.info("adopted TrainJob %s/%s (uid %s), created %s", namespace, name, meta.get("uid"),
                     meta.get("creationTimestamp"))
            return existing, True
        if not meta.get("deletionTimestamp"):
            log.info("TrainJob %s/%s already failed (%s): deleting it to train again", namespace, name,
                     cond.get("reason"))
            delete(name, namespace, custom=custom, uid=meta.get("uid"))
        while (existing := _get(custom, namespace, name, "wait for the old TrainJob to go")) is not None:
            if existing["metadata"].get("uid") != meta.get("uid"):
                break  # someone else created it again: the loop decides whether it is ours
            if time.monotonic() > gone_by:
                raise StepFailed(f"TrainJob {namespace}/{name} is being deleted and still there after "
                                 f"{GONE_WAIT_S:.0f} s")
            time.sleep(poll_s)
    raise StepFailed(f"TrainJob {namespace}/{name}: created and deleted by someone else repeatedly; giving up")


def create_and_wait(
    obj: Mapping[str, Any],
    *,
    namespace: str,
    api: Any = None,
    poll_s: float = 2.0,
    timeout_s: float | None = None,
    on_status: Callable[[dict[str, Any]], None] | None = None,
    replace_failed: bool = True,
    handle_signals: bool = True,
    api_outage_s: float = API_OUTAGE_S,
) -> TrainJobResult:
    """Create (or adopt) the TrainJob ``obj`` in ``namespace`` and wait until it is Complete or Failed.

    ``api``: a ``kubernetes.client.ApiClient`` (default: :func:`load_config`). ``on_status`` is
    called with the TrainJob as read, once per new ``resourceVersion`` (conditions, Kueue's
    ``Suspended``...). ``timeout_s`` (None: no limit) running out deletes the TrainJob and raises
    :class:`StepFailed`. ``handle_signals``: SIGTERM/SIGINT delete it and raise
    :class:`Interrupted` (from the main thread only). A Failed TrainJob is returned, not raised:
    :meth:`TrainJobResult.check` raises it.
    """
    if poll_s <= 0 or (timeout_s is not None and timeout_s <= 0):
        raise InputError(f"poll_s {poll_s!r} and timeout_s {timeout_s!r} must be > 0")
    body = _prepared(obj, namespace)
    name = body["metadata"]["name"]
    custom = _custom_api(api if api is not None else load_config().api)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
    with Cancel(custom, namespace, signals) as cancel:
        current, adopted = _create_or_adopt(custom, body, cancel, poll_s=poll_s, replace_failed=replace_failed)
        uid = current["metadata"].get("uid")
        seen_rv = None
        outage_since: float | None = None
        while True:
            if current is not None:
                meta = current["metadata"]
                if uid and meta.get("uid") != uid:
                    raise StepFailed(f"TrainJob {namespace}/{name} was replaced by another object "
                                     f"(uid {meta.get('uid')}, not {uid}) while waiting")
                if on_status is not None and meta.get("resourceVersion") != seen_rv:
                    on_status(copy.deepcopy(current))
                seen_rv = meta.get("resourceVersion")
                cond = terminal_condition(current)
                if cond is not None:
                    result = result_of(current, cond, adopted)
                    log.info("%s", result.describe())
                    return result
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                try:
                    delete(name, namespace, custom=custom, uid=uid)
                    done = "deleted it"
                except (InputError, StepFailed) as exc:
                    done = f"and deleting it failed: {exc}"
                raise StepFailed(f"TrainJob {namespace}/{name} did not finish within {timeout_s:g} s; {done}")
            time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - now)))
            try:
                current = _read(custom, namespace, name)
                outage_since = None
            except StepFailed:
                raise
            except Exception as exc:  # noqa: BLE001 - transient API trouble is waited out
                if not _transient(exc):
                    raise api_error(exc, custom.api_client, f"read TrainJob {namespace}/{name}", namespace=namespace,
                                    verb="get") from None
                outage_since = outage_since or time.monotonic()
                if time.monotonic() - outage_since > api_outage_s:
                    error = api_error(exc, custom.api_client, f"read TrainJob {namespace}/{name}", namespace=namespace,
                                      verb="get")
                    raise StepFailed(f"{error} for {api_outage_s:g} s; the TrainJob may still be running (kubectl get "
                                     f"{RESOURCE} {name} -n {namespace})") from None
                log.warning("reading TrainJob %s/%s failed (%s): retrying", namespace, name, type(exc).__name__)
                current = None
