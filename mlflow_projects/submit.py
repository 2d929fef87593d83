"""Submit the compiled MLflow project to Kubernetes as MLflow's Kubernetes backend does, and wait for it.

``llmpack cluster submit mlflow`` and ``llmpack compare --cluster`` come here through
:mod:`llmpack.backends` (the ``cluster_module`` of its :class:`components.backend.ClusterBackend`). What every
submission shares (the parameters, ids, ``submitted_at``, cost tags, the MLflow record) is
:mod:`components.servers.submission`. Not ``mlflow run --backend kubernetes``: that builds and
pushes an image with a local Docker daemon even with ``--build-image`` off (mlflow/mlflow#8118).

:func:`submit` creates the MLflow run ``main`` runs in, fills the compiled Job template as MLflow
does (:func:`build_mlflow_job`: the prebuilt image, no literal tracking URI) and creates the Job;
:func:`wait_for_completion` / :func:`wait_for_job` poll it and end the run as ``mlflow run`` does.
Errors are one :class:`components.errors.InputError` line naming what to fix (:func:`_kube_error`).
Tokens are never printed, logged, put in a summary or in an error message.

Each difference from MLflow's backend, and why: docs/internals/backend-internals.md (MLflow: submission).
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack
from urllib.parse import urlsplit

from components.backend import SubmitRequest
from components.commands import format_value
from components.errors import InputError
from components.params import TELEMETRY_PARAMS
from components.podspec import INSTANCE_LABEL, label_value
from components.record import tracking
from components.record.uniform import MLFLOW_PROJECT_PARAMS
from components.servers import kube
from components.servers.pending import pending_reason
from components.servers.remote import (
    one_line,
    tls_failure,
    tls_verify,
)
from components.servers.submission import (
    PIPELINE_RUN_LABEL,
    RUN_GROUP_LABEL,
    check_id,
    connect_tracking,
    cost_tags,
    declared_values,
    open_record,
    run_context,
    run_ids,
    shipped_pipeline,
    telemetry_values,
    user_parameters,
)
from components.servers.waiting import WaitOptions, poll_object, wait_options
from components.trainjob.gang import check_pinned
from mlflow_projects.k8s_job import own_project_image

ORCHESTRATOR = "mlflow"
PROJECT_DIR = Path(__file__).with_name("finetune-k8s")
# Where the Dockerfile puts the repository (WORKDIR /opt/llmpack; COPY mlflow_projects/ ...).
PROJECT_DIR_IN_IMAGE = "/opt/llmpack/mlflow_projects/finetune-k8s"
# What the Job takes from Secret llmpack-mlflow by reference and never as a literal env value.
SECRET_ONLY_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                   "MLFLOW_TRACKING_TOKEN", "LLMPACK_SIGNING_KEY")


# --------------------------------------------------------------------------- the Kubernetes API


def kube_api_client(kubeconfig: str | None, context: str | None, *, ca_cert: str | None = None,
                    insecure_skip_tls_verify: bool = False) -> Any:
    """An ApiClient by the one precedence of :mod:`components.servers.kube` (``--kubeconfig``/``--context``,
    ``KUBECONFIG``, in-cluster, ``~/.kube/config``).

    TLS is the kubeconfig's (``certificate-authority``, ``insecure-skip-tls-verify``), as for
    kubectl; ``--ca-cert`` / ``--insecure-skip-tls-verify`` override it, as kubectl's flags do.
    Exec credential plugins (``users[].user.exec``: EKS, GKE, AKS, OIDC) run as kubectl runs them.
    """
    verify = tls_verify(ca_cert, insecure_skip_tls_verify)
    from kubernetes import client

    cfg, _ = kube.configuration(kubeconfig=kubeconfig, context=context)
    cfg.retries = 0  # one attempt: an unreachable API server is reported at once
    if verify is False:
        cfg.verify_ssl = False
    elif isinstance(verify, str):
        cfg.ssl_ca_cert = verify
    return client.ApiClient(cfg)


def check_connection(options: Mapping[str, Any]) -> None:
    """The kubeconfig (or the in-cluster service account) loads; nothing is sent."""
    kube_api_client(options.get("kubeconfig"), options.get("context"), ca_cert=options.get("ca_cert"),
                    insecure_skip_tls_verify=bool(options.get("insecure_skip_tls_verify"))).close()


def _kube_error(exc: BaseException, host: str, namespace: str, secrets: tuple[str | None, ...]) -> InputError:
    """The ``kubernetes`` client's exception as one line that names the fix."""
    failed = kube.failure(exc, None)
    if failed.api_exception:
        message = one_line(failed.message or failed.reason, secrets)
        if failed.status == 401:
            return InputError(f"Kubernetes API at {host} rejected the credentials (401 Unauthorized): "
                              "check the kubeconfig")
        if failed.status == 403:
            return InputError(f"Kubernetes API at {host} refused (403 Forbidden): {message}")
        if failed.status == 404 and "namespace" in message.lower():
            return InputError(f"Kubernetes API at {host}: namespace {namespace!r} not found")
        if failed.status == 409:
            return InputError(f"Kubernetes API at {host}: {message} (pass another --pipeline-run)")
        return InputError(f"Kubernetes API at {host} answered {failed.status} {failed.reason}: {message}".rstrip(": "))
    if tls := tls_failure(exc, host):
        return InputError(f"Kubernetes API at {tls}")
    if failed.unreachable:
        return InputError(f"Kubernetes API at {host} is unreachable ({type(exc).__name__})")
    return InputError(f"Kubernetes API at {host}: {type(exc).__name__}: {one_line(exc, secrets)}")


