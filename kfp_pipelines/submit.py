"""Submit the compiled KFP pipeline to a Kubeflow Pipelines API with ``kfp.Client``, and wait for it.

``llmpack cluster submit kfp`` and ``llmpack compare --cluster`` come here through :mod:`llmpack.backends`
(the ``cluster_module`` of its :class:`components.backend.ClusterBackend`). What every submission shares (the
parameters, ids, ``submitted_at``, cost tags, the MLflow record) is :mod:`components.servers.submission`.

:func:`submit` creates the run from ``kfp_pipelines/finetune.yaml`` after one healthz call with a
timeout (:func:`_preflight`); :func:`wait_for_completion` / :func:`wait_for_run` poll it to an end state.
Errors are :class:`components.errors.InputError` with one line naming what to fix (:func:`_error`).
Tokens are never printed, logged, put in a summary or in an error message.

Endpoints, tokens, namespaces and why the preflight: docs/internals/backend-internals.md, "KFP: submission
with ``kfp.Client``".
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from components.backend import SubmitRequest
from components.errors import InputError
from components.params import TELEMETRY_PARAMS
from components.servers.remote import (
    is_unreachable,
    normalize_host,
    one_line,
    quiet,
    server_message,
    tls_failure,
    tls_verify,
)
from components.servers.submission import (
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
from components.trainjob.gang import NNODES_PARAM, check_pinned
from components.trainjob.rbac import LAUNCHER_SERVICE_ACCOUNT
from kfp_pipelines import PACKAGE_PATH

ORCHESTRATOR = "kfp"
DEFAULT_EXPERIMENT = "llmpack"
TERMINAL = {"SUCCEEDED": "succeeded", "FAILED": "failed", "SKIPPED": "skipped", "CANCELED": "canceled"}


def connection(host: str | None, token: str | None, env: Mapping[str, str]) -> tuple[str, str | None]:
    """``(API URL, token or None)`` from the flags, else the environment ``kfp`` itself reads."""
    host = host or env.get("KFP_HOST") or env.get("KF_PIPELINES_ENDPOINT")
    if not host:
        raise InputError(
            "no KFP endpoint configured: pass --host or set KFP_HOST "
            "(e.g. http://localhost:8888 after `kubectl port-forward -n kubeflow svc/ml-pipeline 8888`)"
        )
    if token is None:
        token = env.get("KFP_TOKEN") or None
    if token is None and env.get("KF_PIPELINES_SA_TOKEN_PATH"):
        path = Path(env["KF_PIPELINES_SA_TOKEN_PATH"])
        try:
            from components.bounded import read_bytes  # a FIFO or device refused, not waited on

            token = read_bytes(path, 1 << 16, follow_symlinks=True).decode("utf-8", "replace").strip() or None
        except OSError as exc:
            raise InputError(f"KF_PIPELINES_SA_TOKEN_PATH {path}: cannot read ({exc.strerror})") from None
    return normalize_host(host), token


def check_connection(options: Mapping[str, Any]) -> None:
    """An endpoint is configured (and a token file named by the environment reads); nothing is sent."""
    connection(options.get("host"), options.get("token"), os.environ)
    tls_verify(options.get("ca_cert"), bool(options.get("insecure_skip_tls_verify")))


def _error(exc: BaseException, host: str, namespace: str | None, token: str | None) -> InputError:
    """kfp's (or ``kfp_server_api``'s) exception as one line that names the fix."""
    import kfp_server_api

    if isinstance(exc, kfp_server_api.ApiException):
        status = exc.status or 0
        message = one_line(server_message(exc.body) or exc.reason or "", (token,))
        if status == 0 and tls_failure(exc, host):
            return InputError(f"KFP at {tls_failure(exc, host)}")
        if status == 0:
            return InputError(f"KFP at {host} is unreachable ({one_line(exc.reason, (token,))})")
        if status == 401:
            return InputError(f"KFP at {host} rejected the credentials (401 Unauthorized): check --token / KFP_TOKEN")
        if status == 403:
            if namespace:
                return InputError(
                    f"KFP at {host} refused namespace {namespace!r} (403 Forbidden): the namespace (Kubeflow profile) "
                    "does not exist or this token may not use it"
                )
            return InputError(f"KFP at {host} refused the request (403 Forbidden): check --token / KFP_TOKEN")
        if status == 404 and namespace and "namespace" in message.lower():
            return InputError(f"KFP at {host}: namespace {namespace!r} not found")
        if status == 404:
            return InputError(f"KFP at {host}: no KFP v2beta1 API there (404): is --host the KFP API endpoint?")
        if "single-user mode" in message:
            return InputError(f"KFP at {host} is a single-user deployment: drop --namespace ({message})")
        return InputError(f"KFP at {host} answered {status} {exc.reason or ''}: {message}".rstrip(": "))
    if tls_failure(exc, host):
        return InputError(f"KFP at {tls_failure(exc, host)}")
    if is_unreachable(exc):
        return InputError(f"KFP at {host} is unreachable ({type(exc).__name__})")
    return InputError(f"KFP at {host}: {type(exc).__name__}: {one_line(exc, (token,))}")


def _context_namespace() -> str | None:
    """The namespace ``kfp`` keeps in ``~/.config/kfp/context.json`` (``set_user_namespace``), if any."""
    import json

    import kfp

    try:
        with open(kfp.Client._LOCAL_KFP_CONTEXT, encoding="utf-8") as fh:  # noqa: SLF001 - kfp's own file
            return json.load(fh).get("namespace") or None
    except (OSError, ValueError, AttributeError):
        return None


def _preflight(host: str, token: str | None, namespace: str | None, timeout_s: float,
               verify: bool | str = True) -> str | None:
    """One healthz call with a timeout (``kfp.Client``'s own retries 5 x 5 s on any error).

    Returns the namespace to use: ``namespace``, else on a multi-user deployment kfp's context one.
    """
    import kfp_server_api

    config = kfp_server_api.Configuration(host=host)
    config.retries = 0  # one attempt: an unreachable host is reported at once
    config.verify_ssl = verify is not False
    if isinstance(verify, str):
        config.ssl_ca_cert = verify
    if token:
        config.api_key["authorization"] = token
        config.api_key_prefix["authorization"] = "Bearer"
    api_client = kfp_server_api.ApiClient(config)
    try:
        health = kfp_server_api.HealthzServiceApi(api_client).healthz_service_get_healthz(_request_timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise _error(exc, host, namespace, token) from None
    finally:
        with contextlib.suppress(Exception):
            api_client.close()
    if health.multi_user and not namespace:
        namespace = _context_namespace()
        if not namespace:
            raise InputError(f"KFP at {host} is multi-user: pass --namespace (your Kubeflow profile namespace)")
    return namespace


def _client(host: str, token: str | None, namespace: str | None, verify: bool | str = True) -> Any:
    import kfp

    with quiet():
        return kfp.Client(host=host, existing_token=token, namespace=namespace or "kubeflow",
                          ssl_ca_cert=verify if isinstance(verify, str) else None, verify_ssl=verify is not False)


def _root_parameters(package: Path) -> dict[str, str]:
    """Root input parameters of a compiled KFP package: name -> parameterType."""
    return {name: p.get("parameterType", "") for name, p in _root_inputs(package).items()}


def _launches_a_gang(inputs: Mapping[str, Mapping[str, Any]], values: Mapping[str, Any]) -> bool:
    """Whether the run's finetune is a TrainJob gang: ``nnodes`` above 1, as given or compiled (``inputs``)."""
    nodes = values.get(NNODES_PARAM, (inputs.get(NNODES_PARAM) or {}).get("defaultValue", 1))
    try:
        return int(float(nodes)) > 1
    except (TypeError, ValueError):
        return False


def _compiled(package: Path) -> list[Any]:
    """The package's documents, as compiled (its GPU uses and name: the cost tags)."""
    from components import yamltext

    try:
        return list(yamltext.load_file(package, f"--package {package}", documents=True))
    except OSError as exc:
        raise InputError(f"--package {package}: cannot read ({exc.strerror})") from None


def _root_inputs(package: Path) -> dict[str, dict[str, Any]]:
    """Root input parameters of a compiled KFP package as compiled (type, default)."""
    from components import yamltext

    try:
        spec = next(iter(yamltext.load_file(package, f"--package {package}", documents=True)), None)
    except OSError as exc:
        raise InputError(f"--package {package}: cannot read ({exc.strerror})") from None
    try:
        params = spec["root"]["inputDefinitions"]["parameters"]
    except (KeyError, TypeError):
        raise InputError(f"--package {package}: no root.inputDefinitions.parameters "
                         "(not a compiled KFP pipeline)") from None
    return {name: p if isinstance(p, dict) else {} for name, p in params.items()}


# KFP's IR parameter types, as Python's (a package's own parameters, typed as it declares them)
_PARAMETER_TYPES: dict[str, type] = {"STRING": str, "NUMBER_INTEGER": int, "NUMBER_DOUBLE": float, "BOOLEAN": bool}


@dataclass(frozen=True, kw_only=True)
class Request(SubmitRequest):
    """A KFP run of the compiled pipeline: the shared fields (:class:`components.backend.SubmitRequest`) and
    this backend's own."""

    host: str | None = None
    token: str | None = field(default=None, repr=False)  # never shown
    experiment: str = DEFAULT_EXPERIMENT
    package_path: str | os.PathLike[str] | None = None
    service_account: str | None = None


def submit(request: Request) -> dict[str, Any]:
    """Create a KFP run of the compiled pipeline; returns the submission summary.

    Args (the fields of ``request`` besides those every submitter takes, :class:`components.backend.SubmitRequest`):
        host, token: the KFP API endpoint and bearer token (default: the environment, see above).
        namespace: the Kubeflow profile namespace (multi-user KFP only).
        experiment: the KFP experiment, got or created by name.
        package_path: the compiled package (default: the committed ``kfp_pipelines/finetune.yaml``).
        service_account: the Kubernetes service account the run's pods use (default: ``llmpack-launcher``
            when finetune is a TrainJob gang, whose launcher creates the TrainJob; else KFP's).
        ca_cert, insecure_skip_tls_verify: how the server's certificate is checked (see
            :func:`components.servers.remote.tls_verify`; on by default).
    """
    pipe = shipped_pipeline()
    package = Path(request.package_path) if request.package_path else PACKAGE_PATH
    inputs = _root_inputs(package)  # read once: the declared parameters and nnodes' compiled default
    if package.resolve() == PACKAGE_PATH.resolve():
        values = user_parameters(pipe, request.params)
    else:  # a package of the user's own pipeline (compile --pipeline): its own parameters, as it declares them
        values = declared_values(request.params, {n: _PARAMETER_TYPES.get(str(p.get("parameterType")), str)
                                                  for n, p in inputs.items()}, f"--package {package}")
    check_pinned(values, f"--package {package}", compiled={n: p.get("defaultValue") for n, p in inputs.items()})
    declared = {name: p.get("parameterType", "") for name, p in inputs.items()}
    for key in [*values, *TELEMETRY_PARAMS]:
        if key not in declared:
            raise InputError(f"--package {package}: the compiled pipeline has no parameter {key!r}")
    # KFP gives a whole run one account: a gang's launcher must create the TrainJob, so its Role's account
    account = request.service_account or (LAUNCHER_SERVICE_ACCOUNT if _launches_a_gang(inputs, values) else None)
    host_url, secret = connection(request.host, request.token, os.environ)
    verify = tls_verify(request.ca_cert, request.insecure_skip_tls_verify)
    run_group, pipeline_run = run_ids(ORCHESTRATOR, request.run_group, request.pipeline_run)
    own = package.resolve() != PACKAGE_PATH.resolve()  # a package of one's own: its GPUs, not the shipped one's
    tags = cost_tags(pipe, request.price_per_gpu_hour, request.price_file,
                     compiled=_compiled(package) if own else None)
    uri, mc = optional_tracking(request.tracking_uri, os.environ)

    namespace = _preflight(host_url, secret, request.namespace, request.timeout_s, verify)
    try:
        client = _client(host_url, secret, namespace, verify)
        with quiet():
            exp = client.create_experiment(name=request.experiment, namespace=namespace)
        ctx = run_context(ORCHESTRATOR, run_group, pipeline_run)
        arguments = {**values, **telemetry_values(ctx)}
        with quiet():
            result = client.create_run_from_pipeline_package(
                str(package),
                arguments=arguments,
                run_name=pipeline_run,
                experiment_id=exp.experiment_id,
                service_account=account,
            )
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise _error(exc, host_url, namespace, secret) from None

    summary: dict[str, Any] = {
        **telemetry_values(ctx),
        "server_id": result.run_id,
        "run_id": result.run_id,
        "experiment": request.experiment,
        "experiment_id": exp.experiment_id,
        "namespace": namespace,
        "host": host_url,
        "url": f"{host_url}/#/runs/details/{result.run_id}",
        "package": str(package),
        "parameters": arguments,
        "tags": tags,
    }
    if account:
        summary["service_account"] = account
    summary.update(record_fields(mc, uri, ctx, {**tags, "llmpack.kfp.run_id": result.run_id}))
    return summary


def wait_for_run(run_id: str, *, host: str | None = None, token: str | None = None, namespace: str | None = None,
                 **options: Unpack[WaitOptions]) -> dict[str, Any]:
    """Poll a KFP run until it is SUCCEEDED, FAILED, SKIPPED or CANCELED (or ``timeout_s`` passes)."""
    opts = wait_options(options)
    host_url, secret = connection(host, token, os.environ)
    verify = tls_verify(opts["ca_cert"], opts["insecure_skip_tls_verify"])
    namespace = _preflight(host_url, secret, namespace, opts["request_timeout_s"], verify)
    client = _client(host_url, secret, namespace, verify)

    def state(run: Any) -> tuple[str | None, dict[str, Any]]:
        native = str(run.state or "RUNTIME_STATE_UNSPECIFIED")
        details: dict[str, Any] = {"orchestrator": ORCHESTRATOR, "run_id": run_id, "state": native}
        if run.error is not None:
            details["error"] = one_line(getattr(run.error, "message", None) or run.error, (secret,))
        return TERMINAL.get(native.upper()), details

    return poll_object(
        lambda: client._run_api.run_service_get_run(run_id=run_id, _request_timeout=opts["request_timeout_s"]),  # noqa: SLF001
        state, lambda exc: _error(exc, host_url, namespace, secret), opts)


def wait_for_completion(summary: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    """:func:`wait_for_run` on the run of a :func:`submit` summary (its host and namespace unless given)."""
    kwargs.setdefault("host", summary.get("host"))
    kwargs.setdefault("namespace", summary.get("namespace"))
    return wait_for_run(summary["run_id"], **kwargs)
