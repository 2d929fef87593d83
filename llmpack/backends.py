"""The one registry of backends: the ``--backend`` names (and ``llmpack.orchestrator`` tags) and their modules.

Each orchestrator's package holds its whole path (DESIGN.md, "Each backend owns its whole path"):
``<package>.local`` runs it on this machine, ``<package>.submit`` sends it to a cluster. Both
follow the contract written once in :mod:`components.backend`. ``direct`` is the reference with
no orchestrator: local only. Modules are imported when first asked for, so ``llmpack --help``
stays fast.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import cast

from components.backend import ClusterSubmitter, LocalRunner
from components.errors import InputError


@dataclass(frozen=True, kw_only=True)
class Backend:
    """Where one backend's code lives."""

    name: str  # the --backend name and the llmpack.orchestrator tag
    local: str  # the module with run_local (a LocalRunner)
    cluster: str | None = None  # the module with submit / wait_for_completion (a ClusterSubmitter), if any


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(name="direct", local="llmpack.direct"),
        Backend(name="kfp", local="kfp_pipelines.local", cluster="kfp_pipelines.submit"),
        Backend(name="argo", local="argo_workflows.local", cluster="argo_workflows.submit"),
        Backend(name="mlflow", local="mlflow_projects.local", cluster="mlflow_projects.submit"),
    )
}
# The backends that run on a cluster (``llmpack submit``, ``llmpack compare --cluster``).
ORCHESTRATORS: tuple[str, ...] = tuple(name for name, b in BACKENDS.items() if b.cluster)


def local_runner(name: str) -> LocalRunner:
    """The module that runs backend ``name`` on this machine."""
    if name not in BACKENDS:
        hint = f"; did you mean {name.lower()!r}?" if name.lower() in BACKENDS else ""
        raise InputError(f"--backend {name!r}: choose one of {', '.join(BACKENDS)}{hint}")
    return cast(LocalRunner, importlib.import_module(BACKENDS[name].local))


def cluster_submitter(name: str) -> ClusterSubmitter:
    """The module that submits backend ``name`` to a cluster and waits for it."""
    module = BACKENDS[name].cluster if name in BACKENDS else None
    if module is None:
        raise InputError(f"orchestrator {name!r}: choose one of {', '.join(ORCHESTRATORS)}")
    return cast(ClusterSubmitter, importlib.import_module(module))
