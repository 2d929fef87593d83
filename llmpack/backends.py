"""The one registry of backends: the ``--backend`` names (and ``llmpack.orchestrator`` tags), one line each.

Each backend is declared once, in its own package, by the contract in :mod:`components.backend`
(docs/internals/architecture.md, the backend contract); this registry names where to find it, and imports
it only when first asked for, so ``llmpack --help`` stays fast. ``direct`` is the reference with
no orchestrator: local only.

More backends (a plugin, a test's toy one) are added without editing this file, as MLflow's
``mlflow.project_backend`` entry points are: ``LLMPACK_BACKENDS=name=package.module:attr,...``
(``:attr`` defaults to ``BACKEND``; ``+cluster`` after the name marks one that submits to a cluster).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from components import settings
from components.backend import (
    DEFAULT_COLOUR,
    ONE_POD_STEP,
    Backend,
    ClusterBackend,
    ClusterPath,
    Coloured,
    LabFacts,
    OwnAccount,
    PodMarks,
)
from components.doctor_facts import DoctorFacts
from components.errors import InputError

EXTRA = settings.declare(settings.Setting(
    name="LLMPACK_BACKENDS", type=str, default="",
    doc="More backends, beside the shipped ones: NAME[+cluster]=package.module[:attr],... (a plugin, a test's toy)."))


@dataclass(frozen=True, kw_only=True)
class Entry:
    """Where one backend is declared: ``module:attr`` is its :class:`components.backend.Backend`."""

    name: str  # the --backend name and the llmpack.orchestrator tag
    module: str
    attr: str = "BACKEND"
    cluster: bool = False  # submits to a cluster (known without importing it): a ClusterBackend

    def load(self) -> Backend:
        backend = getattr(importlib.import_module(self.module), self.attr)
        where = f"{self.module}:{self.attr}"
        if not isinstance(backend, Backend) or backend.name != self.name:
            raise InputError(f"backend {self.name!r}: {where} is not its components.backend.Backend")
        if self.cluster and not isinstance(backend, ClusterBackend):
            raise InputError(f"backend {self.name!r}: registered +cluster, but {where} is not a "
                             "components.backend.ClusterBackend")
        if isinstance(backend, ClusterBackend) and not self.cluster:
            raise InputError(f"backend {self.name!r}: {where} is a ClusterBackend: register it as {self.name}+cluster")
        if self.cluster and not (hasattr(backend, "connection_type") and hasattr(backend, "cluster_path")):
            raise InputError(f"backend {self.name!r}: registered +cluster, but {where} declares no "
                             "connection_type and cluster_path (components.backend.ClusterPath: what submit sends)")
        return backend


SHIPPED: tuple[Entry, ...] = (
    Entry(name="direct", module="llmpack.run.direct"),
    Entry(name="kfp", module="kfp_pipelines.backend", cluster=True),
    Entry(name="argo", module="argo_workflows.backend", cluster=True),
    Entry(name="mlflow", module="mlflow_projects.backend", cluster=True),
)


def _extra(text: str) -> tuple[Entry, ...]:
    """The entries ``LLMPACK_BACKENDS`` adds."""
    entries = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, target = item.partition("=")
        name, plus, flag = name.partition("+")
        module, _, attr = target.partition(":")
        if not sep or not name or not module or (plus and flag != "cluster"):
            raise InputError(f"{EXTRA.name} {item!r}: expected NAME[+cluster]=package.module[:attr]")
        entries.append(Entry(name=name, module=module, attr=attr or "BACKEND", cluster=bool(plus)))
    return tuple(entries)


BACKENDS: dict[str, Entry] = {e.name: e for e in (*SHIPPED, *_extra(EXTRA.get() or ""))}
# The backends that run on a cluster (``llmpack cluster submit``, ``llmpack compare --cluster``).
ORCHESTRATORS: tuple[str, ...] = tuple(name for name, e in BACKENDS.items() if e.cluster)
_LOADED: dict[str, Backend] = {}


def backend(name: str) -> Backend:
    """Backend ``name``, imported on first use."""
    if name not in BACKENDS:
        # kpf -> kfp (ratio 0.67), never airflow -> mlflow (0.62)
        close = difflib.get_close_matches(name.lower(), BACKENDS, n=1, cutoff=0.65)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InputError(f"--backend {name!r}: choose one of {', '.join(BACKENDS)}{hint}")
    if name not in _LOADED:
        _LOADED[name] = BACKENDS[name].load()
    return _LOADED[name]


def local_runner(name: str) -> Backend:
    """The backend that runs ``name`` on this machine (its ``run_local``)."""
    return backend(name)


def cluster_submitter(name: str) -> ClusterBackend:
    """Cluster backend ``name`` (``submit``, ``wait_for_completion``, ``check_connection``, ``stop_hint``)."""
    if name not in ORCHESTRATORS:
        raise InputError(f"orchestrator {name!r}: choose one of {', '.join(ORCHESTRATORS)}")
    found = backend(name)
    assert isinstance(found, ClusterBackend)  # Entry.load refuses a +cluster line that is not one
    return found


def orchestrator_of_pod(pod: Mapping[str, Any]) -> str:
    """The cluster backend whose own marks ``pod`` carries (by its ``recognise_pod``), else ``unknown``.

    For :func:`llmpack.cluster.k8s.podphases.orchestrator_of` after its check of llmpack's own label.
    Asked in registry order: a KFP v2 pod carries Argo's marks too.
    """
    return next((name for name, recognise in _recognisers() if recognise(pod)), "unknown")


# The pod watcher asks these for every pod (thousands a second): each is worked out once.

@functools.cache
def _recognisers() -> tuple[tuple[str, Callable[[Mapping[str, Any]], bool]], ...]:
    return tuple((name, cluster_submitter(name).recognise_pod) for name in ORCHESTRATORS)


@functools.cache
def pod_marks(name: str | None) -> PodMarks:
    """Cluster backend ``name``'s own marks on its pods: ``POD_MARKS`` of its optional second module, else those its
    Backend declares (:class:`~components.backend.LabFacts`); none for any other name (``unknown``)."""
    if name not in ORCHESTRATORS:
        return PodMarks()
    marks = getattr(_second_module(name), "POD_MARKS", None)
    if isinstance(marks, PodMarks):
        return marks
    declared = backend(name)
    return declared.pod_marks if isinstance(declared, LabFacts) else PodMarks()


@functools.cache
def all_pod_marks() -> PodMarks:
    """Every cluster backend's pod marks together (each name once, in registry order; no drivers)."""
    marks = [pod_marks(name) for name in ORCHESTRATORS]

    def union(field: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v for m in marks for v in getattr(m, field)))

    return PodMarks(run_labels=union("run_labels"), workflow_labels=union("workflow_labels"),
                    keep_labels=union("keep_labels"), keep_annotations=union("keep_annotations"),
                    keep_env=union("keep_env"), node_annotations=union("node_annotations"),
                    helper_containers=union("helper_containers"))


