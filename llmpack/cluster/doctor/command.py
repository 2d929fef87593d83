"""``llmpack cluster doctor``: check, before GPU-hours are spent, that a cluster has what the artifacts need.

One line per check, ``✓`` or ``✗``; under each ``✗`` the command that fixes it. Exit 0 when every
check holds, 1 otherwise, 2 for bad input (one line). Tokens are never printed: they come from
the kubeconfig or the environment and every message from a server is scrubbed of them.

In order: the Kubernetes API answers, the namespace is the one compiled for, the GPU nodes
(labels, taints, allocatable GPUs, each compiled GPU pod's fit), then per namespace its kinds,
quotas, Secret, RBAC, Pod Security, each backend's own checks (:attr:`~components.doctor_facts.DoctorFacts.checks`),
the PVCs and Secrets the compiled pods use; with ``--nodes N`` the gang's runtime, RBAC and shared
PVC; last the servers' version calls. The checks themselves: :mod:`llmpack.cluster.doctor.checks`. Each
check and its fix: docs/first-run-on-a-cluster.md, "Check it: llmpack cluster doctor", and docs/cli.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from components import settings
from components.backend import ClusterPath
from components.doctor_facts import DoctorFlag
from components.errors import InputError
from components.redaction import redact_data
from llmpack.backends import ORCHESTRATORS
from llmpack.cluster.doctor.sequence import (  # noqa: F401  (re-exported: tests and callers import them here)
    DEFAULT_SHARED_PVC,
    namespaces_of,
    run_checks,
    tracking_secrets,
)
from llmpack.ui.options import TLS_OPTIONS, tls_connection
from llmpack.ui.terminal import command

PATHS = ORCHESTRATORS  # every cluster backend of the registry, in its order
DEFAULT_NAMESPACE = "llmpack"  # components.backend.DEFAULT_NAMESPACE: where a path's pods run unless it says
OK, FAIL, NOTE = "✓", "✗", "·"


@dataclass(frozen=True, kw_only=True)
class DoctorOptions:
    paths: tuple[str, ...]
    namespace: str
    pod_namespaces: Mapping[str, str] = field(default_factory=dict)  # a path's --NAME-namespace (its pods' own)
    gpus: int | None
    nodes: int
    gpu_type: str | None
    queue: str | None
    cache_pvc: str | None
    compiled: Path
    hosts: Mapping[str, str | None] = field(default_factory=dict)  # each path's server, from its --NAME-host
    flags: Mapping[str, str] = field(default_factory=dict)  # the backends' own doctor options (DoctorFlag), by dest
    # The submit flags' references (llmpack.compile.pod_options): PVCs, (Secret, key, env), image pull Secrets.
    pvcs: tuple[str, ...] = ()
    secrets: tuple[tuple[str, str, str], ...] = ()
    pull_secrets: tuple[str, ...] = ()
    # --checkpoint-pvc's claim: Bound, and ReadWriteMany for a gang (every node pod resumes from it).
    checkpoint_pvc: str | None = None
    tracking_secret: str | None = None  # --tracking-secret: the MLflow Secret the artifacts were compiled with
    tracking_uri: str | None = None  # --tracking-uri, else MLFLOW_TRACKING_URI: the server as seen from here
    facts: Any = None  # what the compiled artifacts ask (llmpack.cluster.doctor.compiled.Facts)
    server_versions: Mapping[str, str] = field(default_factory=dict)  # each path's server's version, where read


def settings_tracking_uri() -> str | None:
    """``MLFLOW_TRACKING_URI`` when it names a server (http/https): the one doctor reads as the default."""
    import os

    uri = os.environ.get("MLFLOW_TRACKING_URI") or ""
    return uri if uri.startswith(("http://", "https://")) else None


def parse_paths(values: tuple[str, ...]) -> tuple[str, ...]:
    """``--path`` values (repeatable, comma lists) in the registry's order; all three when none."""
    named = [p.strip() for value in values for p in value.split(",") if p.strip()]
    for name in named:
        if name not in PATHS:
            raise InputError(f"--path {name!r}: choose from {', '.join(PATHS)}")
    return tuple(p for p in PATHS if p in named) or PATHS


