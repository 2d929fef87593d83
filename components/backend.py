"""The backend contract (v2): what ``llmpack`` calls on a backend, written once.

A backend is one object defined in its own package and found by name in the one registry,
:mod:`llmpack.backends`, which imports it only when asked for (modelled on MLflow's ``AbstractBackend`` and
``SubmittedRun``, httpx's small transport contract, kfp's validated runner config). Every backend is a
:class:`Backend`: its name, settings and golden artifacts, :meth:`Backend.compile`, :meth:`Backend.run_local`.
One that submits is a :class:`ClusterBackend`: its :class:`Connection`, ``submit`` of one :class:`SubmitRequest`
returning a :class:`SubmittedRun`, its :class:`ClusterPath` and :meth:`~ClusterBackend.recognise_pod`. The rest
are optional mixins: :class:`LabFacts` (:class:`PodMarks`, doctor facts), :class:`OwnAccount`, :class:`Coloured`.
So a new orchestrator touches its own folder plus one registry line, and no module of ``llmpack`` names it.

Each member, and the test that holds llmpack to it: docs/internals/architecture.md, "The backend
contract". Heavy libraries stay inside the methods that need them.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar, Protocol, Self

from components.doctor_facts import DoctorFacts
from components.errors import InputError
from components.servers.remote import REQUEST_TIMEOUT_S
from components.settings import Setting

if TYPE_CHECKING:  # only named in annotations: the registry (llmpack --help) imports this module
    from components.dsl import Pipeline


class LocalRunner(Protocol):
    """Runs the pipeline on this machine (``llmpack run --local``, ``llmpack compare``)."""

    def run_local(self, pipe: Pipeline, values: Mapping[str, Any], workdir: Path, env: Mapping[str, str],
                  log: IO[str] | None = None) -> dict[str, Path]:
        """Run every step of ``pipe`` with ``values`` in ``workdir``, the environment exactly ``env``.

        Returns the artifact directories as ``{"task.output": path}``; raises
        :class:`~components.errors.RunFailed` naming the failed step.
        """
        ...


@dataclass(frozen=True, kw_only=True)
class Connection:
    """Where a cluster backend's server is, from ``llmpack cluster submit`` flags (the environment fills the rest).

    Frozen and checked when made (like kfp's ``SubprocessRunner``): a wrong type is a one-line
    :class:`InputError` naming the field. Tokens are never fields: they come from the environment
    when a request is sent. Subclasses add their own endpoint fields (``host``, ``kubeconfig``...).
    """

    namespace: str | None = None
    ca_cert: str | None = None
    insecure_skip_tls_verify: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "insecure_skip_tls_verify":
                if not isinstance(value, bool):
                    raise InputError(f"connection {field.name}: expected true or false, got {value!r}")
            elif value is not None and not isinstance(value, str):
                raise InputError(f"connection {field.name}: expected text, got {type(value).__name__}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Connection:
        """The connection named by ``options`` (flags by their keyword names); other keys are ignored."""
        return cls(**{f.name: options[f.name] for f in dataclasses.fields(cls) if f.name in options})

    def options(self) -> dict[str, Any]:
        """The keywords ``submit`` and ``wait_for_completion`` take for this connection."""
        return dataclasses.asdict(self)


@dataclass(frozen=True, kw_only=True)
class ServerConnection(Connection):
    """An orchestrator's API server by URL (``--host``; when ``None``, the orchestrator's own variable when sent)."""

    host: str | None = None


@dataclass(frozen=True, kw_only=True)
class SubmitRequest:
    """One run to start on a cluster: what every backend's ``submit`` takes, as one typed object.

    A backend's own fields (its endpoint, compiled artifact, service account...) are those of its
    subclass, its cluster module's ``Request`` (as httpx's transports all take one ``Request``).

    Args:
        params: the user's pipeline parameters (``model``, ``data``, ``max_steps``, ``seed``...).
        run_group, pipeline_run: DNS-1123 ids; new ones when not given.
        tracking_uri: the MLflow store for the run's record (default ``MLFLOW_TRACKING_URI``).
        price_per_gpu_hour, price_file: the GPU price for the cost tags.
        timeout_s: the limit of one request.
        namespace: where the run goes (each backend says what its default is).
        ca_cert, insecure_skip_tls_verify: how the server's certificate is checked (on by default).
    """

    params: Mapping[str, Any] | None = None
    run_group: str | None = None
    pipeline_run: str | None = None
    tracking_uri: str | None = None
    price_per_gpu_hour: str | None = None
    price_file: str | None = None
    timeout_s: float = REQUEST_TIMEOUT_S
    namespace: str | None = None
    ca_cert: str | None = None
    insecure_skip_tls_verify: bool = False

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Self:
        """The request named by ``options`` (keywords); one that is not a field is one :class:`InputError`."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InputError(f"submit: unknown option {unknown[0]!r} (known: {', '.join(sorted(known))})")
        return cls(**options)


