"""The Argo Workflows path.

- :mod:`argo_workflows.workflow`: ``build_workflow(pipe)`` compiles a pipeline object to a Hera
  ``Workflow``; its module-level ``w`` is what ``hera generate yaml argo_workflows/workflow.py``
  writes, committed as ``argo_workflows/finetune.yaml`` (``argo submit`` it on a cluster).
- :mod:`argo_workflows.local`: runs a compiled Workflow YAML's DAG on this machine
  (``llmpack run --backend argo --local``).
- :mod:`argo_workflows.submit`: ``submit(...)`` / ``wait_for_completion(summary)`` against an Argo
  Server with Hera's ``WorkflowsService`` (``llmpack cluster submit argo``; Hera has no submit command).

Hera is imported only by the functions that need it.
"""
