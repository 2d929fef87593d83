"""Create a Kubeflow Trainer v2 ``TrainJob``, follow it to its end, and delete it when the run is cancelled.

The multi-node finetune step's "launcher" (the orchestrator's finetune pod) builds the TrainJob
with :class:`components.servers.trainjob.TrainJobSpec`, then calls :func:`create_and_wait`, which

1. creates it (``CustomObjectsApi.create_namespaced_custom_object``, group
   ``trainer.kubeflow.org``, version ``v1alpha1``, plural ``trainjobs``). A 409 ``AlreadyExists``
   for a TrainJob of the same name that carries our labels and runs the same image and command is
   *adopted*: an orchestrator's retry of a launcher that died (node loss, OOM-killed) follows the
   TrainJob the first attempt created instead of failing or training twice. An adopted TrainJob
   that already ``Failed`` is deleted and created anew (``replace_failed``): a retry of a failed
   step must train again, not re-read the old failure. One that is being deleted is waited out.
   A same-named TrainJob that is not ours is an :class:`InputError`; it is never touched.
2. polls ``status.conditions`` every ``poll_s`` until ``Complete`` or ``Failed`` is ``True``
   (Trainer v2.3.0 ``pkg/apis/trainer/v1alpha1/trainjob_types.go``: the condition types are
   ``Suspended``, ``Complete`` and ``Failed``; the JobSet-based runtimes copy the JobSet's
   ``Completed`` / ``Failed`` condition, reason and message (``AllJobsCompleted``,
   ``FailedJobs``...) into ``Complete`` / ``Failed``, ``activeDeadlineSeconds`` gives
   ``Failed`` with reason ``DeadlineExceeded``, Kueue's queueing shows as ``Suspended``), and
   returns a :class:`TrainJobResult`: the outcome, the condition's reason and message, and the
   created (``metadata.creationTimestamp``) / finished (the condition's ``lastTransitionTime``)
   times. A GET of the object every few seconds is one small request; a watch would need ``list``
   and ``watch`` RBAC too and a re-list after every dropped stream, for seconds saved on a job of
   hours. API outages while waiting (connection errors, 429, 5xx) are retried for
   ``api_outage_s``; a TrainJob deleted (or replaced) under us is a :class:`StepFailed`.
3. while it waits, SIGTERM and SIGINT (KFP terminate, Argo stop, ``kubectl delete`` of the pod
   or Job, Ctrl-C: all reach the launcher as SIGTERM or SIGINT) delete the TrainJob with
   ``propagationPolicy: Foreground`` and a ``uid`` precondition (only the object this launcher
   created or adopted) and raise :class:`components.errors.Interrupted` (exit 143 / 130). A signal
   that arrives during the create request is held until the request returns, so the new
   TrainJob is known and deleted; signals during that deletion are ignored. ``timeout_s``
   running out deletes it too (the GPUs it holds are released), then :class:`StepFailed`.

Why ``kubernetes.client.CustomObjectsApi`` and not the Kubeflow SDK (``kubeflow.trainer``)
    The SDK's ``TrainerClient.train`` builds its own TrainJob from its trainer types (it does not
    take an object, so :mod:`components.servers.trainjob`'s placement patches, labels and queue would have
    to be re-expressed through it), and it pulls in ``kubeflow-katib-api`` and ``pydantic`` models
    besides the ``kubeflow-trainer-api`` ones; the pack already has the ``kubernetes`` client
    (30.1.0 here, which the KFP SDK pins below 31), and ``CustomObjectsApi`` sends the dict the
    builder made as it is, with the same configuration, TLS and errors as the pack's other
    Kubernetes calls. It is also what ``tests/standins/k8s_api.py`` answers, so the whole launcher
    is tested with the real client on 127.0.0.1.

Cluster access (:func:`load_config`): the pod's service account when ``KUBERNETES_SERVICE_HOST``
is set (the token file is re-read as the kubelet rotates it, so waits of hours keep working), else a
kubeconfig (``KUBECONFIG``, else ``~/.kube/config``). The namespace: the service account's
``namespace`` file, else ``POD_NAMESPACE``, else the kubeconfig context's, else ``default``.
The launcher's service account needs, in that namespace, exactly what this module calls (a
create, GETs while it polls, a delete when cancelled; no list, no watch, no pods or events)::

    - apiGroups: ["trainer.kubeflow.org"]
      resources: ["trainjobs"]
      verbs: ["create", "get", "delete"]

:func:`launcher_rbac` writes it as manifests (a ServiceAccount ``llmpack-launcher``, a Role with
that rule and the RoleBinding between them); ``llmpack compile --nodes N`` puts them in
``trainjob/launcher-rbac.yaml``, and the MLflow Job of a gang runs as that account.

Errors are one line (:func:`api_error`): 401, 403 (naming the missing verb and resource and the
rule above), namespace not found, the CRD not installed, an admission webhook's refusal are
:class:`InputError` (exit 2); the API unreachable or answering 5xx are :class:`StepFailed` (exit 1,
worth a retry). Tokens are never in a message.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from components.dsl import is_dns1123_label
from components.errors import InputError, Interrupted, StepFailed
from components.servers import kube
from components.servers.kube import SERVICE_ACCOUNT_DIR
from components.servers.remote import REQUEST_TIMEOUT_S, is_unreachable, one_line, server_message, tls_failure
from components.servers.trainjob import API_GROUP, API_VERSION, KIND, PLURAL

GROUP = API_GROUP
VERSION = API_VERSION.split("/", 1)[1]
RESOURCE = f"{PLURAL}.{GROUP}"  # as kubectl and RBAC messages name it
COMPLETE, FAILED, SUSPENDED = "Complete", "Failed", "Suspended"
RBAC_VERBS = ("create", "get", "delete")
API_OUTAGE_S = 300.0  # how long the API may be unreachable while waiting before the launcher gives up
DELETE_TIMEOUT_S = 10.0  # the delete on the way out of a cancelled run (the pod's grace period is ~30 s)
GONE_WAIT_S = 300.0  # how long to wait for a same-named TrainJob that is being deleted
_TRANSIENT = frozenset((429, 500, 502, 503, 504))
LAUNCHER_SERVICE_ACCOUNT = "llmpack-launcher"  # the MLflow Job of a gang runs as it; its Role is launcher_rbac()'s
RBAC_FILE = "trainjob/launcher-rbac.yaml"  # where `llmpack compile --nodes N` writes launcher_rbac(), under --out

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- RBAC


def launcher_rbac(service_account: str = LAUNCHER_SERVICE_ACCOUNT) -> list[dict[str, Any]]:
    """The ServiceAccount, Role and RoleBinding a launcher needs: exactly the calls of this module.

    No namespace in them: ``kubectl apply -n NS`` puts all three in the run's namespace, and a
    RoleBinding's ServiceAccount subject without one is the binding's own namespace.
    """
    meta = {"name": service_account, "labels": {"app.kubernetes.io/name": "llmpack", "app.kubernetes.io/component": "launcher"}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": copy.deepcopy(meta)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": copy.deepcopy(meta),
         "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": list(RBAC_VERBS)}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": copy.deepcopy(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": service_account},
         "subjects": [{"kind": "ServiceAccount", "name": service_account}]},
    ]


def launcher_rbac_yaml(service_account: str = LAUNCHER_SERVICE_ACCOUNT) -> str:
    """:func:`launcher_rbac` as one multi-document YAML file, with how to apply and bind it."""
    import yaml

    head = (
        "# What the finetune launcher of a TrainJob gang may do (llmpack compile --nodes; components/servers/trainjob_launch.py):\n"
        f"# create, get and delete {RESOURCE}, nothing else. Apply it in the run's namespace:\n"
        "#   kubectl apply -n llmpack -f launcher-rbac.yaml\n"
        f"# The MLflow Job runs as ServiceAccount {service_account}. KFP and Argo pods run as their own account\n"
        "# (KFP: pipeline-runner or default-editor; Argo: the Workflow's, default unless --serviceaccount): bind it too, e.g.\n"
        f"#   kubectl -n llmpack create rolebinding {service_account}-argo --role={service_account} --serviceaccount=llmpack:default\n"
    )
    return head + yaml.safe_dump_all(launcher_rbac(service_account), sort_keys=False, default_flow_style=False)


# --------------------------------------------------------------------------- cluster access


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


def _host(api: Any) -> str:
    return str(getattr(getattr(api, "configuration", None), "host", "?"))


def api_error(exc: BaseException, api: Any, doing: str, *, namespace: str, verb: str) -> InputError | StepFailed:
    """One line for a failed call (``doing``: e.g. ``create TrainJob llmpack/ft-1``; ``verb``: its RBAC verb).

    Configuration problems (credentials, RBAC, namespace, CRD, a refused object) are
    :class:`InputError`; an unreachable or failing API server is :class:`StepFailed`.
    """
    from kubernetes.client.exceptions import ApiException

    host = _host(api)
    secrets = kube.secrets_of(getattr(api, "configuration", None))
    where = f"Kubernetes API at {host}"
    if isinstance(exc, ApiException) and exc.status:
        message = one_line(server_message(exc.body) or exc.reason or "", secrets)
        if exc.status == 401:
            return InputError(f"{where} rejected the credentials (401 Unauthorized) trying to {doing}: check the "
                              "service account token or the kubeconfig")
        if exc.status == 403 and "admission webhook" in message:
            return InputError(f"{where} refused to {doing}: {message}")
        if exc.status == 403:
            found = re.search(r'User "([^"]+)" cannot (\S+) resource "([^"]+)" in API group "([^"]*)"', message)
            who, verb, what, group = found.groups() if found else ("the service account", verb, PLURAL, GROUP)
            name = f"{what}.{group}" if group else what
            return InputError(
                f"{where}: 403 Forbidden: {who} may not {verb} {name} in namespace {namespace!r} (trying to {doing}); "
                f'grant it a Role with apiGroups ["{GROUP}"], resources ["{PLURAL}"], verbs '
                f"[{', '.join(json.dumps(v) for v in RBAC_VERBS)}]")
        if exc.status == 404 and "namespaces" in message:
            return InputError(f"{where}: namespace {namespace!r} not found (trying to {doing})")
        if exc.status == 404 and "could not find the requested resource" in message:
            return InputError(f"{where} does not serve {RESOURCE}/{VERSION} (trying to {doing}): is Kubeflow Trainer "
                              f"v2 installed? (kubectl get crd {RESOURCE})")
        if exc.status in (400, 409, 422):
            return InputError(f"{where} refused to {doing} ({exc.status} {exc.reason or ''}): {message}".replace(" )", ")"))
        return StepFailed(f"{where} answered {exc.status} {exc.reason or ''} trying to {doing}: {message}".rstrip(": "))
    if tls := tls_failure(exc, host):
        return InputError(f"Kubernetes API at {tls}")
    if isinstance(exc, ApiException):  # status 0: the client wraps urllib3's SSLError so
        return InputError(f"{where}: {one_line(exc.reason or exc, secrets)} (trying to {doing})")
    if is_unreachable(exc):
        return StepFailed(f"{where} is unreachable ({type(exc).__name__}) trying to {doing}")
    return StepFailed(f"{where}: {type(exc).__name__}: {one_line(exc, secrets)} (trying to {doing})")


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


# --------------------------------------------------------------------------- status


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 time as the API server writes it (``...Z``, fractions) as epoch seconds; None when absent."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def conditions(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``status.conditions`` by type."""
    listed = ((obj.get("status") or {}).get("conditions")) or []
    return {c["type"]: c for c in listed if isinstance(c, Mapping) and c.get("type")}


