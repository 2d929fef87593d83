"""Create the fine-tuning Workflow on an Argo Server the way Hera users do: ``Workflow.create()``.

    export ARGO_SERVER=https://localhost:2746 ARGO_TOKEN=... ARGO_NAMESPACE=llmpack
    python examples/tutorials/hera_create.py max_steps=200

The server comes from the ``argo`` CLI's environment (or Hera's ``global_config``); the
Workflow is the one pipeline object, so it equals ``argo_workflows/finetune.yaml``.
"""

import sys

from argo_workflows.pipeline import finetune_workflow

params = dict(pair.split("=", 1) for pair in sys.argv[1:])
workflow = finetune_workflow(**params)
created = workflow.create()
print(f"created workflow {created.metadata.namespace}/{created.metadata.name}")