def _api_secrets(api_client: Any) -> tuple[str | None, ...]:
    cfg = api_client.configuration
    return (*(cfg.api_key or {}).values(), getattr(cfg, "password", None))


# --------------------------------------------------------------------------- the project and its Job


def _compiled(project_dir: Path) -> Any:
    """The project's ``pipeline.json`` (its GPU uses and name: the cost tags); None when it has none."""
    from components import yamltext

    found = project_dir / "pipeline.json"
    if not found.is_file():
        return None
    try:
        return yamltext.load_file(found, f"--project {project_dir}: pipeline.json")
    except OSError as exc:
        raise InputError(f"--project {project_dir}: cannot read pipeline.json ({exc.strerror})") from None


def _load_project(project_dir: Path) -> Any:
    from mlflow.exceptions import MlflowException
    from mlflow.projects._project_spec import load_project

    if not (project_dir / "MLproject").is_file():
        raise InputError(f"--project {project_dir}: no MLproject file")
    try:
        return load_project(str(project_dir))
    except (MlflowException, OSError) as exc:
        raise InputError(f"--project {project_dir}: {one_line(exc)}") from None


def _job_template(project_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The compiled Job template: the one beside ``kubernetes_config.json``, where the compiler writes it.

    ``kube-job-template-path`` in the config is relative to where ``mlflow run`` is typed
    (``mlflow_projects.compiler``); it is followed only when no template of that name lies beside the config.
    """
    import json

    from components import yamltext

    config_path = project_dir / "kubernetes_config.json"
    path = project_dir / "kubernetes_job_template.yaml"
    if config_path.is_file():
        try:
            configured = json.loads(config_path.read_text(encoding="utf-8")).get("kube-job-template-path")
        except ValueError:
            raise InputError(f"{config_path}: not valid JSON") from None
        if configured:
            beside = project_dir / Path(configured).name
            path = beside if beside.is_file() else Path(configured)
    try:
        doc = yamltext.load_file(path, str(path))
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if not isinstance(doc, dict) or doc.get("kind") != "Job":
        raise InputError(f"{path}: not a Kubernetes Job template")
    return path, doc


def _tracking_secret(path: Path, template: Mapping[str, Any]) -> str:
    """The Secret the template's container takes ``MLFLOW_TRACKING_URI`` from: the Job's only tracking URI."""
    try:
        env = template["spec"]["template"]["spec"]["containers"][0].get("env") or []
    except (KeyError, IndexError, TypeError, AttributeError):
        env = []
    for entry in env:
        if isinstance(entry, dict) and entry.get("name") == "MLFLOW_TRACKING_URI":
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef") or {}
            if ref.get("name") and ref.get("key"):
                return f"{ref['name']} (key {ref['key']})"
    raise InputError(f"{path}: the container takes no MLFLOW_TRACKING_URI from a Secret (env valueFrom.secretKeyRef), "
                     "and this path never writes the URI into the Job: recompile with `llmpack compile`")


def _cluster_tracking_uri(explicit: str | None, local_uri: str, secret: str) -> tuple[str | None, str | None]:
    """How the cluster reaches the tracking store (for the summary only), and a warning when the record is out of
    its reach.

    The Job's URI always comes from the Secret; a record made in a local store (sqlite, a file)
    cannot be the run the Job's ``main`` continues.
    """
    parts = urlsplit(local_uri)
    declared = explicit or os.environ.get("KUBE_MLFLOW_TRACKING_URI") or None
    if parts.scheme in ("http", "https", "databricks"):
        return declared or (None if parts.username or parts.password else local_uri), None
    return declared, (
        f"tracking URI {local_uri} is not a server the cluster can reach: the Job takes its tracking URI from "
        f"Secret {secret} and looks for its MLflow run there; submit with --tracking-uri set to that server "
        "(KUBE_MLFLOW_TRACKING_URI / --cluster-tracking-uri only say how the cluster reaches it)"
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
    """The Job MLflow's Kubernetes backend would create, from the compiled template (a copy).

    ``env`` may not carry the tracking URI or credentials (:data:`SECRET_ONLY_ENV`): in a Job they
    are literal values anyone who may read Jobs reads; the template takes them from the Secret.
    """
    literal = sorted(set(env) & set(SECRET_ONLY_ENV))
    if literal:
        raise ValueError(f"build_mlflow_job: {', '.join(literal)} only by reference to the Secret, never as a literal")
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


def _entry_point_argv(entry: Any, parameters: Mapping[str, str]) -> list[str]:
    """The entry point's command as MLflow computes it, split into argv (the container's ``command``)."""
    import shlex

    from mlflow.exceptions import MlflowException

    try:
        command = entry.compute_command(dict(parameters), None)
    except MlflowException as exc:
        raise InputError(f"MLflow entry point main: {one_line(exc)}") from None
    return shlex.split(command)


# --------------------------------------------------------------------------- submit and wait


@dataclass(frozen=True, kw_only=True)
class Request(SubmitRequest):
    """An MLflow run and the Kubernetes Job that runs the project's ``main``: the shared fields
    (:class:`components.backend.SubmitRequest`) and this backend's own."""

    project_dir: str | os.PathLike[str] | None = None
    image: str | None = None
    project_dir_in_image: str | None = None  # None: PROJECT_DIR_IN_IMAGE
    kubeconfig: str | None = None
    context: str | None = None
    cluster_tracking_uri: str | None = None