def check_options(opts: DoctorOptions) -> None:
    """Bad input as one line (exit 2), before anything is sent."""
    from components.dsl import is_dns1123_label

    own = tuple((f"--{path}-namespace", value) for path, value in opts.pod_namespaces.items())
    flags = tuple((flag.flag, opts.flags.get(flag.dest)) for flag in _backend_flags())
    for flag, value in (("--namespace", opts.namespace), *own, *flags,
                        ("--queue", opts.queue), ("--cache-pvc", opts.cache_pvc)):
        if value is not None and not is_dns1123_label(value):
            raise InputError(f"{flag} {value!r}: not a valid Kubernetes name (lower case, digits, '-')")
    if opts.nodes < 1:
        raise InputError(f"--nodes {opts.nodes}: must be 1 or more")
    if opts.gpus is not None and opts.gpus < 1:
        raise InputError(f"--gpus {opts.gpus}: must be 1 or more (GPUs per finetune pod)")
    if opts.queue and opts.nodes < 2:
        raise InputError("--queue: only with --nodes 2 or more (the Kueue queue of the finetune TrainJob)")
    check_endpoints(opts)


def check_endpoints(opts: DoctorOptions, env: dict[str, str] | None = None) -> None:
    """Every server URL doctor will call (each path's --NAME-host, else its backend's host variable, and
    LLMPACK_K8S_HOST): a host or port that cannot be right is one line naming it, credentials blanked
    (components.redaction), before any request."""
    import os

    from components.redaction import redact_uri
    from components.servers.remote import normalize_host
    from components.uri_checks import uri_problem
    from llmpack.backends import doctor_facts

    env = dict(os.environ) if env is None else env
    probes = {path: probe for path in opts.paths if (probe := doctor_facts(path).probe) is not None}
    named = {settings.K8S_HOST.name: env.get(settings.K8S_HOST.name),
             **{probe.host_env: env.get(probe.host_env) for probe in probes.values()},
             **{f"--{path}-host": opts.hosts.get(path) for path in probes if opts.hosts.get(path)},
             "--tracking-uri": opts.tracking_uri}
    for flag, value in named.items():
        problem = uri_problem(normalize_host(value)) if value else None
        if problem is not None:
            raise InputError(f"{flag} {redact_uri(value or '')}: {problem}")


def submit_references(model_pvc: str | None, data_pvc: str | None, hf_token_secret: str | None,
                      pull_secrets: tuple[str, ...]) -> dict[str, Any]:
    """The submit flags' references as :class:`DoctorOptions` fields, each checked as compile checks it (exit 2)."""
    from llmpack.compile.pod_options import PodOptions

    pod = PodOptions.from_flags(model_pvc=model_pvc, data_pvc=data_pvc, hf_token_secret=hf_token_secret,
                                image_pull_secrets=pull_secrets)
    return {"pvcs": tuple(c.claim for c in (pod.model_pvc, pod.data_pvc) if c),
            "secrets": ((pod.hf_token.secret, pod.hf_token.key, pod.hf_token.env),) if pod.hf_token else (),
            "pull_secrets": pod.pull_secrets}


def checkpoint_claim(value: str | None) -> str | None:
    """``--checkpoint-pvc NAME[:MOUNT]``'s claim name, checked as compile checks it (exit 2)."""
    from llmpack.compile.pod_options import CheckpointOptions

    claim = CheckpointOptions.from_flags(checkpoint_pvc=value).claim
    return None if claim is None else claim.claim


def endpoint_checks(opts: DoctorOptions, tls: dict[str, Any], versions: dict[str, str]) -> list[Any]:
    """Each selected path's server's version call (its backend's ``doctor.probe``), the version into ``versions``;
    where its host is not known, a note saying that server was not checked."""
    import os

    from components.servers.remote import tls_verify
    from llmpack.backends import doctor_facts
    from llmpack.cluster.doctor import checks as dc
    from llmpack.cluster.doctor.waits import Note

    verify = tls_verify(tls["ca_cert"], tls["insecure_skip_tls_verify"])
    probes = {path: probe for path in opts.paths if (probe := doctor_facts(path).probe) is not None}
    hosts = {path: opts.hosts.get(path) or os.environ.get(probe.host_env) for path, probe in probes.items()}
    return [dc.endpoint(path, host, os.environ.get(probes[path].token_env) or None, verify, versions) if host
            else Note(True, f"{probes[path].what} not checked (no --{path}-host, no {probes[path].host_env})")
            for path, host in hosts.items()]