class SubmittedRun:
    """One run started on a cluster (MLflow's ``SubmittedRun``): wait for it, ask its status, say how to stop it.

    :attr:`summary` is the submission summary ``llmpack cluster submit`` prints (telemetry fields,
    ``server_id``, ``namespace``, ``parameters``, ``tags``, the orchestrator's own ids);
    :meth:`wait` adds its ``result``.
    """

    def __init__(self, backend: ClusterBackend, summary: dict[str, Any], connection: Connection) -> None:
        self.backend, self.summary, self.connection = backend, summary, connection

    @property
    def run_id(self) -> str:
        return str(self.summary.get("pipeline_run"))

    def wait(self, timeout_s: float, **kwargs: Any) -> dict[str, Any]:
        """Poll until the run ends or ``timeout_s`` passes; the result is also ``summary["result"]``.

        Returns ``{"status": "succeeded"|"failed"|"error"|"skipped"|"canceled"|"timeout", "state": <native>, ...}``.
        """
        result = self.backend.wait_for_completion(self.summary, timeout_s=timeout_s, **self._given(), **kwargs)
        self.summary["result"] = result
        return result

    def get_status(self) -> str:
        """The run's status now: ``running`` until it ends, then as :meth:`wait` says."""
        status = str(self.backend.wait_for_completion(self.summary, timeout_s=0, **self._given())["status"])
        return "running" if status == "timeout" else status

    def _given(self) -> dict[str, Any]:
        """The connection's options that were given: an unset one (``namespace=None``) is left out, so the
        wait takes the submission's own (the namespace the run was created in, from the compiled artifact)."""
        return {k: v for k, v in self.connection.options().items() if v is not None}

    def stop_hint(self) -> str:
        """The orchestrator's own command that stops this run."""
        return self.backend.stop_hint(self.summary)

    def left_behind(self) -> str:
        """What a failure after the submission leaves on the cluster, and the command that removes it."""
        return (f"{self.summary.get('orchestrator')} run {self.summary.get('pipeline_run')} was created on the "
                f"cluster (server id {self.summary.get('server_id')}, namespace {self.summary.get('namespace')}); "
                f"remove it with: {self.backend.remove_hint(self.summary)}")

    def still_running(self) -> str:
        """What an interrupted wait leaves: the run goes on, closes its own record, and how to stop it."""
        return still_running(self.summary, self.stop_hint())


def still_running(summary: Mapping[str, Any], stop: str) -> str:
    return (f"{summary.get('orchestrator')} run {summary.get('pipeline_run')} (server id {summary.get('server_id')}) "
            f"keeps running on the cluster and closes its own MLflow record; stop it with: {stop}")


DEFAULT_NAMESPACE = "llmpack"  # where a cluster path's pods run when nothing says otherwise
TLS_OPTIONS = ("ca_cert", "insecure_skip_tls_verify")  # every cluster path's submit and wait take them
ONE_POD_STEP = "main"  # the llmpack.io/step of the pod that runs a whole pipeline (ClusterPath.one_pod)


