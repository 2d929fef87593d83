"""Cluster submission: the compiled pipeline, sent through each orchestrator's own client.

``llmpack submit kfp|argo|mlflow`` submits the *committed compiled artifact* (or one the user
names), never a re-authored copy, with the run's parameters: the user's (``model``, ``data``,
``max_steps``, ``seed``...) and the telemetry ones (``submitted_at``, ``run_group``,
``pipeline_run``, ``orchestrator``, ``mode="cluster"``). ``submitted_at`` is ``time.time()`` taken
by this client just before the request that starts the run.

KFP (:func:`submit_kfp`)
    ``kfp.Client(host=..., existing_token=...)``, then ``create_run_from_pipeline_package`` on
    ``kfp_pipelines/finetune.yaml`` (pipeline spec and platform spec, as ``kfp run submit``
    sends them), run name = ``pipeline_run``. The experiment is resolved (get or create) first
    and passed by id, so ``submitted_at`` is not skewed by the experiment look-up. One healthz
    call with a timeout comes first: ``kfp.Client``'s own healthz retries five times, five
    seconds apart, on any error, which would turn a wrong token into a 25-second hang.
    Endpoint: ``--host``, ``KFP_HOST``, ``KF_PIPELINES_ENDPOINT``; token: ``--token``,
    ``KFP_TOKEN``, or the file named by ``KF_PIPELINES_SA_TOKEN_PATH``; ``--namespace`` is the
    Kubeflow profile namespace of a multi-user deployment (leave it out on single-user KFP).

Argo (:func:`submit_argo`)
    Hera has no submit command; this is it. ``argo_workflows/finetune.yaml`` is loaded into
    Hera's Argo models (``hera.workflows.models.Workflow``), its ``spec.arguments.parameters``
    get the run's values, two per-run labels are added to the Workflow's metadata
    (``llmpack.io/run-group``, ``llmpack.io/pipeline-run``; the step pods get them from the
    compiled pod labels), and ``WorkflowsService.create_workflow`` POSTs
    ``/api/v1/workflows/{namespace}``, as ``argo submit`` does. The rest of the Workflow is sent
    exactly as compiled. Endpoint: ``--host`` or ``ARGO_SERVER`` (``host:port`` as the ``argo``
    CLI takes it: https unless ``ARGO_SECURE=false``; ``ARGO_INSECURE_SKIP_VERIFY=true`` skips
    TLS verification); token: ``--token`` or ``ARGO_TOKEN`` (with or without ``Bearer``);
    namespace: ``--namespace``, ``ARGO_NAMESPACE``, else ``llmpack`` (where the Secret
    ``llmpack-mlflow`` lives, as for the MLflow Job).

MLflow (:func:`submit_mlflow`)
    ``mlflow run --backend kubernetes`` (``mlflow.projects.run(backend="kubernetes")``) always
    builds an image FROM ``docker_env.image`` with a local Docker daemon and pushes it to the
    config's ``repository-uri``, even with ``--build-image`` off (mlflow/mlflow#8118): no use on a
    machine without Docker or push rights, and it puts an image build and push inside the
    measured submit time. So this does what that backend does *after* the push, with the
    prebuilt step image: it creates the MLflow run that ``main`` runs in (the pipeline record,
    :func:`components.tracking.open_pipeline_run`, ``mode=cluster``, with the cost tags), fills
    the compiled ``mlflow_projects/finetune-k8s/kubernetes_job_template.yaml`` the way MLflow's
    ``_get_kubernetes_job_definition`` does (name, container name, image, the ``main`` entry
    point's command as MLflow's project loader computes it, ``MLFLOW_RUN_ID`` /
    ``MLFLOW_EXPERIMENT_ID`` / ``MLFLOW_TRACKING_URI`` appended to env), and creates the Job with
    the real ``kubernetes`` client (``BatchV1Api.create_namespaced_job``). Differences from
    MLflow's backend, on purpose: the image is the prebuilt step image (``docker_env.image``;
    the project directory is in it at :data:`PROJECT_DIR_IN_IMAGE`, see the Dockerfile), so the
    container's ``workingDir`` is set there instead of MLflow's ``/mlflow/projects/code``; the
    Job is named after ``pipeline_run`` and carries the per-run labels; the command is the
    entry point's argv (MLflow shell-quotes each token again, which corrupts values with
    spaces); ``MLFLOW_TRACKING_URI`` is appended only when the cluster can use it
    (``KUBE_MLFLOW_TRACKING_URI``, ``--cluster-tracking-uri``, or this client's URI when it is a
    server without credentials in it), otherwise the Job keeps the Secret's value and the
    summary carries a warning. ``submitted_at`` is taken before the MLflow run is created, as
    ``mlflow run`` creates its run before it submits the Job: the record is part of this path's
    submit overhead. Cluster access: ``--kubeconfig`` / ``KUBECONFIG`` / ``~/.kube/config``
    (``kubernetes.config.load_kube_config``), else the in-cluster service account.

Errors (no endpoint configured, endpoint unreachable, 401/403, namespace not found, a parameter
the compiled artifact does not declare) are :class:`components.errors.InputError` with one line
naming what to fix. Tokens are never printed, logged, put in a summary or in an error message.

Each ``submit_*`` returns a summary dict (``orchestrator``, ``mode``, ``pipeline_run``,
``run_group``, ``submitted_at``, ``server_id`` and the orchestrator's own id/name fields,
``parameters``...). :func:`wait_for_completion` polls the run, Workflow or Job until it ends or
the timeout passes, and returns its final status.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import re
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from components import cost, telemetry, tracking
from components.commands import format_value
from components.dsl import TELEMETRY_PARAMS, Pipeline
from components.errors import InputError

ORCHESTRATORS = ("kfp", "argo", "mlflow")
MODE = "cluster"
DEFAULT_TIMEOUT_S = 30.0  # one request
DEFAULT_KFP_EXPERIMENT = "llmpack"
DEFAULT_ARGO_NAMESPACE = "llmpack"
# Where the Dockerfile puts the repository (WORKDIR /opt/llmpack; COPY mlflow_projects/ ...).
PROJECT_DIR_IN_IMAGE = "/opt/llmpack/mlflow_projects/finetune-k8s"
RUN_GROUP_LABEL = "llmpack.io/run-group"
PIPELINE_RUN_LABEL = "llmpack.io/pipeline-run"

KFP_TERMINAL = {"SUCCEEDED": "succeeded", "FAILED": "failed", "SKIPPED": "skipped", "CANCELED": "canceled"}
ARGO_TERMINAL = {"Succeeded": "succeeded", "Failed": "failed", "Error": "error"}


# --------------------------------------------------------------------------- shared helpers


def _repo_file(package: str, *parts: str) -> Path:
    """A file shipped in one of the pack's packages (package data), without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)