def tracking_checks(opts: DoctorOptions, tls: dict[str, Any], env: Mapping[str, str] | None = None) -> list[Any]:
    """The tracking server's authenticated read (:func:`llmpack.cluster.doctor.checks.tracking_server`), when its
    URI is known; the credentials from MLflow's own variables, never printed."""
    import os

    from components.servers.remote import tls_verify
    from llmpack.cluster.doctor import checks as dc

    env = dict(os.environ) if env is None else env
    if not opts.tracking_uri:
        return []
    return [dc.tracking_server(opts.tracking_uri, username=env.get("MLFLOW_TRACKING_USERNAME"),
                               password=env.get("MLFLOW_TRACKING_PASSWORD"), token=env.get("MLFLOW_TRACKING_TOKEN"),
                               verify=tls_verify(tls["ca_cert"], tls["insecure_skip_tls_verify"]))]


def server_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Each cluster backend's server flag (its ``compare --cluster`` endpoint flag: ``--kfp-host``...), to check it."""
    from llmpack.backends import cluster_paths

    for option in reversed([o for path in cluster_paths().values() for o in path.compare_options if o.endpoint]):
        func = click.option(option.flag, option.dest, default=None, help=option.help.removeprefix("--cluster: "))(func)
    return func


def server_hosts(endpoints: Mapping[str, str | None]) -> dict[str, str | None]:
    """``--NAME-host`` values by path (the keywords :func:`server_options` gave)."""
    from llmpack.backends import cluster_paths

    return {name: endpoints.get(o.dest) for name, path in cluster_paths().items() for o in path.compare_options
            if o.endpoint}


def _own_namespace_paths() -> list[ClusterPath]:
    """The paths whose pods run in a namespace of their own choosing (a ``pod_namespace`` option: KFP's profile)."""
    from llmpack.backends import cluster_paths

    return [path for path in cluster_paths().values() if "pod_namespace" in path.namespace_options]


def pod_namespace_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--NAME-namespace`` for each path whose pods run in their own namespace, its default the backend's."""
    for path in reversed(_own_namespace_paths()):
        func = click.option(f"--{path.name}-namespace", f"{path.name}_namespace", default=path.default_namespace,
                            show_default=True,
                            help=f"Namespace {path.name} runs its pods in (multi-user: the profile's).")(func)
    return func


def pod_namespaces(per_path: Mapping[str, str | None]) -> dict[str, str]:
    """``--NAME-namespace`` values by path (the keywords :func:`pod_namespace_options` gave)."""
    return {path.name: value for path in _own_namespace_paths() if (value := per_path.get(f"{path.name}_namespace"))}


def _backend_flags() -> list[DoctorFlag]:
    """The cluster backends' own doctor options (:attr:`components.doctor_facts.DoctorFacts.flags`), in registry
    order."""
    from llmpack.backends import doctor_facts

    return [flag for name in PATHS for flag in doctor_facts(name).flags]


def backend_flag_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Each backend's own doctor option (``--argo-controller-namespace``...), its default the backend's."""
    for flag in reversed(_backend_flags()):
        func = click.option(flag.flag, flag.dest, default=flag.default, show_default=True, help=flag.help)(func)
    return func


def backend_flag_values(given: Mapping[str, str | None]) -> dict[str, str]:
    """The backends' own doctor option values by dest (the keywords :func:`backend_flag_options` gave)."""
    return {flag.dest: value for flag in _backend_flags() if (value := given.get(flag.dest)) is not None}


def render(checks: list[Any], opts: DoctorOptions, host: str) -> str:
    """The checklist: ``✓``/``✗`` per check (its fix under a ``✗``), ``·`` for what was not checked."""
    from llmpack.cluster.doctor.waits import Note

    lines = [f"llmpack cluster doctor: {', '.join(opts.paths)} on {host}"
             + (f" (gang: {opts.nodes} nodes)" if opts.nodes > 1 else "")]
    for check in checks:
        lines.append(f"{NOTE if isinstance(check, Note) else OK if check.ok else FAIL} {check.what}")
        if not check.ok and check.fix:
            lines.append(f"    fix: {check.fix}")
    counted = [c for c in checks if not isinstance(c, Note)]
    failed = sum(not c.ok for c in counted)
    lines.append(f"all {len(counted)} checks hold" if not failed else f"{failed} of {len(counted)} checks fail")
    return "\n".join(lines)