@dataclass(frozen=True, kw_only=True)
class CompareOption:
    """A ``llmpack compare --cluster`` flag of one path's own; its value goes to that path's submit as ``key``."""

    flag: str  # "--kfp-host"
    key: str  # the submit option it gives ("host")
    help: str
    endpoint: bool = False  # a server's address: listed with the others, before the options the paths share

    @property
    def dest(self) -> str:
        """The keyword click gives it (``kfp_host``)."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True, kw_only=True)
class ClusterPath:
    """A cluster backend as a ``compare --cluster`` path: all that differs between the paths there.

    ``llmpack compare --cluster`` treats every path alike except for what is declared here: which
    option names the compiled file it submits and where ``llmpack compile`` writes it, which options
    its ``submit`` and its wait take, where its pods run, whether its pods can be watched before the
    submission, and whether it runs the whole pipeline in one pod.
    """

    name: str
    artifact_option: str  # the submit option that names what it submits
    artifact_path: str  # where `llmpack compile --out DIR` writes it, under DIR
    submit_options: tuple[str, ...]  # options its submit takes (passed to llmpack.cluster.submit)
    wait_options: tuple[str, ...]  # those its wait needs too
    own_options: tuple[str, ...] = ()  # options read here, not passed to its submit
    namespace_options: tuple[str, ...] = ("namespace",)  # where its pods run: the first option given...
    namespace_env: str | None = None  # ...else this environment variable...
    default_namespace: str = DEFAULT_NAMESPACE  # ...else this
    watch_before_submit: bool = True  # its pods carry llmpack.io/run-group: watchable before they exist
    one_pod: bool = False  # the whole pipeline in one pod (step ONE_POD_STEP), sized to the largest step
    lends_kubeconfig: bool = False  # its kubeconfig/context is the pod watcher's default
    compare_options: tuple[CompareOption, ...] = ()  # its own `compare --cluster` flags
    shared_options: tuple[str, ...] = ()  # which shared flags it takes (namespace, kubeconfig, context); TLS always

    def pod_namespace(self, conf: Mapping[str, Any]) -> str:
        """Where this path's pods run, given its options."""
        given = next((conf[k] for k in self.namespace_options if conf.get(k)), None)
        return given or (os.environ.get(self.namespace_env) if self.namespace_env else None) or self.default_namespace


@dataclass(frozen=True, kw_only=True)
class Drivers:
    """An orchestrator's own driver pods, which run no step code (KFP v2 on Argo: a driver per task).

    How the pod watcher tells a driver (``role`` ``driver``) from the pod that runs the step, and
    which task a driver serves, when the pod carries no ``llmpack.io/step`` label.
    """

    templates: tuple[str, ...]  # a driver's pod name is <workflow>-<template>-<hash>
    executor_templates: tuple[str, ...]  # ...and the step's pod's
    node_suffix: str  # a driver's workflow node name ends in <task><node_suffix>
    executor_node: str  # the step's pod's workflow node name ends in <task>.<executor_node>
    command: str  # a driver's main container's command
    image: str  # ...or a part of its image


@dataclass(frozen=True, kw_only=True)
class PodMarks:
    """What the pod watcher reads of an orchestrator's own pods, besides :meth:`ClusterBackend.recognise_pod`.

    Stated once here, so that :mod:`llmpack.cluster.k8s` names no orchestrator: it asks the registry for
    the union over the cluster backends (:func:`llmpack.backends.all_pod_marks`). The watcher keeps
    (slims a pod to) llmpack's own labels plus every label and annotation named here.
    """

    run_labels: tuple[str, ...] = ()  # labels whose value is the orchestrator's own run id
    workflow_labels: tuple[str, ...] = ()  # labels whose value groups one run's pods (a driver with its step)
    keep_labels: tuple[str, ...] = ()  # other labels recognise_pod reads
    keep_annotations: tuple[str, ...] = ()  # annotations recognise_pod reads
    keep_env: tuple[str, ...] = ()  # prefixes of the environment variable names recognise_pod reads (names only kept)
    node_annotations: tuple[str, ...] = ()  # the pod's workflow node name, dotted, its task last (retry suffixes aside)
    helper_containers: tuple[str, ...] = ()  # the orchestrator's own containers beside the step's
    drivers: Drivers | None = None  # its own driver pods, if it has any
    # A label selector of its pods when they cannot carry llmpack.io/run-group (labels fixed at compile
    # time): the watcher finds them by run id, ``<selector>,!llmpack.io/run-group,<run_labels[0]> in (...)``.
    unlabelled_selector: str | None = None

    def labels(self) -> tuple[str, ...]:
        """Every label named here, once each."""
        return tuple(dict.fromkeys((*self.keep_labels, *self.run_labels, *self.workflow_labels)))