def default_kfp_package() -> Path:
    return _repo_file("kfp_pipelines", "finetune.yaml")


def default_argo_workflow() -> Path:
    return _repo_file("argo_workflows", "finetune.yaml")


def default_mlflow_project() -> Path:
    return _repo_file("mlflow_projects", "finetune-k8s")


def _new_id(prefix: str) -> str:
    from llmpack.runs import new_id

    return new_id(prefix)


def _check_id(value: str, flag: str) -> str:
    from components.dsl import is_dns1123_label

    if not is_dns1123_label(value):
        raise InputError(f"{flag} {value!r}: must be a DNS-1123 label (lower-case letters, digits, '-'; at most 63)")
    return value


def _pipeline() -> Pipeline:
    from components.pipeline import build

    return build()


def user_parameters(pipe: Pipeline, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The user's pipeline parameters, type-checked (strings from a command line are coerced)."""
    from components.runtime import coerce

    out: dict[str, Any] = {}
    for key, value in (params or {}).items():
        if value is None:
            continue
        if key in TELEMETRY_PARAMS:
            raise InputError(f"parameter {key!r} is set by llmpack submit, not by the user")
        param = pipe.params.get(key)
        if param is None:
            raise InputError(f"parameter {key!r}: unknown pipeline parameter (known: {', '.join(pipe.params)})")
        if isinstance(value, str) and param.type is not str:
            value = coerce(value, param.type, f"parameter {key}")
        elif param.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif not isinstance(value, param.type) or (param.type is int and isinstance(value, bool)):
            raise InputError(f"parameter {key!r} is {param.type.__name__}, got {type(value).__name__} {value!r}")
        out[key] = value
    if "max_steps" in out and out["max_steps"] <= 0:
        raise InputError(f"parameter max_steps {out['max_steps']}: must be a positive number of steps")
    return out


def _telemetry(ctx: telemetry.RunContext) -> dict[str, Any]:
    return {
        "submitted_at": ctx.submitted_at,
        "run_group": ctx.run_group,
        "pipeline_run": ctx.pipeline_run,
        "orchestrator": ctx.orchestrator,
        "mode": ctx.mode,
    }


def _cost_tags(pipe: Pipeline, price_per_gpu_hour: str | None, price_file: str | None) -> dict[str, str]:
    """The cost tags of DESIGN.md for the pipeline as compiled (an unknown price is reported as unknown)."""
    from llmpack.runs import gpu_uses

    uses = gpu_uses(pipe)
    gpu_types = sorted({t.step.execution.resources.gpu_type for t in pipe.tasks.values() if t.step.execution.resources.gpus})
    if len(gpu_types) > 1:
        raise InputError(f"the pipeline mixes GPU types {gpu_types}; cost needs one")
    price = cost.resolve_price(gpu_types[0], flag=price_per_gpu_hour, price_file=price_file) if gpu_types else None
    return {**cost.cost_tags(uses, price), "llmpack.pipeline": pipe.name}


def _one_line(text: Any, secrets: tuple[str | None, ...] = (), limit: int = 300) -> str:
    """A server's message as one short line, with any secret blanked out."""
    line = " ".join(str(text).split())
    for secret in secrets:
        if secret:
            line = line.replace(secret, "***")
            bare = secret.split()[-1] if secret.split() else secret
            if len(bare) >= 6:  # "Bearer <token>": the token alone, too
                line = line.replace(bare, "***")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _server_message(body: Any) -> str:
    """The ``message`` of a gRPC-gateway / Kubernetes ``Status`` error body, else the text."""
    import json

    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return body
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or "")
    return ""


