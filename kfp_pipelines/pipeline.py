"""The fine-tuning pipeline as a KFP v2 pipeline, for KFP's own tools.

    kfp dsl compile --py kfp_pipelines/pipeline.py --output finetune.yaml

``llm_finetune`` is built from :func:`components.finetune_pipeline.build` (the one pipeline object) by
:func:`kfp_pipelines.compiler.build_kfp_pipeline`; it is the only pipeline in this module, so
``kfp dsl compile`` needs no ``--function`` (``--function llm_finetune`` also works). Importing
this module imports kfp; ``import kfp_pipelines`` does not.
"""

from components.finetune_pipeline import build
from kfp_pipelines.compiler import build_kfp_pipeline

llm_finetune = build_kfp_pipeline(build())
