"""The backend contract: what ``llmpack`` calls on a backend, written once.

A backend is a set of plain modules, found by name in the one registry, :mod:`llmpack.backends`
(``direct``, ``kfp``, ``argo``, ``mlflow``: the ``--backend`` names and ``llmpack.orchestrator``
tags). Each orchestrator's package holds its whole path: ``<package>.local`` is a
:class:`LocalRunner`, ``<package>.submit`` a :class:`ClusterSubmitter`. ``direct`` runs locally
only. A module satisfies a protocol by defining the functions below at module level.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Protocol

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


class ClusterSubmitter(Protocol):
    """Sends the committed compiled artifact to a cluster through the orchestrator's own client."""

    def submit(self, **kwargs: Any) -> dict[str, Any]:
        """Start one run of the committed compiled artifact; returns its summary.

        Args (every submitter takes these keywords, plus its own connection and artifact options):
            params: the user's pipeline parameters (``model``, ``data``, ``max_steps``, ``seed``...).
            run_group, pipeline_run: DNS-1123 ids; new ones when not given.
            tracking_uri: the MLflow store for the run's record (default ``MLFLOW_TRACKING_URI``).
            price_per_gpu_hour, price_file: the GPU price for the cost tags.
            timeout_s: the limit of one request.

        The summary has the telemetry fields (``orchestrator``, ``mode``, ``pipeline_run``,
        ``run_group``, ``submitted_at``), ``server_id``, ``namespace``, ``parameters``, ``tags``
        and the orchestrator's own id fields. Bad input, an unreachable or refusing server: one-line
        :class:`~components.errors.InputError`, never a token in it.
        """
        ...

    def wait_for_completion(self, summary: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Poll the run ``summary`` names until it ends or ``timeout_s`` passes; ``kwargs``: connection options.

        Returns ``{"status": "succeeded"|"failed"|"error"|"skipped"|"canceled"|"timeout",
        "state": <native>, ...}``.
        """
        ...

    def check_connection(self, options: Mapping[str, Any]) -> None:
        """Raise :class:`~components.errors.InputError` now when ``options`` (as ``submit`` takes them) name no usable endpoint.

        Nothing is sent: it checks what can be checked before a run is submitted.
        """
        ...