@command("doctor", short_help="Check a cluster has what a run needs; print the fixes.")
@click.option("--path", "paths", multiple=True, metavar="|".join(PATHS),
              help="Paths to check (repeatable, or a comma list; default: every cluster backend).")
@click.option("--namespace", default=None,
              help="Namespace of the runs (a path with its own --NAME-namespace aside; default: the one the "
                   f"--compiled artifacts were compiled for, else {DEFAULT_NAMESPACE}).")
@pod_namespace_options
@click.option("--kubeconfig", default=None, help="Kubeconfig (default: KUBECONFIG, in-cluster, ~/.kube/config).")
@click.option("--context", default=None, help="Kubeconfig context.")
@TLS_OPTIONS[0]
@TLS_OPTIONS[1]
@click.option("--gpus", type=int, default=None, help="GPUs per finetune pod (default: the step's spec, 1).")
@click.option("--gpu-type", "gpu_type", default=None,
              help="The GPU type compiled for (llmpack compile --gpu-type; default the spec's, H100 80GB).")
@click.option("--nodes", type=int, default=None,
              help="Nodes of finetune; 2 or more: check the TrainJob gang's needs (default: what --compiled says, "
                   "else 1).")
@click.option("--queue", default=None, metavar="NAME", help="Kueue LocalQueue of the TrainJob (with --nodes).")
@click.option("--cache-pvc", "cache_pvc", default=None, metavar="NAME",
              help="PVC the runs mount (with --nodes: ReadWriteMany, default llmpack-shared).")
@click.option("--compiled", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="What llmpack compile --out DIR wrote (default: the committed artifacts; "
                   "with --nodes: examples/multinode).")
@server_options
@backend_flag_options
@click.option("--model-pvc", default=None, metavar="NAME[:MOUNT]",
              help="The model's PVC (as llmpack compile): exists, Bound.")
@click.option("--data-pvc", default=None, metavar="NAME[:MOUNT]",
              help="The data's PVC (as llmpack compile): exists, Bound.")
@click.option("--checkpoint-pvc", default=None, metavar="NAME[:MOUNT]",
              help="finetune's checkpoint PVC (as llmpack compile): exists, Bound; with --nodes: ReadWriteMany.")
@click.option("--hf-token-secret", default=None, metavar="NAME[:KEY]", help="HF_TOKEN's Secret: it and its key exist.")
@click.option("--image-pull-secret", "image_pull_secrets", multiple=True, metavar="NAME",
              help="Image pull Secret (repeatable): exists, a registry credential.")
@click.option("--tracking-secret", default=None, metavar="NAME",
              help="The MLflow Secret the artifacts were compiled with (llmpack compile --tracking-secret; "
                   "default: the one the compiled pods read, else llmpack-mlflow).")
@click.option("--tracking-uri", default=None, metavar="URI",
              help="MLflow tracking server as reached from here (default: MLFLOW_TRACKING_URI): it must answer an "
                   "authenticated read with MLFLOW_TRACKING_USERNAME/PASSWORD (or _TOKEN), never printed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead.")
