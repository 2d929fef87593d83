"""Kubeflow Pipelines backend: compile the pipeline object to KFP v2 IR, run it with kfp.local, submit it.

- :mod:`kfp_pipelines.compiler`: ``build_kfp_pipeline(pipe)``, ``compile_pipeline(pipe, path)``.
- :mod:`kfp_pipelines.pipeline`: the shipped pipeline for ``kfp dsl compile --py``.
- :mod:`kfp_pipelines.local`: ``run_local(pipe, values, workdir, env)`` with kfp.local.
- :mod:`kfp_pipelines.submit`: ``submit(...)`` / ``wait_for_completion(summary)`` with ``kfp.Client``
  (``llmpack cluster submit kfp``).
- ``finetune.yaml``: the committed compiled pipeline (golden; ``kfp run submit -f`` it).

kfp is imported inside the functions that need it, so importing this package stays fast.
"""

from pathlib import Path

PACKAGE_PATH = Path(__file__).with_name("finetune.yaml")