def terminal_condition(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``Failed`` or ``Complete`` condition that is True (Failed first), else None."""
    by_type = conditions(obj)
    for kind in (FAILED, COMPLETE):
        cond = by_type.get(kind)
        if cond and cond.get("status") == "True":
            return cond
    return None


@dataclass(frozen=True)
class TrainJobResult:
    """How a TrainJob ended. ``created_at`` / ``finished_at``: RFC 3339 as the API server wrote them."""

    name: str
    namespace: str
    uid: str
    outcome: str  # "Complete" or "Failed"
    reason: str
    message: str
    created_at: str | None
    finished_at: str | None
    adopted: bool = False  # it existed already (a retried launcher following its TrainJob)

    @property
    def succeeded(self) -> bool:
        return self.outcome == COMPLETE

    @property
    def exit_code(self) -> int:
        return 0 if self.succeeded else 1

    @property
    def duration_s(self) -> float | None:
        created, finished = parse_time(self.created_at), parse_time(self.finished_at)
        return None if created is None or finished is None else max(0.0, finished - created)

    def describe(self) -> str:
        why = f" ({self.reason}{': ' + self.message if self.message else ''})" if self.reason or self.message else ""
        return f"TrainJob {self.namespace}/{self.name} {self.outcome}{why}"

    def check(self) -> TrainJobResult:
        """Itself when Complete; :class:`StepFailed` with one line when Failed."""
        if not self.succeeded:
            raise StepFailed(one_line(self.describe(), limit=500))
        return self


def _result(obj: Mapping[str, Any], cond: Mapping[str, Any], adopted: bool) -> TrainJobResult:
    meta = obj.get("metadata") or {}
    return TrainJobResult(
        name=meta.get("name", ""), namespace=meta.get("namespace", ""), uid=meta.get("uid", ""),
        outcome=str(cond.get("type")), reason=str(cond.get("reason") or ""), message=one_line(cond.get("message") or "", limit=1000),
        created_at=meta.get("creationTimestamp"), finished_at=cond.get("lastTransitionTime"), adopted=adopted)


# --------------------------------------------------------------------------- cancellation


class _Cancel:
    """SIGTERM/SIGINT while waiting: delete the tracked TrainJob, then raise :class:`Interrupted`.

    Handlers are installed only from the main thread (elsewhere ``signal.signal`` refuses; a
    KeyboardInterrupt or Interrupted raised by the caller's own handler still deletes).
    """

    def __init__(self, custom: Any, namespace: str, signals: tuple[int, ...]) -> None:
        self.custom = custom
        self.namespace = namespace
        self.signals = signals
        self.name: str | None = None
        self.uid: str | None = None
        self.signum: int | None = None
        self._defer = False
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:  # a second signal while the first is handled (the delete): ignored
            return
        self.signum = signum
        if not self._defer:
            raise Interrupted(signum)

    def __enter__(self) -> _Cancel:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold a signal until the block ends (the create request: its answer names what to delete)."""
        self._defer = True
        try:
            yield
        finally:  # the signal wins over whatever the block raised (a 409 would otherwise swallow it)
            self._defer = False
            if self.signum is not None:
                raise Interrupted(self.signum)

    def track(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.name, self.uid = meta.get("name"), meta.get("uid")

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if isinstance(exc, (Interrupted, KeyboardInterrupt)) and self.name:
                if self.signum is None:  # no more signals from here on: the delete must go out
                    self.signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
                self._delete()
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous.clear()

    def _delete(self) -> None:
        try:
            gone = delete(self.name or "", self.namespace, custom=self.custom, uid=self.uid, request_timeout=DELETE_TIMEOUT_S)
        except (InputError, StepFailed) as exc:
            print(f"llmpack: TrainJob {self.namespace}/{self.name} was not deleted: {exc}; delete it with "
                  f"`kubectl delete {RESOURCE} {self.name} -n {self.namespace}`", file=sys.stderr, flush=True)
            return
        if gone:
            print(f"llmpack: run cancelled: deleted TrainJob {self.namespace}/{self.name}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the API calls


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
        if exc.status == 404 or (exc.status == 409 and uid and "Precondition failed" in (server_message(exc.body) or "")):
            return False
        raise api_error(exc, custom.api_client, f"delete TrainJob {namespace}/{name}", namespace=namespace,
                        verb="delete") from None
    except Exception as exc:  # noqa: BLE001 - network errors, one line
        raise api_error(exc, custom.api_client, f"delete TrainJob {namespace}/{name}", namespace=namespace,
                        verb="delete") from None
    return True


def _prepared(obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    if not isinstance(obj, Mapping) or obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        got = f"{obj.get('apiVersion')} {obj.get('kind')}" if isinstance(obj, Mapping) else type(obj).__name__
        raise InputError(f"expected a {API_VERSION} {KIND} object (components.servers.trainjob.TrainJobSpec.build()), got {got}")
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


def _create_or_adopt(custom: Any, body: dict[str, Any], cancel: _Cancel, *, poll_s: float,
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
            log.info("TrainJob %s/%s already failed (%s): deleting it to train again", namespace, name, cond.get("reason"))
            delete(name, namespace, custom=custom, uid=meta.get("uid"))
        while (existing := _get(custom, namespace, name, "wait for the old TrainJob to go")) is not None:
            if existing["metadata"].get("uid") != meta.get("uid"):
                break  # someone else created it again: the loop decides whether it is ours
            if time.monotonic() > gone_by:
                raise StepFailed(f"TrainJob {namespace}/{name} is being deleted and still there after {GONE_WAIT_S:.0f} s")
            time.sleep(poll_s)
    raise StepFailed(f"TrainJob {namespace}/{name}: created and deleted by someone else repeatedly; giving up")


def _get(custom: Any, namespace: str, name: str, doing: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT_S)
    except ApiException as exc:
        if exc.status == 404 and "could not find the requested resource" not in (server_message(exc.body) or ""):
            return None
        raise api_error(exc, custom.api_client, f"{doing} ({namespace}/{name})", namespace=namespace, verb="get") from None
    except Exception as exc:  # noqa: BLE001 - network errors, one line
        raise api_error(exc, custom.api_client, f"{doing} ({namespace}/{name})", namespace=namespace, verb="get") from None


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
    with _Cancel(custom, namespace, signals) as cancel:
        current, adopted = _create_or_adopt(custom, body, cancel, poll_s=poll_s, replace_failed=replace_failed)
        uid = current["metadata"].get("uid")
        seen_rv = None
        outage_since: float | None = None
        while True:
            if current is not None:
                meta = current["metadata"]
                if uid and meta.get("uid") != uid:
                    raise StepFailed(f"TrainJob {namespace}/{name} was replaced by another object (uid {meta.get('uid')}, "
                                     f"not {uid}) while waiting")
                if on_status is not None and meta.get("resourceVersion") != seen_rv:
                    on_status(copy.deepcopy(current))
                seen_rv = meta.get("resourceVersion")
                cond = terminal_condition(current)
                if cond is not None:
                    result = _result(current, cond, adopted)
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


def _read(custom: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT_S)
    except ApiException as exc:
        if exc.status == 404 and "could not find the requested resource" not in (server_message(exc.body) or ""):
            raise StepFailed(f"TrainJob {namespace}/{name} was deleted before it finished (kubectl delete, or its "
                             "namespace went away)") from None
        raise