ClickOption = Callable[[Callable[..., Any]], Callable[..., Any]]


class Backend:
    """The contract every backend keeps: what it is, :meth:`compile`, :meth:`run_local`. Subclass it, set ``name``.

    A backend that submits to a cluster is a :class:`ClusterBackend`; :class:`LabFacts`, :class:`OwnAccount`
    and :class:`Coloured` are optional mixins it lists among its bases. The defaults: a local-only backend
    that compiles nothing (``direct``).
    """

    name: ClassVar[str]
    settings: ClassVar[tuple[Setting[Any], ...]] = ()  # the LLMPACK_* variables it reads (components.settings)
    env_vars: ClassVar[tuple[str, ...]] = ()  # other variables it reads (tokens, endpoints), never printed
    artifacts: ClassVar[tuple[Path, ...]] = ()  # committed compiled artifacts, relative to the repository root
    # Where run_local's work is done, imported when first used (heavy libraries stay out of ``llmpack --help``):
    local_module: ClassVar[str | None] = None  # defines run_local(pipe, values, workdir, env, log)
    # The pod options (``llmpack compile --namespace``...) its compile takes as keywords, when given.
    compile_options: ClassVar[tuple[str, ...]] = ()

    def compile(self, pipe: Pipeline, out_dir: Path, *, final_dir: Path | None = None) -> list[Path]:
        """Write this backend's artifacts for ``pipe`` under ``out_dir``; returns the files written.

        ``final_dir`` is where ``out_dir``'s contents will land (``llmpack compile`` writes into a
        temporary directory first), for artifacts that name their own path.
        """
        return []

    def run_local(self, pipe: Pipeline, values: Mapping[str, Any], workdir: Path, env: Mapping[str, str],
                  log: IO[str] | None = None) -> dict[str, Path]:
        """As :meth:`LocalRunner.run_local`: by default :attr:`local_module`'s ``run_local``."""
        return self._module(self.local_module, "local_module").run_local(pipe, values, workdir, env, log)

    def _module(self, name: str | None, what: str) -> Any:
        if name is None:
            raise NotImplementedError(f"backend {self.name!r}: no {what}")
        return importlib.import_module(name)


