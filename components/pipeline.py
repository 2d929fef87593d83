"""The LLM fine-tuning pipeline, in one place: prepare_data -> tokenize -> finetune -> evaluate -> register.

Every backend compiles this object: ``kfp_pipelines`` to KFP v2 IR, ``argo_workflows`` to an
Argo Workflow through Hera, ``mlflow_projects`` to an MLproject. Add a step here and it appears
in all three.
"""

from __future__ import annotations

from components.dsl import Pipeline, pipeline
from components.steps.evaluate import evaluate
from components.steps.finetune import finetune
from components.steps.prepare_data import prepare_data
from components.steps.register import register
from components.steps.tokenize import tokenize

PIPELINE_NAME = "llm-finetune"


@pipeline(name=PIPELINE_NAME, description="Fine-tune a causal LM with LoRA, evaluate it, register it.")
def finetune_pipeline(
    model: str = "tiny",
    data: str = "builtin",
    seed: int = 0,
    max_steps: int = 60,
    method: str = "lora",
    seq_len: int = 128,
    batch_size: int = 8,
    lr: float = 3e-3,
    min_improvement: float = 0.0,
    model_name: str = "llmpack-finetuned",
    checkpoint_every: int = 0,
):
    prepared = prepare_data(data=data, seed=seed)
    tokens = tokenize(dataset=prepared.outputs["dataset"], model=model, seq_len=seq_len)
    tuned = finetune(
        tokens=tokens.outputs["tokens"],
        base_model=model,
        method=method,
        max_steps=max_steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        checkpoint_every=checkpoint_every,
    )
    scored = evaluate(tokens=tokens.outputs["tokens"], model=tuned.outputs["model"], min_improvement=min_improvement)
    register(model=tuned.outputs["model"], metrics=scored.outputs["metrics"], model_name=model_name)


def build() -> Pipeline:
    """A fresh, validated copy of the pipeline object."""
    return finetune_pipeline()