@functools.cache
def run_id_selectors() -> tuple[tuple[str, str], ...]:
    """(selector, run-id label) of each cluster backend whose pods cannot carry llmpack's run group."""
    marks = [pod_marks(name) for name in ORCHESTRATORS]
    return tuple((m.unlabelled_selector, m.run_labels[0]) for m in marks if m.unlabelled_selector and m.run_labels)


def _second_module(name: str) -> types.ModuleType | None:
    """Cluster backend ``name``'s optional second module, ``<its package>.doctor``: its lab facts (``DOCTOR``,
    ``POD_MARKS``), imported only when the lab asks; None when it has none (or is a module outside a package)."""
    entry = BACKENDS[cluster_submitter(name).name]
    package = entry.module.rpartition(".")[0]
    if not package:  # a top-level module: no package to hold a second module
        return None
    module = f"{package}.doctor"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return None


@functools.cache
def doctor_facts(name: str) -> DoctorFacts:
    """Cluster backend ``name``'s doctor facts: ``DOCTOR`` of its optional second module (:func:`_second_module`,
    loaded when ``llmpack cluster doctor`` asks); else those its Backend declares
    (:class:`~components.backend.LabFacts`); else none."""
    facts = getattr(_second_module(name), "DOCTOR", None)
    if isinstance(facts, DoctorFacts):
        return facts
    declared = backend(name)
    return declared.doctor if isinstance(declared, LabFacts) else DoctorFacts()


def own_metrics(name: str, result: Mapping[str, Any]) -> dict[str, float]:
    """Cluster backend ``name``'s own account of a finished run (:class:`~components.backend.OwnAccount`); else none."""
    declared = cluster_submitter(name)
    return declared.own_metrics(result) if isinstance(declared, OwnAccount) else {}


def own_metric_notes(metrics: Mapping[str, Any]) -> list[str]:
    """Why each cluster backend's own account in ``metrics`` differs from ours
    (:meth:`~components.backend.OwnAccount.explain_own_metrics`)."""
    accounts = [b for b in map(backend, ORCHESTRATORS) if isinstance(b, OwnAccount)]
    return [note for account in accounts for note in account.explain_own_metrics(metrics)]


def colour(name: str) -> str:
    """Backend ``name``'s colour in the report (:class:`~components.backend.Coloured`); else the default."""
    declared = backend(name) if name in BACKENDS else None
    return declared.colour if isinstance(declared, Coloured) else DEFAULT_COLOUR


@functools.cache
def cluster_paths() -> Mapping[str, ClusterPath]:
    """The ``compare --cluster`` paths: every cluster backend's, in registry order."""
    return types.MappingProxyType({name: cluster_submitter(name).cluster_path for name in ORCHESTRATORS})


def cluster_path(name: str) -> ClusterPath:
    """Cluster backend ``name`` as a ``compare --cluster`` path."""
    path = cluster_paths().get(name)
    if path is None:
        raise InputError(f"orchestrator {name!r}: not a cluster compare path "
                         f"(choose one of {', '.join(cluster_paths())})")
    return path


def runs_in_one_pod(orchestrator: str | None, step: str | None) -> bool:
    """Whether a pod row is a one-pod path's pod that runs the whole pipeline (the MLflow Job's ``main``)."""
    path = cluster_paths().get(orchestrator or "")
    return path is not None and path.one_pod and step == ONE_POD_STEP
