"""Cluster submission, dispatched: ``submit("kfp"|"argo"|"mlflow", **options)`` and its wait.

Each orchestrator's own path lives in its package (:mod:`kfp_pipelines.submit`,
:mod:`argo_workflows.submit`, :mod:`mlflow_projects.submit`), found through the one registry,
:mod:`llmpack.backends`; what they share is :mod:`components.servers.submission` and
:mod:`components.servers.remote`. The options each takes are listed in its ``submit`` docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.errors import InputError
from llmpack.backends import ORCHESTRATORS, cluster_submitter


def submit(orchestrator: str, **kwargs: Any) -> dict[str, Any]:
    """``submit("kfp"|"argo"|"mlflow", **options)``: that backend's ``submit``; returns its summary."""
    return cluster_submitter(orchestrator).submit(**kwargs)


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
    ns = summary.get("namespace") or "default"
    server_id = summary.get("server_id")
    stop = {"kfp": f"kfp.Client(host=...).terminate_run({server_id!r}) or the KFP UI",
            "argo": f"argo stop {server_id} -n {ns}",
            "mlflow": f"kubectl delete job {server_id} -n {ns}"}.get(str(summary.get("orchestrator")), "its orchestrator")
    return (f"{summary.get('orchestrator')} run {summary.get('pipeline_run')} (server id {server_id}) keeps running on "
            f"the cluster and closes its own MLflow record; stop it with: {stop}")
