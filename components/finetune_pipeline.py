"""The LLM fine-tuning pipeline, in one place: prepare_data -> tokenize -> finetune -> evaluate -> register.

Every backend compiles this object: ``kfp_pipelines`` to KFP v2 IR, ``argo_workflows`` to an
Argo Workflow through Hera, ``mlflow_projects`` to an MLproject. Add a step here and it appears
in all three.
"""

from __future__ import annotations

import math

from components.dsl import Pipeline, Rule, pipeline
from components.fusion import fused_steps
from components.names import MAX_MODEL_NAME, model_name_problem
from components.steps.evaluate import evaluate
from components.steps.finetune import finetune
from components.steps.prepare_data import prepare_data
from components.steps.register import register
from components.steps.tokenize import tokenize
from components.training.generation import GATE_METRICS

PIPELINE_NAME = "llm-finetune"

# What each parameter's value must be; checked before any run or submit (``--param``), so a bad
# value is one line up front, not a step failing minutes later (the steps check again).
MAX_STEPS = 10_000_000  # a bound, so that a typo such as 10**23 is one line, not a run that never ends

PARAM_RULES: dict[str, Rule] = {
    "method": (lambda v: v in ("lora", "full"), "'lora' or 'full'"),
    "seq_len": (lambda v: v >= 8, "at least 8"),
    "batch_size": (lambda v: v >= 1, "at least 1"),
    "lr": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
    "min_improvement": (math.isfinite, "a finite number"),
    "model_name": (lambda v: model_name_problem(v) is None,
                   f"an MLflow registered-model name (not blank, no '/' or ':', at most {MAX_MODEL_NAME} characters)"),
    "checkpoint_every": (lambda v: v >= 0, ">= 0 (0: checkpoint only on SIGTERM)"),
    "eval_fraction": (lambda v: 0 < v < 1, "between 0 and 1 (exclusive)"),
    "grad_accum": (lambda v: v >= 1, "at least 1"),
    "warmup_steps": (lambda v: v >= 0, ">= 0"),
    "weight_decay": (lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"),
    "lora_r": (lambda v: v >= 1, "at least 1"),
    "lora_alpha": (lambda v: v >= 1, "at least 1"),
    "eval_batch_size": (lambda v: v >= 1, "at least 1"),
    "builtin_size": (lambda v: v >= 2, "at least 2 (a train and an eval row)"),
    "nproc_per_node": (lambda v: 1 <= v <= 64, "between 1 and 64 (processes of finetune; torchrun above 1)"),
    "strategy": (lambda v: v in ("ddp", "fsdp"), "'ddp' or 'fsdp' (FSDP2: weights sharded over the ranks)"),
    "max_steps": (lambda v: 1 <= v <= MAX_STEPS, f"a positive number of steps, at most {MAX_STEPS:,}"),
    "nnodes": (lambda v: 1 <= v <= 1024, "between 1 and 1024 (nodes of finetune; a TrainJob above 1)"),
    "gate_metric": (lambda v: v in GATE_METRICS,
                    "'auto' (exact match where the eval rows have answers, else eval loss), 'eval_loss', 'exact_match' "
                    "or 'normalised_match'"),
}


@pipeline(name=PIPELINE_NAME, description="Fine-tune a causal LM with LoRA, evaluate it, register it.",
          rules=PARAM_RULES)
def finetune_pipeline(
    model: str = "tiny",
    data: str = "builtin",
    seed: int = 0,
    max_steps: int = 120,
    method: str = "lora",
    seq_len: int = 128,
    batch_size: int = 8,
    lr: float = 3e-3,
    min_improvement: float = 0.0,
    model_name: str = "llmpack-finetuned",
    checkpoint_every: int = 0,
    skip_bad_rows: bool = False,
    eval_fraction: float = 0.1,
    grad_accum: int = 1,
    warmup_steps: int = 6,
    weight_decay: float = 0.0,
    lora_r: int = 16,
    lora_alpha: int = 32,
    eval_batch_size: int = 16,
    builtin_size: int = 2000,
    checkpoint_dir: str = "",
    nproc_per_node: int = 1,
    strategy: str = "ddp",
    nnodes: int = 1,
    trainjob: str = "",
    promote: bool = True,
    merge: bool = False,
    gate_metric: str = "auto",
):
    prepared = prepare_data(
        data=data, seed=seed, skip_bad_rows=skip_bad_rows, eval_fraction=eval_fraction, builtin_size=builtin_size
    )
    tokens = tokenize(dataset=prepared.outputs["dataset"], model=model, seq_len=seq_len)
    tuned = finetune(
        tokens=tokens.outputs["tokens"],
        base_model=model,
        method=method,
        max_steps=max_steps,
        batch_size=batch_size,
        grad_accum=grad_accum,
        lr=lr,
        warmup_steps=warmup_steps,
        weight_decay=weight_decay,
        lora_r=lora_r,
        lora_alpha=lora_alpha,
        seed=seed,
        checkpoint_every=checkpoint_every,
        checkpoint_dir=checkpoint_dir,
        nproc_per_node=nproc_per_node,
        strategy=strategy,
        nnodes=nnodes,
        trainjob=trainjob,
    )
    scored = evaluate(tokens=tokens.outputs["tokens"], model=tuned.outputs["model"], min_improvement=min_improvement,
                      batch_size=eval_batch_size, gate_metric=gate_metric)
    register(model=tuned.outputs["model"], metrics=scored.outputs["metrics"], model_name=model_name, promote=promote,
             merge=merge)


def build() -> Pipeline:
    """A fresh, validated copy of the pipeline object."""
    return finetune_pipeline()


# ``components.finetune_pipeline:finetune__evaluate``: the step process finds this pipeline's fused steps here.
__getattr__ = fused_steps(finetune_pipeline)
