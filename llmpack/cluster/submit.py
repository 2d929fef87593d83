"""Cluster submission, dispatched: ``submit(name, **options)`` and its wait, for ``llmpack compare --cluster``.

Each orchestrator's own path lives in its package and is declared as a
:class:`components.backend.ClusterBackend` (``kfp_pipelines/backend.py``...), found through the one
registry, :mod:`llmpack.backends`; what they share is :mod:`components.servers.submission` and
:mod:`components.servers.remote`. ``llmpack cluster submit <name>`` uses the backend's
:meth:`~components.backend.ClusterBackend.submit` and its :class:`~components.backend.SubmittedRun` directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components import backend as contract
from components.errors import InputError
from llmpack.backends import ORCHESTRATORS, cluster_submitter


def submit(orchestrator: str, **kwargs: Any) -> dict[str, Any]:
    """``submit(name, **options)``: that backend's run started (its :class:`~components.backend.SubmitRequest`
    made from ``options``); returns its summary."""
    backend = cluster_submitter(orchestrator)
    return backend.submit_run(backend.request(kwargs))


def wait_for_completion(summary: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Wait for a submission (a ``submit`` summary) to end; ``kwargs`` are the connection options.

    Returns ``{"status": "succeeded"|"failed"|"error"|"skipped"|"canceled"|"timeout", "state": <native>, ...}``.
    """
    orchestrator = summary.get("orchestrator")
    if orchestrator not in ORCHESTRATORS:
        raise InputError(f"summary orchestrator {orchestrator!r}: not a cluster submission")
    return cluster_submitter(str(orchestrator)).wait_for_completion(summary, **kwargs)


def still_running(summary: Mapping[str, Any]) -> str:
    """What an interrupted wait leaves: the run goes on on the cluster, closes its own record, and how to stop it."""
    name = str(summary.get("orchestrator"))
    stop = cluster_submitter(name).stop_hint(summary) if name in ORCHESTRATORS else "its orchestrator"
    return contract.still_running(summary, stop)