def _normalize_host(host: str, *, default_scheme: str = "https") -> str:
    host = host.strip()
    if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", host):
        host = f"{default_scheme}://{host}"
    return host.rstrip("/")


def _is_unreachable(exc: BaseException) -> bool:
    import urllib3

    if isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, OSError)):
        return True
    try:
        import requests

        return isinstance(exc, (requests.ConnectionError, requests.Timeout))
    except ImportError:  # pragma: no cover - requests comes with hera
        return False


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Client libraries print links and deprecation warnings; the CLI owns stdout."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _open_record(mc: Any, ctx: telemetry.RunContext, tags: Mapping[str, str]) -> tuple[str, str]:
    """The pipeline run's MLflow record (created with its tags); returns (run id, experiment id)."""
    run_id = tracking.open_pipeline_run(mc, ctx, dict(tags))
    return run_id, mc.get_run(run_id).info.experiment_id


def _connect_tracking(uri: str) -> Any:
    from llmpack.runs import connect_tracking

    return connect_tracking(uri)


def _poll(
    read: Callable[[], tuple[str | None, dict[str, Any]]],
    *,
    timeout_s: float,
    poll_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Call ``read`` (-> (final status or None, details)) until a final status or the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, details = read()
        if status is not None:
            return {"status": status, **details, "finished_at": time.time()}
        if time.monotonic() >= deadline:
            return {"status": "timeout", **details}
        sleep(max(0.0, min(poll_s, deadline - time.monotonic())))


# --------------------------------------------------------------------------- KFP


def _kfp_connection(host: str | None, token: str | None) -> tuple[str, str | None]:
    host = host or os.environ.get("KFP_HOST") or os.environ.get("KF_PIPELINES_ENDPOINT")
    if not host:
        raise InputError(
            "no KFP endpoint configured: pass --host or set KFP_HOST "
            "(e.g. http://localhost:8888 after `kubectl port-forward -n kubeflow svc/ml-pipeline 8888`)"
        )
    if token is None:
        token = os.environ.get("KFP_TOKEN") or None
    if token is None and os.environ.get("KF_PIPELINES_SA_TOKEN_PATH"):
        path = Path(os.environ["KF_PIPELINES_SA_TOKEN_PATH"])
        try:
            token = path.read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise InputError(f"KF_PIPELINES_SA_TOKEN_PATH {path}: cannot read ({exc.strerror})") from None
    return _normalize_host(host), token


def _kfp_error(exc: BaseException, host: str, namespace: str | None, token: str | None) -> InputError:
    import kfp_server_api

    if isinstance(exc, kfp_server_api.ApiException):
        status = exc.status or 0
        message = _one_line(_server_message(exc.body) or exc.reason or "", (token,))
        if status == 0:
            return InputError(f"KFP at {host} is unreachable ({_one_line(exc.reason, (token,))})")
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
    if _is_unreachable(exc):
        return InputError(f"KFP at {host} is unreachable ({type(exc).__name__})")
    return InputError(f"KFP at {host}: {type(exc).__name__}: {_one_line(exc, (token,))}")


def _kfp_context_namespace() -> str | None:
    """The namespace ``kfp`` keeps in ``~/.config/kfp/context.json`` (``set_user_namespace``), if any."""
    import json

    import kfp

    try:
        with open(kfp.Client._LOCAL_KFP_CONTEXT, encoding="utf-8") as fh:  # noqa: SLF001 - kfp's own file
            return json.load(fh).get("namespace") or None
    except (OSError, ValueError, AttributeError):
        return None


def _kfp_preflight(host: str, token: str | None, namespace: str | None, timeout_s: float) -> str | None:
    """One healthz call with a timeout (``kfp.Client``'s own retries 5 x 5 s on any error).

    Returns the namespace to use: ``namespace``, else on a multi-user deployment kfp's context one.
    """
    import kfp_server_api

    config = kfp_server_api.Configuration(host=host)
    config.retries = 0  # one attempt: an unreachable host is reported at once
    if token:
        config.api_key["authorization"] = token
        config.api_key_prefix["authorization"] = "Bearer"
    api_client = kfp_server_api.ApiClient(config)
    try:
        health = kfp_server_api.HealthzServiceApi(api_client).healthz_service_get_healthz(_request_timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise _kfp_error(exc, host, namespace, token) from None
    finally:
        with contextlib.suppress(Exception):
            api_client.close()
    if health.multi_user and not namespace:
        namespace = _kfp_context_namespace()
        if not namespace:
            raise InputError(f"KFP at {host} is multi-user: pass --namespace (your Kubeflow profile namespace)")
    return namespace


def _kfp_client(host: str, token: str | None, namespace: str | None) -> Any:
    import kfp

    with _quiet():
        return kfp.Client(host=host, existing_token=token, namespace=namespace or "kubeflow")


def _kfp_root_parameters(package: Path) -> dict[str, str]:
    """Root input parameters of a compiled KFP package: name -> parameterType."""
    import yaml

    try:
        with package.open(encoding="utf-8") as fh:
            spec = next(yaml.safe_load_all(fh))
    except OSError as exc:
        raise InputError(f"--package {package}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError:
        raise InputError(f"--package {package}: not a KFP pipeline YAML") from None
    try:
        params = spec["root"]["inputDefinitions"]["parameters"]
    except (KeyError, TypeError):
        raise InputError(f"--package {package}: no root.inputDefinitions.parameters (not a compiled KFP pipeline)") from None
    return {name: p.get("parameterType", "") for name, p in params.items()}


def submit_kfp(
    *,
    params: Mapping[str, Any] | None = None,
    run_group: str | None = None,
    pipeline_run: str | None = None,
    host: str | None = None,
    token: str | None = None,
    namespace: str | None = None,
    experiment: str = DEFAULT_KFP_EXPERIMENT,
    package_path: str | os.PathLike[str] | None = None,
    service_account: str | None = None,
    tracking_uri: str | None = None,
    price_per_gpu_hour: str | None = None,
    price_file: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Create a KFP run of the compiled pipeline; returns the submission summary.

    ``tracking_uri`` (or ``MLFLOW_TRACKING_URI``), when set, also creates the pipeline run's MLflow
    record with the cost tags, after the run is created (the steps find and extend it).
    """
    pipe = _pipeline()
    values = user_parameters(pipe, params)
    package = Path(package_path) if package_path else default_kfp_package()
    declared = _kfp_root_parameters(package)
    for key in [*values, *TELEMETRY_PARAMS]:
        if key not in declared:
            raise InputError(f"--package {package}: the compiled pipeline has no parameter {key!r}")
    host_url, secret = _kfp_connection(host, token)
    run_group = _check_id(run_group, "--run-group") if run_group else _new_id("rg")
    pipeline_run = _check_id(pipeline_run, "--pipeline-run") if pipeline_run else _new_id("kfp")
    tags = _cost_tags(pipe, price_per_gpu_hour, price_file)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    mc = _connect_tracking(uri) if uri else None

    namespace = _kfp_preflight(host_url, secret, namespace, timeout_s)
    try:
        client = _kfp_client(host_url, secret, namespace)
        with _quiet():
            exp = client.create_experiment(name=experiment, namespace=namespace)
        submitted_at = time.time()
        ctx = telemetry.RunContext(run_group=run_group, pipeline_run=pipeline_run, orchestrator="kfp", mode=MODE,
                                   submitted_at=submitted_at)
        arguments = {**values, **_telemetry(ctx)}
        with _quiet():
            result = client.create_run_from_pipeline_package(
                str(package),
                arguments=arguments,
                run_name=pipeline_run,
                experiment_id=exp.experiment_id,
                service_account=service_account,
            )
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise _kfp_error(exc, host_url, namespace, secret) from None

    summary: dict[str, Any] = {
        **_telemetry(ctx),
        "server_id": result.run_id,
        "run_id": result.run_id,
        "experiment": experiment,
        "experiment_id": exp.experiment_id,
        "namespace": namespace,
        "host": host_url,
        "url": f"{host_url}/#/runs/details/{result.run_id}",
        "package": str(package),
        "parameters": arguments,
        "tags": tags,
    }
    if mc is not None:
        run_id, exp_id = _open_record(mc, ctx, {**tags, "llmpack.kfp.run_id": result.run_id})
        summary.update(mlflow_run_id=run_id, mlflow_experiment_id=exp_id, tracking_uri=tracking.tracking_uri(uri))
    return summary


def wait_for_completion_kfp(
    run_id: str,
    *,
    host: str | None = None,
    token: str | None = None,
    namespace: str | None = None,
    timeout_s: float = 24 * 3600.0,
    poll_s: float = 10.0,
    request_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Poll a KFP run until it is SUCCEEDED, FAILED, SKIPPED or CANCELED (or ``timeout_s`` passes)."""
    host_url, secret = _kfp_connection(host, token)
    namespace = _kfp_preflight(host_url, secret, namespace, request_timeout_s)
    client = _kfp_client(host_url, secret, namespace)

    def read() -> tuple[str | None, dict[str, Any]]:
        try:
            run = client._run_api.run_service_get_run(run_id=run_id, _request_timeout=request_timeout_s)  # noqa: SLF001
        except Exception as exc:  # noqa: BLE001 - one line for the user
            raise _kfp_error(exc, host_url, namespace, secret) from None
        state = str(run.state or "RUNTIME_STATE_UNSPECIFIED")
        details: dict[str, Any] = {"orchestrator": "kfp", "run_id": run_id, "state": state}
        if run.error is not None:
            details["error"] = _one_line(getattr(run.error, "message", None) or run.error, (secret,))
        return KFP_TERMINAL.get(state.upper()), details

    return _poll(read, timeout_s=timeout_s, poll_s=poll_s)


# --------------------------------------------------------------------------- Argo


def _argo_connection(host: str | None, token: str | None, namespace: str | None) -> tuple[str, str | None, str, bool]:
    host = host or os.environ.get("ARGO_SERVER")
    if not host:
        raise InputError(
            "no Argo Server configured: pass --host or set ARGO_SERVER "
            "(e.g. https://localhost:2746 after `kubectl -n argo port-forward svc/argo-server 2746`)"
        )
    secure = os.environ.get("ARGO_SECURE", "true").lower() not in ("false", "0", "no")
    verify = os.environ.get("ARGO_INSECURE_SKIP_VERIFY", "false").lower() not in ("true", "1", "yes")
    host_url = _normalize_host(host, default_scheme="https" if secure else "http")
    base = os.environ.get("ARGO_BASE_HREF", "").strip("/")
    if base:
        host_url = f"{host_url}/{base}"
    if token is None:
        token = os.environ.get("ARGO_TOKEN") or None
    ns = namespace or os.environ.get("ARGO_NAMESPACE") or DEFAULT_ARGO_NAMESPACE
    _check_id(ns, "--namespace")
    return host_url, token, ns, verify


def _argo_session(timeout_s: float) -> Any:
    import requests

    class _TimeoutSession(requests.Session):
        """Hera's service sends no timeout; a request to a silent server must not hang forever."""

        def request(self, method: str, url: str, **kwargs: Any) -> Any:  # type: ignore[override]
            kwargs.setdefault("timeout", timeout_s)
            return super().request(method, url, **kwargs)

    return _TimeoutSession()


def _argo_error(exc: BaseException, host: str, namespace: str, token: str | None) -> InputError:
    from hera.exceptions import BadRequest, Forbidden, HeraException, NotFound, Unauthorized

    text = str(exc)
    inner = re.match(r"^Server returned status code \d+ with message: `(.*)`$", text, re.S)
    message = _one_line(inner.group(1) if inner else text, (token,))
    if isinstance(exc, Unauthorized):
        return InputError(f"Argo Server at {host} rejected the credentials (401 Unauthorized): check --token / ARGO_TOKEN")
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
    if _is_unreachable(exc):
        return InputError(f"Argo Server at {host} is unreachable ({type(exc).__name__})")
    return InputError(f"Argo Server at {host}: {type(exc).__name__}: {message}")


def load_argo_workflow(path: str | os.PathLike[str] | None = None) -> Any:
    """The compiled Workflow YAML as Hera's Argo model (``hera.workflows.models.Workflow``)."""
    import yaml
    from hera.workflows.models import Workflow as WorkflowModel
    from pydantic import ValidationError

    path = Path(path) if path else default_argo_workflow()
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"--workflow {path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError:
        raise InputError(f"--workflow {path}: not YAML") from None
    if not isinstance(doc, dict) or doc.get("kind") != "Workflow":
        raise InputError(f"--workflow {path}: not an Argo Workflow (kind is {doc.get('kind') if isinstance(doc, dict) else None!r})")
    try:
        return WorkflowModel.model_validate(doc)
    except ValidationError as exc:
        raise InputError(f"--workflow {path}: not a valid Argo Workflow ({exc.error_count()} errors)") from None


def _set_argo_arguments(wf: Any, values: Mapping[str, Any], path: str) -> None:
    params = {p.name: p for p in ((wf.spec.arguments.parameters or []) if wf.spec.arguments else [])}
    for key, value in values.items():
        if key not in params:
            raise InputError(f"--workflow {path}: the compiled Workflow has no argument {key!r}")
        params[key].value = format_value(value)


def submit_argo(
    *,
    params: Mapping[str, Any] | None = None,
    run_group: str | None = None,
    pipeline_run: str | None = None,
    host: str | None = None,
    token: str | None = None,
    namespace: str | None = None,
    workflow_path: str | os.PathLike[str] | None = None,
    service_account: str | None = None,
    tracking_uri: str | None = None,
    price_per_gpu_hour: str | None = None,
    price_file: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Create the compiled Argo Workflow on an Argo Server (Hera's ``create_workflow``); returns the summary."""
    from hera.workflows import WorkflowsService
    from hera.workflows.models import WorkflowCreateRequest

    pipe = _pipeline()
    values = user_parameters(pipe, params)
    path = Path(workflow_path) if workflow_path else default_argo_workflow()
    wf = load_argo_workflow(path)
    host_url, secret, ns, verify = _argo_connection(host, token, namespace)
    run_group = _check_id(run_group, "--run-group") if run_group else _new_id("rg")
    pipeline_run = _check_id(pipeline_run, "--pipeline-run") if pipeline_run else _new_id("argo")
    tags = _cost_tags(pipe, price_per_gpu_hour, price_file)
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    mc = _connect_tracking(uri) if uri else None

    _set_argo_arguments(wf, {**values, **dict.fromkeys(TELEMETRY_PARAMS, "")}, str(path))  # every name declared
    wf.metadata.labels = {**(wf.metadata.labels or {}), RUN_GROUP_LABEL: run_group, PIPELINE_RUN_LABEL: pipeline_run}
    if service_account:
        wf.spec.service_account_name = service_account
    service = WorkflowsService(host=host_url, token=secret, namespace=ns, verify_ssl=verify, session=_argo_session(timeout_s))
    try:
        submitted_at = time.time()
        ctx = telemetry.RunContext(run_group=run_group, pipeline_run=pipeline_run, orchestrator="argo", mode=MODE,
                                   submitted_at=submitted_at)
        arguments = {**values, **_telemetry(ctx)}
        _set_argo_arguments(wf, arguments, str(path))
        with warnings.catch_warnings():  # Hera serializes with pydantic's deprecated .json()
            warnings.simplefilter("ignore", DeprecationWarning)
            created = service.create_workflow(WorkflowCreateRequest(workflow=wf, namespace=ns), namespace=ns)
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise _argo_error(exc, host_url, ns, secret) from None
    finally:
        service.close()

    name = created.metadata.name
    summary: dict[str, Any] = {
        **_telemetry(ctx),
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
    if mc is not None:
        run_id, exp_id = _open_record(mc, ctx, {**tags, "llmpack.argo.workflow": name})
        summary.update(mlflow_run_id=run_id, mlflow_experiment_id=exp_id, tracking_uri=tracking.tracking_uri(uri))
    return summary


def wait_for_completion_argo(
    name: str,
    *,
    host: str | None = None,
    token: str | None = None,
    namespace: str | None = None,
    timeout_s: float = 24 * 3600.0,
    poll_s: float = 10.0,
    request_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Poll a Workflow until its phase is Succeeded, Failed or Error (or ``timeout_s`` passes)."""
    from hera.workflows import WorkflowsService

    host_url, secret, ns, verify = _argo_connection(host, token, namespace)
    service = WorkflowsService(host=host_url, token=secret, namespace=ns, verify_ssl=verify,
                               session=_argo_session(request_timeout_s))

    def read() -> tuple[str | None, dict[str, Any]]:
        try:
            wf = service.get_workflow(name, namespace=ns)
        except Exception as exc:  # noqa: BLE001 - one line for the user
            raise _argo_error(exc, host_url, ns, secret) from None
        status = wf.status
        phase = (status.phase if status else None) or "Pending"
        details: dict[str, Any] = {"orchestrator": "argo", "workflow_name": name, "namespace": ns, "state": phase}
        if status is not None and status.message:
            details["error"] = _one_line(status.message, (secret,))
        return ARGO_TERMINAL.get(phase), details

    try:
        return _poll(read, timeout_s=timeout_s, poll_s=poll_s)
    finally:
        service.close()


# --------------------------------------------------------------------------- MLflow on Kubernetes


def _kube_api_client(kubeconfig: str | None, context: str | None) -> Any:
    """An ApiClient from kubeconfig (``--kubeconfig``, ``KUBECONFIG``, ``~/.kube/config``), else in-cluster."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    if kubeconfig and not Path(kubeconfig).expanduser().is_file():
        raise InputError(f"--kubeconfig {kubeconfig}: no such file")
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg, persist_config=False)
    except (ConfigException, OSError, TypeError) as exc:
        if context or kubeconfig:
            raise InputError(f"kubeconfig: {_one_line(exc)}") from None
        try:
            config.load_incluster_config(client_configuration=cfg)
        except ConfigException:
            raise InputError(
                "no Kubernetes cluster configured: set KUBECONFIG, pass --kubeconfig, or run inside a pod"
            ) from None
    cfg.retries = 0  # one attempt: an unreachable API server is reported at once
    return client.ApiClient(cfg)


def _kube_error(exc: BaseException, host: str, namespace: str, secrets: tuple[str | None, ...]) -> InputError:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        message = _one_line(_server_message(exc.body) or exc.reason or "", secrets)
        if exc.status == 401:
            return InputError(f"Kubernetes API at {host} rejected the credentials (401 Unauthorized): check the kubeconfig")
        if exc.status == 403:
            return InputError(f"Kubernetes API at {host} refused (403 Forbidden): {message}")
        if exc.status == 404 and "namespace" in message.lower():
            return InputError(f"Kubernetes API at {host}: namespace {namespace!r} not found")
        if exc.status == 409:
            return InputError(f"Kubernetes API at {host}: {message} (pass another --pipeline-run)")
        return InputError(f"Kubernetes API at {host} answered {exc.status} {exc.reason or ''}: {message}".rstrip(": "))
    if _is_unreachable(exc):
        return InputError(f"Kubernetes API at {host} is unreachable ({type(exc).__name__})")
    return InputError(f"Kubernetes API at {host}: {type(exc).__name__}: {_one_line(exc, secrets)}")


def _api_secrets(api_client: Any) -> tuple[str | None, ...]:
    cfg = api_client.configuration
    return (*(cfg.api_key or {}).values(), getattr(cfg, "password", None))


def _load_project(project_dir: Path) -> Any:
    from mlflow.exceptions import MlflowException
    from mlflow.projects._project_spec import load_project

    if not (project_dir / "MLproject").is_file():
        raise InputError(f"--project {project_dir}: no MLproject file")
    try:
        return load_project(str(project_dir))
    except (MlflowException, OSError) as exc:
        raise InputError(f"--project {project_dir}: {_one_line(exc)}") from None


def _job_template(project_dir: Path) -> dict[str, Any]:
    import json

    import yaml

    config_path = project_dir / "kubernetes_config.json"
    name = "kubernetes_job_template.yaml"
    if config_path.is_file():
        try:
            name = json.loads(config_path.read_text(encoding="utf-8")).get("kube-job-template-path") or name
        except ValueError:
            raise InputError(f"{config_path}: not valid JSON") from None
    path = project_dir / name
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if not isinstance(doc, dict) or doc.get("kind") != "Job":
        raise InputError(f"{path}: not a Kubernetes Job template")
    return doc


def _cluster_tracking_uri(explicit: str | None, local_uri: str) -> tuple[str | None, str | None]:
    """The tracking URI to give the Job, and a warning when there is none the cluster can use."""
    if explicit:
        return explicit, None
    if os.environ.get("KUBE_MLFLOW_TRACKING_URI"):
        return os.environ["KUBE_MLFLOW_TRACKING_URI"], None
    parts = urlsplit(local_uri)
    if parts.scheme in ("http", "https", "databricks") and not parts.username and not parts.password:
        return local_uri, None
    shown = local_uri if not (parts.username or parts.password) else f"{parts.scheme}://***@{parts.hostname}"
    return None, (
        f"tracking URI {shown} is not one the cluster can use: the Job keeps the tracking-uri of Secret "
        "llmpack-mlflow, and the MLflow run it is given must exist there; set KUBE_MLFLOW_TRACKING_URI "
        "(or --cluster-tracking-uri) to the tracking server the cluster reaches and submit with --tracking-uri "
        "pointing at the same server"
    )


def build_mlflow_job(
    template: Mapping[str, Any],
    *,
    project_name: str,
    job_name: str,
    namespace: str,
    image: str,
    command: list[str],
    working_dir: str,
    env: Mapping[str, str],
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """The Job MLflow's Kubernetes backend would create, from the compiled template (a copy)."""
    job = copy.deepcopy(dict(template))
    job["metadata"] = {**job.get("metadata", {}), "name": job_name, "namespace": namespace}
    job["metadata"]["labels"] = {**job["metadata"].get("labels", {}), **labels}
    pod = job["spec"]["template"]
    pod.setdefault("metadata", {})["labels"] = {**pod["metadata"].get("labels", {}), **labels}
    container = pod["spec"]["containers"][0]
    container["name"] = project_name
    container["image"] = image
    container["command"] = list(command)
    container["workingDir"] = working_dir
    container["env"] = [*container.get("env", []), *({"name": k, "value": v} for k, v in env.items())]
    return job


def submit_mlflow(
    *,
    params: Mapping[str, Any] | None = None,
    run_group: str | None = None,
    pipeline_run: str | None = None,
    project_dir: str | os.PathLike[str] | None = None,
    image: str | None = None,
    project_dir_in_image: str = PROJECT_DIR_IN_IMAGE,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    tracking_uri: str | None = None,
    cluster_tracking_uri: str | None = None,
    price_per_gpu_hour: str | None = None,
    price_file: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Create the MLflow run and the Kubernetes Job that runs the project's ``main`` in it."""
    from kubernetes import client as k8s

    pipe = _pipeline()
    values = user_parameters(pipe, params)
    project_path = Path(project_dir) if project_dir else default_mlflow_project()
    project = _load_project(project_path)
    try:
        entry = project.get_entry_point("main")
    except Exception:  # noqa: BLE001 - MLflow raises ExecutionException
        raise InputError(f"--project {project_path}: no 'main' entry point") from None
    for key in [*values, *TELEMETRY_PARAMS]:
        if key not in entry.parameters:
            raise InputError(f"--project {project_path}: the main entry point has no parameter {key!r}")
    template = _job_template(project_path)
    image = image or (project.docker_env or {}).get("image")
    if not image:
        raise InputError(f"--project {project_path}: no docker_env image; pass --image")
    ns = namespace or template.get("metadata", {}).get("namespace") or "default"
    _check_id(ns, "--namespace")
    run_group = _check_id(run_group, "--run-group") if run_group else _new_id("rg")
    pipeline_run = _check_id(pipeline_run, "--pipeline-run") if pipeline_run else _new_id("mlflow")
    tags = _cost_tags(pipe, price_per_gpu_hour, price_file)
    api_client = _kube_api_client(kubeconfig, context)
    kube_host = api_client.configuration.host
    secrets = _api_secrets(api_client)

    uri = tracking.tracking_uri(tracking_uri)
    mc = _connect_tracking(uri)
    job_uri, warning = _cluster_tracking_uri(cluster_tracking_uri, uri)
    tracking.experiment_id(mc)  # created before the clock starts

    submitted_at = time.time()
    ctx = telemetry.RunContext(run_group=run_group, pipeline_run=pipeline_run, orchestrator="mlflow", mode=MODE,
                               submitted_at=submitted_at)
    arguments = {**values, **_telemetry(ctx)}
    run_tags = {
        **tags,
        "mlflow.source.type": "PROJECT",
        "mlflow.source.name": str(project_path),
        "mlflow.project.entryPoint": "main",
        "mlflow.project.backend": "kubernetes",
        "mlflow.project.env": "docker",
        "mlflow.docker.image.name": image,
        "llmpack.k8s.namespace": ns,
        "llmpack.k8s.job": pipeline_run,
    }
    run_id, experiment_id = _open_record(mc, ctx, run_tags)
    command = _entry_point_argv(entry, {k: format_value(v) for k, v in arguments.items()})
    env = {"MLFLOW_RUN_ID": run_id, "MLFLOW_EXPERIMENT_ID": str(experiment_id)}
    if job_uri:
        env["MLFLOW_TRACKING_URI"] = job_uri
    job = build_mlflow_job(
        template,
        project_name=project.name or pipe.name,
        job_name=pipeline_run,
        namespace=ns,
        image=image,
        command=command,
        working_dir=project_dir_in_image,
        env=env,
        labels={RUN_GROUP_LABEL: run_group, PIPELINE_RUN_LABEL: pipeline_run},
    )
    try:
        created = k8s.BatchV1Api(api_client).create_namespaced_job(namespace=ns, body=job, _request_timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - one line for the user
        error = _kube_error(exc, kube_host, ns, secrets)
        with contextlib.suppress(Exception):  # a submission that never reached the cluster is not a run
            mc.delete_run(run_id)
        raise error from None
    finally:
        api_client.close()

    summary: dict[str, Any] = {
        **_telemetry(ctx),
        "server_id": created.metadata.name,
        "job_name": created.metadata.name,
        "uid": created.metadata.uid,
        "namespace": ns,
        "host": kube_host,
        "image": image,
        "command": command,
        "mlflow_run_id": run_id,
        "mlflow_experiment_id": str(experiment_id),
        "tracking_uri": uri,
        "job_tracking_uri": job_uri,
        "project": str(project_path),
        "parameters": {k: format_value(v) for k, v in arguments.items()},
        "tags": tags,
        "warnings": [warning] if warning else [],
    }
    return summary


def _entry_point_argv(entry: Any, parameters: Mapping[str, str]) -> list[str]:
    """The entry point's command as MLflow computes it, split into argv (the container's ``command``)."""
    import shlex

    from mlflow.exceptions import MlflowException

    try:
        command = entry.compute_command(dict(parameters), None)
    except MlflowException as exc:
        raise InputError(f"MLflow entry point main: {_one_line(exc)}") from None
    return shlex.split(command)


def wait_for_completion_mlflow(
    job_name: str,
    *,
    namespace: str,
    kubeconfig: str | None = None,
    context: str | None = None,
    mlflow_run_id: str | None = None,
    tracking_uri: str | None = None,
    timeout_s: float = 24 * 3600.0,
    poll_s: float = 10.0,
    request_timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """Poll the Job until it is Complete or Failed; then end the MLflow run as ``mlflow run`` does."""
    from kubernetes import client as k8s

    api_client = _kube_api_client(kubeconfig, context)
    host, secrets = api_client.configuration.host, _api_secrets(api_client)
    batch = k8s.BatchV1Api(api_client)

    def read() -> tuple[str | None, dict[str, Any]]:
        try:
            job = batch.read_namespaced_job_status(job_name, namespace, _request_timeout=request_timeout_s)
        except Exception as exc:  # noqa: BLE001 - one line for the user
            raise _kube_error(exc, host, namespace, secrets) from None
        status = job.status
        details: dict[str, Any] = {"orchestrator": "mlflow", "job_name": job_name, "namespace": namespace,
                                   "state": "Pending" if status is None or status.start_time is None else "Running"}
        for cond in (status.conditions or []) if status else []:
            if cond.status == "True" and cond.type in ("Complete", "Failed"):
                details["state"] = cond.type
                if cond.type == "Failed":
                    details["error"] = _one_line(cond.message or cond.reason or "Job failed", secrets)
                return ("succeeded" if cond.type == "Complete" else "failed"), details
        return None, details

    try:
        result = _poll(read, timeout_s=timeout_s, poll_s=poll_s)
    finally:
        api_client.close()
    if mlflow_run_id and result["status"] in ("succeeded", "failed"):
        mc = tracking.client(tracking_uri)
        run = mc.get_run(mlflow_run_id)
        if run.info.status in ("RUNNING", "SCHEDULED"):
            mc.set_terminated(mlflow_run_id, "FINISHED" if result["status"] == "succeeded" else "FAILED")
        result["mlflow_run_id"] = mlflow_run_id
    return result


# --------------------------------------------------------------------------- one entry point


def submit(orchestrator: str, **kwargs: Any) -> dict[str, Any]:
    """``submit("kfp"|"argo"|"mlflow", **options)``: the matching ``submit_*``."""
    funcs = {"kfp": submit_kfp, "argo": submit_argo, "mlflow": submit_mlflow}
    if orchestrator not in funcs:
        raise InputError(f"orchestrator {orchestrator!r}: choose one of {', '.join(funcs)}")
    return funcs[orchestrator](**kwargs)


def wait_for_completion(summary: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Wait for a submission (a ``submit_*`` summary) to end; ``kwargs`` are the connection options.

    Returns ``{"status": "succeeded"|"failed"|"error"|"skipped"|"canceled"|"timeout", "state": <native>, ...}``.
    """
    orchestrator = summary.get("orchestrator")
    if orchestrator == "kfp":
        kwargs.setdefault("host", summary.get("host"))
        kwargs.setdefault("namespace", summary.get("namespace"))
        return wait_for_completion_kfp(summary["run_id"], **kwargs)
    if orchestrator == "argo":
        kwargs.setdefault("host", summary.get("host"))
        kwargs.setdefault("namespace", summary.get("namespace"))
        return wait_for_completion_argo(summary["workflow_name"], **kwargs)
    if orchestrator == "mlflow":
        kwargs.setdefault("namespace", summary.get("namespace"))
        kwargs.setdefault("mlflow_run_id", summary.get("mlflow_run_id"))
        kwargs.setdefault("tracking_uri", summary.get("tracking_uri"))
        return wait_for_completion_mlflow(summary["job_name"], **kwargs)
    raise InputError(f"summary orchestrator {orchestrator!r}: not a cluster submission")
