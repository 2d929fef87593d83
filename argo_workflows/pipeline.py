"""The fine-tuning pipeline as a Hera ``Workflow``, for Hera users: import, parameterize, ``.create()``.

Hera has no submit command; its users build a ``Workflow`` and call ``.create()`` (and
``.wait()``) with a ``WorkflowsService``. This module gives them the pipeline that way::

    from argo_workflows.pipeline import finetune_workflow

    wf = finetune_workflow(max_steps=200, model="/models/llama-3-8b")  # any pipeline parameter
    wf.create()           # POST /api/v1/workflows/{namespace}, as `argo submit` does
    wf.wait()             # until Succeeded / Failed / Error

The Workflow is :func:`argo_workflows.workflow.build_workflow` of the one pipeline object, so it
is the same as ``argo_workflows/finetune.yaml``: its ``onExit`` task closes the run's MLflow
record (metrics, cost tags, submit time from the workflow's ``creationTimestamp``), whoever
created it. Parameters not given keep the compiled defaults (``mode=cluster``; an empty
``pipeline_run`` becomes the workflow's name).

Where it is sent: a ``workflows_service`` you pass, else Hera's own ``global_config`` when you
set its ``host``, else the environment the ``argo`` CLI reads (``ARGO_SERVER``, ``ARGO_TOKEN``,
``ARGO_NAMESPACE``, ``ARGO_SECURE``, ``ARGO_INSECURE_SKIP_VERIFY``, ``ARGO_BASE_HREF``), so a
shell set up for ``argo submit`` works for ``.create()`` unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from components.errors import InputError

__all__ = ["finetune_workflow", "service_from_env"]


def service_from_env(env: Mapping[str, str] | None = None) -> Any:
    """A Hera ``WorkflowsService`` from the ``argo`` CLI's environment variables."""
    from hera.workflows import WorkflowsService

    from argo_workflows.submit import connection

    host_url, token, namespace, verify = connection(None, None, None, dict(os.environ if env is None else env))
    return WorkflowsService(host=host_url, token=token, namespace=namespace, verify_ssl=verify)


def finetune_workflow(*, workflows_service: Any = None, namespace: str | None = None, **params: Any) -> Any:
    """The fine-tuning pipeline's Hera ``Workflow`` with ``params`` as its arguments, ready to ``.create()``."""
    from hera.shared import global_config
    from hera.workflows import Parameter

    from argo_workflows.workflow import build_workflow
    from components.commands import format_value
    from components.finetune_pipeline import build

    wf = build_workflow(build())
    declared = {p.name for p in wf.arguments}
    unknown = sorted(set(params) - declared)
    if unknown:
        raise InputError(f"finetune_workflow: unknown parameter {unknown[0]!r} (has {', '.join(sorted(declared))})")
    wf.arguments = [Parameter(name=p.name, value=format_value(params[p.name]) if p.name in params else p.value)
                    for p in wf.arguments]
    if workflows_service is None and not global_config.host:
        workflows_service = service_from_env()
    if workflows_service is not None:
        wf.workflows_service = workflows_service
        namespace = namespace or workflows_service.namespace
    wf.namespace = namespace or os.environ.get("ARGO_NAMESPACE") or global_config.namespace
    return wf