def submit(request: Request) -> dict[str, Any]:
    """Create the MLflow run and the Kubernetes Job that runs the project's ``main`` in it.

    Args (the fields of ``request`` besides those every submitter takes, :class:`components.backend.SubmitRequest`;
    ``pipeline_run`` names the Job):
        project_dir: the compiled project (default: the committed ``mlflow_projects/finetune-k8s``).
        image: the prebuilt step image (default: the project's ``docker_env`` image).
        project_dir_in_image: the Job's ``workingDir``: where the image holds the project.
        namespace: the Job's namespace (default: the template's, else ``default``).
        kubeconfig, context: cluster access (default: ``KUBECONFIG``, ``~/.kube/config``, in-cluster).
        tracking_uri: here the record is always made: default ``MLFLOW_TRACKING_URI``, else MLflow's sqlite file.
        cluster_tracking_uri: the same store as the cluster reaches it (default ``KUBE_MLFLOW_TRACKING_URI``);
            reported as ``job_tracking_uri``, never put into the Job (its URI comes from the Secret).
    """
    from kubernetes import client as k8s

    pipe = shipped_pipeline()
    project_path = Path(request.project_dir) if request.project_dir else PROJECT_DIR
    project = _load_project(project_path)
    try:
        entry = project.get_entry_point("main")
    except Exception:  # noqa: BLE001 - MLflow raises ExecutionException
        raise InputError(f"--project {project_path}: no 'main' entry point") from None
    if project_path.resolve() == PROJECT_DIR.resolve():
        values = user_parameters(pipe, request.params)
    else:  # a project of the user's own pipeline (compile --pipeline): its main entry point's own parameters
        declared = {k: {"float": float, "int": int}.get(str(getattr(p, "type", "")), str)
                    for k, p in entry.parameters.items() if k not in (*TELEMETRY_PARAMS, *MLFLOW_PROJECT_PARAMS)}
        values = declared_values(request.params, declared, f"--project {project_path}")
    for key in [*values, *TELEMETRY_PARAMS]:
        if key not in entry.parameters:
            raise InputError(f"--project {project_path}: the main entry point has no parameter {key!r}")
    check_pinned(values, f"--project {project_path}",
                 compiled={k: getattr(p, "default", None) for k, p in entry.parameters.items()})
    template_path, template = _job_template(project_path)
    secret = _tracking_secret(template_path, template)
    image = request.image or (project.docker_env or {}).get("image")
    if not image:
        raise InputError(f"--project {project_path}: no docker_env image; pass --image")
    compiled = _compiled(project_path)
    own = project_path.resolve() != PROJECT_DIR.resolve() and (  # the shipped pipeline compiled elsewhere is not
        not isinstance(compiled, dict) or compiled.get("pipeline") != pipe.name)  # (compare --cluster, --gpu-type)
    if own and (line := own_project_image(
            str(project_path), image, request.project_dir_in_image, PROJECT_DIR_IN_IMAGE)):  # exit 2 on the default
        print(line, file=sys.stderr)
    ns = request.namespace or template.get("metadata", {}).get("namespace") or "default"
    check_id(ns, "--namespace")
    run_group, pipeline_run = run_ids(ORCHESTRATOR, request.run_group, request.pipeline_run)
    # a project of one's own: its GPUs and name (its pipeline.json), not the shipped pipeline's
    tags = cost_tags(pipe, request.price_per_gpu_hour, request.price_file,
                     compiled=None if project_path.resolve() == PROJECT_DIR.resolve() else _compiled(project_path))
    api_client = kube_api_client(request.kubeconfig, request.context, ca_cert=request.ca_cert,
                                 insecure_skip_tls_verify=request.insecure_skip_tls_verify)
    kube_host = api_client.configuration.host
    secrets = _api_secrets(api_client)

    uri = tracking.tracking_uri(request.tracking_uri)
    mc = connect_tracking(uri)
    job_uri, warning = _cluster_tracking_uri(request.cluster_tracking_uri, uri, secret)
    tracking.experiment_id(mc)  # created before the clock starts

    ctx = run_context(ORCHESTRATOR, run_group, pipeline_run)
    arguments = {**values, **telemetry_values(ctx)}
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
    run_id, experiment_id = open_record(mc, ctx, run_tags)
    command = _entry_point_argv(entry, {k: format_value(v) for k, v in arguments.items()})
    env = {"MLFLOW_RUN_ID": run_id, "MLFLOW_EXPERIMENT_ID": str(experiment_id)}  # the URI: from the Secret
    job = build_mlflow_job(
        template,
        project_name=project.name or pipe.name,
        job_name=pipeline_run,
        namespace=ns,
        image=image,
        command=command,
        working_dir=request.project_dir_in_image or PROJECT_DIR_IN_IMAGE,
        env=env,
        labels={RUN_GROUP_LABEL: run_group, PIPELINE_RUN_LABEL: pipeline_run,
                INSTANCE_LABEL: label_value(pipeline_run)},
    )
    try:
        created = k8s.BatchV1Api(api_client).create_namespaced_job(namespace=ns, body=job,
                                                                   _request_timeout=request.timeout_s)
    except Exception as exc:  # noqa: BLE001 - one line for the user
        error = _kube_error(exc, kube_host, ns, secrets)
        with contextlib.suppress(Exception):  # a submission that never reached the cluster is not a run
            mc.delete_run(run_id)
        raise error from None
    finally:
        api_client.close()

    return {
        **telemetry_values(ctx),
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


def wait_for_job(job_name: str, *, namespace: str, kubeconfig: str | None = None, context: str | None = None,
                 mlflow_run_id: str | None = None, tracking_uri: str | None = None,
                 **options: Unpack[WaitOptions]) -> dict[str, Any]:
    """Poll the Job until it is Complete or Failed; then end the MLflow run as ``mlflow run`` does."""
    from kubernetes import client as k8s

    opts = wait_options(options)
    api_client = kube_api_client(kubeconfig, context, ca_cert=opts["ca_cert"],
                                 insecure_skip_tls_verify=opts["insecure_skip_tls_verify"])
    host, secrets = api_client.configuration.host, _api_secrets(api_client)
    batch = k8s.BatchV1Api(api_client)

    def state(job: Any) -> tuple[str | None, dict[str, Any]]:
        status = job.status
        details: dict[str, Any] = {"orchestrator": ORCHESTRATOR, "job_name": job_name, "namespace": namespace,
                                   "state": "Pending" if status is None or status.start_time is None else "Running"}
        for cond in (status.conditions or []) if status else []:
            if cond.status == "True" and cond.type in ("Complete", "Failed"):
                details["state"] = cond.type
                if cond.type == "Failed":
                    details["error"] = one_line(cond.message or cond.reason or "Job failed", secrets)
                return ("succeeded" if cond.type == "Complete" else "failed"), details
        return None, details

    try:
        result = poll_object(
            lambda: batch.read_namespaced_job_status(job_name, namespace, _request_timeout=opts["request_timeout_s"]),
            state, lambda exc: _kube_error(exc, host, namespace, secrets), opts)
        if result["status"] == "timeout":  # say why it has not started (a claim missing, no node...)
            result["waiting_on"] = pending_reason(api_client, namespace, f"job-name={job_name}", secrets)
    finally:
        api_client.close()
    if mlflow_run_id and result["status"] in ("succeeded", "failed"):
        mc = tracking.client(tracking_uri)
        run = mc.get_run(mlflow_run_id)
        if run.info.status in ("RUNNING", "SCHEDULED"):
            mc.set_terminated(mlflow_run_id, "FINISHED" if result["status"] == "succeeded" else "FAILED")
        result["mlflow_run_id"] = mlflow_run_id
    return result


def wait_for_completion(summary: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    """:func:`wait_for_job` on the Job of a :func:`submit` summary.

    Its namespace, MLflow run and store, unless given.
    """
    kwargs.setdefault("namespace", summary.get("namespace"))
    kwargs.setdefault("mlflow_run_id", summary.get("mlflow_run_id"))
    kwargs.setdefault("tracking_uri", summary.get("tracking_uri"))
    return wait_for_job(summary["job_name"], **kwargs)
