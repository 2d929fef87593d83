"""Submit the compiled Argo Workflow to an Argo Server with Hera's ``WorkflowsService``, and wait for it.

Hera has no submit command; this is it. ``llmpack cluster submit argo`` and ``llmpack compare --cluster``
come here through :mod:`llmpack.backends` (the ``cluster_module`` of its
:class:`components.backend.ClusterBackend`). What every submission shares (the parameters, ids,
``submitted_at``, cost tags, the MLflow record) is :mod:`components.servers.submission`.

:func:`submit` loads ``argo_workflows/finetune.yaml`` into Hera's models (:func:`load_workflow`),
sets the run's arguments and per-run labels and POSTs it as ``argo submit`` does;
:func:`wait_for_completion` / :func:`wait_for_workflow` poll it to an end phase. Hera's quirks are
wrapped once each (:func:`_session`). Errors are :class:`components.errors.InputError` with one line
naming what to fix (:func:`_error`). Tokens are never printed, logged, put in a summary or in an
error message.

Endpoint, token, namespace and the quirks: docs/internals/backend-internals.md, "Argo: submission to Argo Server".
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from components.backend import SubmitRequest
from components.commands import format_value
from components.errors import InputError
from components.params import TELEMETRY_PARAMS
from components.servers.remote import (
    is_unreachable,
    normalize_host,
    one_line,
    tls_failure,
    tls_verify,
)
from components.servers.submission import (
    PIPELINE_RUN_LABEL,
    RUN_GROUP_LABEL,
    check_id,
    cost_tags,
    declared_values,
    optional_tracking,
    record_fields,
    run_context,
    run_ids,
    shipped_pipeline,
    telemetry_values,
    user_parameters,
)
from components.servers.waiting import WaitOptions, poll_object, wait_options
from components.trainjob.gang import check_pinned

ORCHESTRATOR = "argo"
DEFAULT_NAMESPACE = "llmpack"
WORKFLOW_PATH = Path(__file__).with_name("finetune.yaml")
TERMINAL = {"Succeeded": "succeeded", "Failed": "failed", "Error": "error"}


def connection(host: str | None, token: str | None, namespace: str | None, env: Mapping[str, str], *,
               ca_cert: str | None = None,
               insecure_skip_tls_verify: bool = False) -> tuple[str, str | None, str, bool | str]:
    """``(server URL, token or None, namespace, TLS verify)`` from the flags, else the ``argo`` CLI's environment.

    TLS verify is requests' ``verify``: True, a CA file (``--ca-cert``) or False
    (``--insecure-skip-tls-verify``, or the argo CLI's ``ARGO_INSECURE_SKIP_VERIFY=true``).
    """
    host = host or env.get("ARGO_SERVER")
    if not host:
        raise InputError(
            "no Argo Server configured: pass --host or set ARGO_SERVER "
            "(e.g. https://localhost:2746 after `kubectl -n argo port-forward svc/argo-server 2746`)"
        )
    secure = env.get("ARGO_SECURE", "true").lower() not in ("false", "0", "no")
    env_insecure = env.get("ARGO_INSECURE_SKIP_VERIFY", "false").lower() in ("true", "1", "yes")
    verify = tls_verify(ca_cert, insecure_skip_tls_verify or (env_insecure and not ca_cert))
    host_url = normalize_host(host, default_scheme="https" if secure else "http")
    base = env.get("ARGO_BASE_HREF", "").strip("/")
    if base:
        host_url = f"{host_url}/{base}"
    if token is None:
        token = env.get("ARGO_TOKEN") or None
    ns = namespace or env.get("ARGO_NAMESPACE") or DEFAULT_NAMESPACE
    check_id(ns, "--namespace")
    return host_url, token, ns, verify


def check_connection(options: Mapping[str, Any]) -> None:
    """A server is configured and the namespace is a valid name; nothing is sent."""
    connection(options.get("host"), options.get("token"), options.get("namespace"), os.environ,
               ca_cert=options.get("ca_cert"), insecure_skip_tls_verify=bool(options.get("insecure_skip_tls_verify")))


def _session(timeout_s: float) -> Any:
    import requests

    class _TimeoutSession(requests.Session):
        """Hera's service sends no timeout; a request to a silent server must not hang forever."""

        def request(self, method: str, url: str, **kwargs: Any) -> Any:  # type: ignore[override]
            kwargs.setdefault("timeout", timeout_s)
            return super().request(method, url, **kwargs)

    return _TimeoutSession()


def _service(host_url: str, token: str | None, namespace: str, verify: bool | str, timeout_s: float) -> Any:
    from hera.workflows import WorkflowsService

    # Hera hands verify_ssl to requests as ``verify``, which takes a CA bundle path as well as a bool.
    return WorkflowsService(host=host_url, token=token, namespace=namespace, verify_ssl=verify,  # type: ignore[arg-type]
                            session=_session(timeout_s))


def _error(exc: BaseException, host: str, namespace: str, token: str | None) -> InputError:
    """Hera's (or ``requests``') exception as one line that names the fix."""
    from hera.exceptions import BadRequest, Forbidden, HeraException, NotFound, Unauthorized

    text = str(exc)
    inner = re.match(r"^Server returned status code \d+ with message: `(.*)`$", text, re.S)
    message = one_line(inner.group(1) if inner else text, (token,))
    if isinstance(exc, Unauthorized):
        return InputError(f"Argo Server at {host} rejected the credentials (401 Unauthorized): "
                          "check --token / ARGO_TOKEN")
    if isinstance(exc, Forbidden):
        return InputError(
            f"Argo Server at {host} refused access to namespace {namespace!r} (403 Forbidden): "
            "check that the token's service account may create Workflows there"
        )
    if isinstance(exc, NotFound):
        if "namespace" in message.lower():
            return InputError(f"Argo Server at {host}: namespace {namespace!r} not found")
        return InputError(f"Argo Server at {host}: not found (404): is --host the Argo Server? ({message})")
    if isinstance(exc, BadRequest):
        return InputError(f"Argo Server at {host} refused the Workflow (400): {message}")
    if isinstance(exc, HeraException):
        return InputError(f"Argo Server at {host}: {message}")
    if tls_failure(exc, host):
        return InputError(f"Argo Server at {tls_failure(exc, host)}")
    if is_unreachable(exc):
        return InputError(f"Argo Server at {host} is unreachable ({type(exc).__name__})")
    return InputError(f"Argo Server at {host}: {type(exc).__name__}: {message}")


def _compiled(path: Path) -> list[Any]:
    """The Workflow file's documents, as compiled (its GPU uses and name: the cost tags)."""
    from components import yamltext

    try:
        return list(yamltext.load_file(path, f"--workflow {path}", documents=True))
    except OSError as exc:
        raise InputError(f"--workflow {path}: cannot read ({exc.strerror})") from None


def load_workflow(path: str | os.PathLike[str] | None = None) -> Any:
    """The compiled Workflow YAML as Hera's Argo model (``hera.workflows.models.Workflow``)."""
    from hera.workflows.models import Workflow as WorkflowModel
    from pydantic import ValidationError

    from components import yamltext

    path = Path(path) if path else WORKFLOW_PATH
    try:
        doc = yamltext.load_file(path, f"--workflow {path}")
    except OSError as exc:
        raise InputError(f"--workflow {path}: cannot read ({exc.strerror})") from None
    if not isinstance(doc, dict) or doc.get("kind") != "Workflow":
        raise InputError(f"--workflow {path}: not an Argo Workflow "
                         f"(kind is {doc.get('kind') if isinstance(doc, dict) else None!r})")
    try:
        return WorkflowModel.model_validate(doc)
    except ValidationError as exc:
        raise InputError(f"--workflow {path}: not a valid Argo Workflow ({exc.error_count()} errors)") from None


def _set_arguments(wf: Any, values: Mapping[str, Any], path: str) -> None:
    params = {p.name: p for p in ((wf.spec.arguments.parameters or []) if wf.spec.arguments else [])}
    for key, value in values.items():
        if key not in params:
            raise InputError(f"--workflow {path}: the compiled Workflow has no argument {key!r}")
        params[key].value = format_value(value)


@dataclass(frozen=True, kw_only=True)
class Request(SubmitRequest):
    """An Argo Workflow from the compiled YAML: the shared fields (:class:`components.backend.SubmitRequest`)
    and this backend's own."""

    host: str | None = None
    token: str | None = field(default=None, repr=False)  # never shown
    workflow_path: str | os.PathLike[str] | None = None
    service_account: str | None = None


def submit(request: Request) -> dict[str, Any]:
    """Create the compiled Argo Workflow on an Argo Server (Hera's ``create_workflow``); returns the summary.

    Args (the fields of ``request`` besides those every submitter takes, :class:`components.backend.SubmitRequest`):
        host, token, namespace: the Argo Server, its bearer token, the Workflow's namespace (default: see above).
        workflow_path: the compiled Workflow (default: the committed ``argo_workflows/finetune.yaml``).
        service_account: ``spec.serviceAccountName`` of the Workflow.
        ca_cert, insecure_skip_tls_verify: how the server's certificate is checked (on by default).
    """
    from hera.workflows.models import WorkflowCreateRequest

    pipe = shipped_pipeline()
    path = Path(request.workflow_path) if request.workflow_path else WORKFLOW_PATH
    wf = load_workflow(path)
    declared = (wf.spec.arguments.parameters or []) if wf.spec.arguments else []
    if path.resolve() == WORKFLOW_PATH.resolve():
        values = user_parameters(pipe, request.params)
    else:  # a Workflow of the user's own pipeline (compile --pipeline): its own arguments (text)
        values = declared_values(request.params, {p.name: str for p in declared}, f"--workflow {path}")
    check_pinned(values, f"--workflow {path}", compiled={p.name: p.value for p in declared})
    host_url, secret, ns, verify = connection(request.host, request.token, request.namespace, os.environ,
                                              ca_cert=request.ca_cert,
                                              insecure_skip_tls_verify=request.insecure_skip_tls_verify)
    run_group, pipeline_run = run_ids(ORCHESTRATOR, request.run_group, request.pipeline_run)
    # a Workflow of one's own: its GPUs and name, not the shipped pipeline's
    tags = cost_tags(pipe, request.price_per_gpu_hour, request.price_file,
                     compiled=None if path.resolve() == WORKFLOW_PATH.resolve() else _compiled(path))
    uri, mc = optional_tracking(request.tracking_uri, os.environ)

    _set_arguments(wf, {**values, **dict.fromkeys(TELEMETRY_PARAMS, "")}, str(path))  # every name declared
    wf.metadata.labels = {**(wf.metadata.labels or {}), RUN_GROUP_LABEL: run_group, PIPELINE_RUN_LABEL: pipeline_run}
    if request.service_account:
        wf.spec.service_account_name = request.service_account
    service = _service(host_url, secret, ns, verify, request.timeout_s)
    try:
        ctx = run_context(ORCHESTRATOR, run_group, pipeline_run)
        arguments = {**values, **telemetry_values(ctx)}
        _set_arguments(wf, arguments, str(path))
        with warnings.catch_warnings():  # Hera serializes with pydantic's deprecated .json()
            warnings.simplefilter("ignore", DeprecationWarning)
            created = service.create_workflow(WorkflowCreateRequest(workflow=wf, namespace=ns), namespace=ns)
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise _error(exc, host_url, ns, secret) from None
    finally:
        service.close()

    name = created.metadata.name
    summary: dict[str, Any] = {
        **telemetry_values(ctx),
        "server_id": name,
        "workflow_name": name,
        "uid": created.metadata.uid,
        "namespace": ns,
        "host": host_url,
        "url": f"{host_url}/workflows/{ns}/{name}",
        "workflow": str(path),
        "parameters": {k: format_value(v) for k, v in arguments.items()},
        "tags": tags,
    }
    summary.update(record_fields(mc, uri, ctx, {**tags, "llmpack.argo.workflow": name}))
    return summary


def pod_resources_duration(status: Any) -> dict[str, int] | None:
    """Argo's own account of the Workflow's pods: ``status.nodes[].resourcesDuration`` of its Pod
    nodes summed (resource -> seconds of one unit: ``cpu`` cores, ``memory`` 100Mi, ``nvidia.com/gpu``
    GPUs; request x container run time). None when the controller recorded none."""
    total: dict[str, int] = {}
    for node in (status.nodes or {}).values():
        if node.type == "Pod":
            for resource, seconds in (node.resources_duration or {}).items():
                total[resource] = total.get(resource, 0) + int(seconds)
    return total or None


def wait_for_workflow(name: str, *, host: str | None = None, token: str | None = None, namespace: str | None = None,
                      **options: Unpack[WaitOptions]) -> dict[str, Any]:
    """Poll a Workflow until its phase is Succeeded, Failed or Error (or ``timeout_s`` passes)."""
    opts = wait_options(options)
    host_url, secret, ns, verify = connection(host, token, namespace, os.environ, ca_cert=opts["ca_cert"],
                                              insecure_skip_tls_verify=opts["insecure_skip_tls_verify"])
    service = _service(host_url, secret, ns, verify, opts["request_timeout_s"])

    def state(wf: Any) -> tuple[str | None, dict[str, Any]]:
        status = wf.status
        phase = (status.phase if status else None) or "Pending"
        details: dict[str, Any] = {"orchestrator": ORCHESTRATOR, "workflow_name": name, "namespace": ns, "state": phase}
        if status is not None and status.message:
            details["error"] = one_line(status.message, (secret,))
        if TERMINAL.get(phase) and status is not None:
            details["resources_duration"] = pod_resources_duration(status)
        return TERMINAL.get(phase), details

    try:
        return poll_object(lambda: service.get_workflow(name, namespace=ns), state,
                           lambda exc: _error(exc, host_url, ns, secret), opts)
    finally:
        service.close()


def wait_for_completion(summary: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    """:func:`wait_for_workflow` on the Workflow of a :func:`submit` summary (its host and namespace unless given)."""
    kwargs.setdefault("host", summary.get("host"))
    kwargs.setdefault("namespace", summary.get("namespace"))
    return wait_for_workflow(summary["workflow_name"], **kwargs)