class ClusterBackend(Backend, ABC):
    """A backend that submits to a cluster: its :class:`Connection`, ``submit`` and wait, and its pods recognised.

    Required: ``connection_type``, ``cluster_path`` (the registry refuses a ``+cluster`` line without them)
    and :meth:`recognise_pod`; ``submit_run``, ``request``, ``wait_for_completion`` and ``check_connection``
    default to :attr:`cluster_module`'s functions. ``isinstance(b, ClusterBackend)`` is how the pack asks
    whether a backend is one.
    """

    connection_type: ClassVar[type[Connection]]
    cluster_path: ClassVar[ClusterPath]  # its `compare --cluster` path
    submit_help: ClassVar[str] = ""  # ``llmpack cluster submit <name> --help``: what a submission creates
    # defines Request, submit(request), wait_for_completion, check_connection; imported when first used
    cluster_module: ClassVar[str | None] = None

    def submit_options(self) -> list[ClickOption]:
        """The backend's own ``llmpack cluster submit <name>`` options (click decorators); the CLI has the shared ones.

        Options named like a :attr:`connection_type` field make the :class:`Connection`; the
        others go to :meth:`submit` as keywords.
        """
        return []

    def connection_fields(self) -> frozenset[str]:
        """The option names that make this backend's :class:`Connection`."""
        return frozenset(f.name for f in dataclasses.fields(self.connection_type))

    def connect(self, options: Mapping[str, Any]) -> Connection:
        """The :class:`Connection` from flags (by keyword name)."""
        return self.connection_type.from_options(options)

    def submit(self, connection: Connection, **kwargs: Any) -> SubmittedRun:
        """Start one run of the committed compiled artifact (keywords: the fields of :meth:`request`); returns it."""
        return SubmittedRun(self, self.submit_run(self.request({**connection.options(), **kwargs})), connection)

    def request(self, options: Mapping[str, Any]) -> SubmitRequest:
        """The :class:`SubmitRequest` ``options`` name (by keyword): by default :attr:`cluster_module`'s ``Request``."""
        return self._module(self.cluster_module, "cluster_module").Request.of(options)

    def submit_run(self, request: SubmitRequest) -> dict[str, Any]:
        """Start the run ``request`` describes; returns its summary.

        Bad input, an unreachable or refusing server: one-line :class:`InputError`, never a token in it.
        By default :attr:`cluster_module`'s ``submit(request)``.
        """
        return self._module(self.cluster_module, "cluster_module").submit(request)

    def wait_for_completion(self, summary: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Poll the run ``summary`` names until it ends or ``timeout_s`` passes; ``kwargs``: connection options."""
        return self._module(self.cluster_module, "cluster_module").wait_for_completion(summary, **kwargs)

    def check_connection(self, options: Mapping[str, Any]) -> None:
        """Raise :class:`InputError` now when ``options`` name no usable endpoint; nothing is sent."""
        self._module(self.cluster_module, "cluster_module").check_connection(options)

    def stop_hint(self, summary: Mapping[str, Any]) -> str:
        """The native command that stops the run ``summary`` names."""
        return "its orchestrator"

    def remove_hint(self, summary: Mapping[str, Any]) -> str:
        """The native command that removes what the submission of ``summary`` created (default: stops it)."""
        return self.stop_hint(summary)

    @abstractmethod
    def recognise_pod(self, pod: Mapping[str, Any]) -> bool:
        """True when ``pod`` (a Pod object as ``kubectl get pods -o json`` lists it) was made by this orchestrator.

        By the orchestrator's own marks, not llmpack's labels (KFP pods carry none).
        """


class LabFacts:
    """Mixin: what the lab reads of a cluster backend's pods and checks for it, declared on the backend.

    Each may instead be its package's second module's ``POD_MARKS``/``DOCTOR`` (``<package>.doctor``, which only
    the lab loads: :func:`llmpack.backends.pod_marks`, :func:`llmpack.backends.doctor_facts`); without either, none.
    """

    pod_marks: ClassVar[PodMarks] = PodMarks()  # its own marks on its pods (the pod watcher)
    doctor: ClassVar[DoctorFacts] = DoctorFacts()  # what `llmpack cluster doctor` checks for it


class OwnAccount:
    """Mixin: the orchestrator's own account of a finished run, recorded beside ours (Argo's ``resourcesDuration``)."""

    def own_metrics(self, result: Mapping[str, Any]) -> dict[str, float]:
        """Its account from its wait's ``result``, under the orchestrator's own names (``argo_gpu_hours``)."""
        return {}

    def explain_own_metrics(self, metrics: Mapping[str, Any]) -> list[str]:
        """Why its own account (:meth:`own_metrics`) differs from ours, one sentence each."""
        return []


DEFAULT_COLOUR = "#444444"  # a path whose backend is not Coloured (or no longer registered)


class Coloured:
    """Mixin, presentation only: the backend's colour in the report's charts and badges."""

    colour: ClassVar[str] = DEFAULT_COLOUR


def pod_labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    """``metadata.labels`` of a Pod object, empty when absent or malformed."""
    return _metadata(pod, "labels")


def pod_annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    """``metadata.annotations`` of a Pod object, empty when absent or malformed."""
    return _metadata(pod, "annotations")


def _metadata(pod: Mapping[str, Any], key: str) -> Mapping[str, str]:
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    value = meta.get(key) if isinstance(meta, Mapping) else None
    return value if isinstance(value, Mapping) else {}