def doctor(paths: tuple[str, ...], namespace: str | None, kubeconfig: str | None, context: str | None,
           ca_cert: str | None, insecure_skip_tls_verify: bool, gpus: int | None, gpu_type: str | None,
           nodes: int | None,
           queue: str | None,
           cache_pvc: str | None, compiled: Path | None,
           as_json: bool, model_pvc: str | None, data_pvc: str | None,
           hf_token_secret: str | None, image_pull_secrets: tuple[str, ...], checkpoint_pvc: str | None,
           tracking_uri: str | None = None, tracking_secret: str | None = None, **per_path: str | None) -> None:
    """Check, before a run spends GPU-hours, that the cluster has what the compiled
    artifacts reference: namespace, RBAC, GPU nodes and taints, the MLflow Secret,
    Pod Security, Argo's artifact repository; with --nodes the Trainer runtime, the
    launcher's RBAC and the shared PVC; with --queue the LocalQueue.

    \b
    One line per check, with the command that fixes each failure. Exit 0 when
    all hold, 1 when one fails, 2 for bad input. Tokens are never printed.
      llmpack cluster doctor
      llmpack cluster doctor --path argo --namespace team-a
      llmpack cluster doctor --compiled build/2x4 --queue team-a
      llmpack cluster doctor --model-pvc models --image-pull-secret reg
      llmpack cluster doctor --nodes 2 --gpus 4 --checkpoint-pvc llmpack-ckpt
    """
    from llmpack.cluster.doctor.capacity import compiled_namespace, needs_of
    from llmpack.cluster.doctor.compiled import contradictions, read_facts
    from llmpack.cluster.doctor.pods import artifact_of, claimed_pvcs, committed_root, pod_specs, referenced_secrets
    from llmpack.cluster.doctor.reader import reader
    from llmpack.gpu_catalogue import resolve_gpu_type

    if compiled is not None and not compiled.is_dir():
        raise InputError(f"--compiled {compiled}: no such directory")
    if nodes is not None and nodes < 1:
        raise InputError(f"--nodes {nodes}: must be 1 or more")
    # the committed 2x4 gang, or the 1-node set
    root = compiled or committed_root() / ("examples/multinode" if (nodes or 1) > 1 else "")
    chosen = parse_paths(paths)
    facts = read_facts(root, tuple(artifact_of(p) for p in chosen))
    if compiled is not None:  # what the artifacts say rules; a flag saying otherwise is refused
        contradictions(facts, f"the artifacts in {compiled}", nodes=nodes, gpus=gpus, queue=queue)
    gang = facts.gang if compiled is not None or (nodes or 1) > 1 else None
    nodes = nodes or (gang.nodes if gang else 1)
    gpus = gpus if gpus is not None else (gang.gpus if gang and compiled is not None else None)
    queue = queue if queue is not None else (gang.queue if gang else None)
    namespace = namespace or compiled_namespace(root) or DEFAULT_NAMESPACE
    opts = DoctorOptions(paths=chosen, namespace=namespace, gpus=gpus,
                         gpu_type=None if gpu_type is None else resolve_gpu_type(gpu_type), nodes=nodes, queue=queue,
                         cache_pvc=cache_pvc, compiled=root,
                         hosts=server_hosts(per_path), pod_namespaces=pod_namespaces(per_path),
                         flags=backend_flag_values(per_path),
                         checkpoint_pvc=checkpoint_claim(checkpoint_pvc),
                         tracking_uri=tracking_uri or settings_tracking_uri(),
                         tracking_secret=tracking_secret, facts=facts if gang or compiled is not None else None,
                         **submit_references(model_pvc, data_pvc, hf_token_secret, image_pull_secrets))
    check_options(opts)
    specs = {path: pod_specs(opts.compiled, path, gang=nodes > 1) for path in opts.paths}  # bad files: exit 2 first
    claims = {path: claimed_pvcs(opts.compiled, path, gang=nodes > 1) for path in opts.paths}
    refs = {path: referenced_secrets(opts.compiled, path, gang=nodes > 1) for path in opts.paths}
    needs = needs_of(opts.compiled, opts.paths, gang=nodes > 1,
                     source=None if compiled is None else f"the artifacts in {compiled}")
    tls = tls_connection(ca_cert, insecure_skip_tls_verify)
    cluster = reader(host=settings.K8S_HOST.get(), token=settings.K8S_TOKEN.get(), kubeconfig=kubeconfig,
                     context=context, **tls)
    versions: dict[str, str] = {}
    servers = endpoint_checks(opts, tls, versions)  # first: Pod Security reads a server's version
    from dataclasses import replace

    checks = run_checks(replace(opts, server_versions=versions), cluster, specs, claims, refs, needs)
    if len(checks) > 1:  # the API answered
        checks += servers
        checks += tracking_checks(opts, tls)
    from components.redaction import redact_text  # a server's message may quote a URL or a token

    if as_json:  # each string redacted before it is encoded: a blanked value never breaks the JSON's quoting
        report = {"ok": all(c.ok for c in checks), "host": redact_text(cluster.host), "paths": list(opts.paths),
                  "checks": [{k: redact_text(v) if isinstance(v, str) else v for k, v in c.as_dict().items()}
                             for c in checks]}
        click.echo(json.dumps(redact_data(report), sort_keys=True))
    else:
        click.echo(redact_text(render(checks, opts, cluster.host)))
    if not all(c.ok for c in checks):
        sys.exit(1)
