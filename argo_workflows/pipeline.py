"""The fine-tuning pipeline as a Hera ``Workflow``, for Hera users: import, parameterize, ``.create()``.

Hera has no submit command; its users build a ``Workflow`` and call ``.create()`` (and
``.wait()``). :func:`finetune_workflow` is :func:`argo_workflows.workflow.build_workflow` of the one
pipeline object, so it is ``argo_workflows/finetune.yaml`` with the parameters given (through the
pipeline's one gate, :meth:`components.dsl.Pipeline.bind`: bad values are refused when the
Workflow is built). It is sent to a ``workflows_service`` you pass, else Hera's ``global_config``,
else the environment the ``argo`` CLI reads; ``.create()`` without a server is one
:class:`InputError` line saying how to name one.

An example, and where it is sent in full: docs/native-tools.md, "Hera: Workflow.create()";
docs/internals/backend-internals.md, "Argo: the Workflow for Hera users".
"""

from __future__ import annotations

import os
from typing import Any

from argo_workflows.service import NO_SERVER, service_from_env, service_when_used

__all__ = ["NO_SERVER", "finetune_workflow", "service_from_env", "service_when_used"]

def finetune_workflow(*, workflows_service: Any = None, namespace: str | None = None, **params: Any) -> Any:
    """The fine-tuning pipeline's Hera ``Workflow`` with ``params`` as its arguments, ready to ``.create()``.

    Built offline: the server is needed only by ``.create()`` (and ``.wait()``...). ``params`` go
    through the pipeline's one parameter gate (:meth:`components.dsl.Pipeline.bind`: coerced,
    type-checked, held to its rules), so a bad value is one :class:`InputError` here, not a failed
    step on the cluster; the telemetry parameters (``run_group``, ``submitted_at``...) are checked
    by type.
    """
    from hera.shared import global_config
    from hera.workflows import Parameter

    from argo_workflows.submit import DEFAULT_NAMESPACE
    from argo_workflows.workflow import build_workflow
    from components.commands import format_value
    from components.dsl import bind_params
    from components.finetune_pipeline import build
    from components.params import TELEMETRY_PARAMS

    pipe = build()
    flag = "finetune_workflow()"
    user = {k: v for k, v in params.items() if k not in TELEMETRY_PARAMS}
    telemetry = {k: v for k, v in params.items() if k in TELEMETRY_PARAMS}
    bound = {**pipe.bind(user, flag=flag), **bind_params(TELEMETRY_PARAMS, telemetry, flag=flag)}
    wf = build_workflow(pipe)
    wf.arguments = [Parameter(name=p.name, value=format_value(bound[p.name]) if p.name in bound else p.value)
                    for p in wf.arguments]
    if workflows_service is None and not global_config.host:
        env_namespace = namespace or os.environ.get("ARGO_NAMESPACE") or DEFAULT_NAMESPACE
        workflows_service = service_from_env() if os.environ.get("ARGO_SERVER") else service_when_used(env_namespace)
    if workflows_service is not None:
        wf.workflows_service = workflows_service
        namespace = namespace or workflows_service.namespace
    wf.namespace = namespace or os.environ.get("ARGO_NAMESPACE") or global_config.namespace
    return wf
