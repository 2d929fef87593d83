"""evaluate: eval loss, perplexity and task metrics of the base model vs the tuned one, and a quality gate.

The task metrics (docs/serving.md) are exact and normalised match of greedy answers to the
held-out prompts; the gate judges ``gate_metric`` (``auto``: exact match where there are answers).
The model scored is the one finetune sealed, copied once into a private directory and loaded from
there (:mod:`components.serving.sealed`). ``metrics.json`` is signed with the user's key
(``metrics.signature.json`` beside it:
:func:`components.serving.signed.sign_evaluation`), bound to the sha256 of the model files scored
and the pipeline run: the register step trusts nothing else.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from components import bounded
from components.dsl import GPU_TOLERATION, Dataset, Execution, Input, Metrics, Model, Output, Resources, step
from components.errors import InputError, StepFailed
from components.reporting import current, emit, metric
from components.serving.promotion import eval_set_fingerprint
from components.serving.sealed import TOKENS, check_trained_on, private_copy, verified_model, verified_seal
from components.serving.signed import SIGNATURE_FILE, sign_evaluation
from components.training.generation import (
    TASK_FILE,
    TASK_METRICS,
    TaskScore,
    choose_gate,
    gate_improvement,
    greedy_answers,
    read_task_rows,
    score,
)
from components.training.modeling import (
    MODEL_META,
    device_and_dtype,
    load_base_model,
    load_pretrained,
    peft_wrapping,
    take_tuned,
)

#: the tokenize step's files evaluate reads: the eval split, its prompts and answers, the pad id
EVAL_INPUTS = frozenset({"eval_input_ids.npy", "eval_labels.npy", TASK_FILE, "meta.json"})


def mean_token_loss(net: Any, input_ids: Any, labels: Any, batch_size: int, device: Any, amp_dtype: Any) -> float:
    """Cross-entropy averaged over every unmasked target token of the split."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    net.eval()
    with torch.no_grad():
        for start in range(0, len(input_ids), batch_size):
            x = input_ids[start : start + batch_size].to(device)
            y = labels[start : start + batch_size].to(device)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                logits = net(input_ids=x).logits
            logits, target = logits[:, :-1].float(), y[:, 1:]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100,
                                   reduction="sum")
            total += loss.item()
            count += int((target != -100).sum())
    return total / max(1, count)


def task_metrics(base: TaskScore, tuned: TaskScore) -> dict[str, float]:
    """The task metrics as evaluate logs them: ``base_exact_match``, ``tuned_exact_match_reverse``..."""
    out: dict[str, float] = {"task_rows": float(tuned.rows)}
    for name, s in (("base", base), ("tuned", tuned)):
        for key in TASK_METRICS:
            out[f"{name}_{key}"] = getattr(s, key)
        for task, value in s.per_task.items():
            out[f"{name}_exact_match_{task}"] = value
    return out


def gate_line(gate: str, result: dict[str, Any]) -> str:
    """Why the gate failed, in one line naming the metric."""
    if gate == "eval_loss":
        return (f"quality gate: eval loss improved by {result['gate_improvement']:.4f} "
                f"(base {result['base_eval_loss']:.4f} -> tuned {result['eval_loss']:.4f}), "
                f"below min_improvement {result['min_improvement']}")
    label = gate.replace("_", " ")
    return (f"quality gate: {label} improved by {result['gate_improvement']:.4f} "
            f"(base {result[f'base_{gate}']:.4f} -> tuned {result[f'tuned_{gate}']:.4f}), "
            f"below min_improvement {result['min_improvement']}")


@step(
    execution=Execution(
        resources=Resources(cpu=8, memory="64Gi", gpu_type="nvidia-h100-80gb", gpus=1),
        node_selector={"nvidia.com/gpu.present": "true"},
        tolerations=(GPU_TOLERATION,),
        hf_cache=True,
    )
)
def evaluate(
    tokens: Input[Dataset],
    model: Input[Model],
    metrics: Output[Metrics],
    min_improvement: float = 0.0,
    batch_size: int = 16,
    gate_metric: str = "auto",
) -> None:
    """Eval loss, perplexity and task metrics, base vs tuned; fails when the gated metric improved less than min_improvement."""  # noqa: E501 - the step's description in every compiled artifact
    import numpy as np
    import torch

    from components.steps.tokenize import load_tokenizer

    device, amp_dtype = device_and_dtype()
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True)
    tel = current()
    pipeline_run = tel.ctx.pipeline_run if tel is not None else ""
    # what is scored, and on what: the files finetune and tokenize sealed, each copied once into a private
    # directory and read only there (components.serving.sealed)
    model_seal = verified_model(Path(model.path), pipeline_run)
    scored = model_seal["files"]
    tokens_seal = verified_seal(Path(tokens.path), pipeline_run, TOKENS)
    check_trained_on(model_seal, tokens_seal, Path(model.path))  # scored on the split it was trained beside
    token_files = tokens_seal["files"]
    needed = {name: want for name, want in token_files.items() if name in EVAL_INPUTS}
    with tempfile.TemporaryDirectory(prefix="llmpack-evaluate-") as private:
        src = private_copy(Path(tokens.path), needed, Path(private) / "tokens")
        eval_set = eval_set_fingerprint(src)  # of the very bytes scored
        input_ids = torch.from_numpy(np.load(src / "eval_input_ids.npy"))
        labels = torch.from_numpy(np.load(src / "eval_labels.npy"))
        copy = private_copy(Path(model.path), scored, Path(private) / "model")
        meta = bounded.read_json(copy / MODEL_META)
        if not isinstance(meta, dict) or meta.get("method") not in ("lora", "full"):
            raise InputError(f"{MODEL_META}: not a finetune output's metadata (method lora or full)")
        rows = read_task_rows(src / TASK_FILE)
        gate = choose_gate(gate_metric, len(rows))  # a bad name fails before any model is loaded
        tokenizer = load_tokenizer(meta["base_model"]) if rows else None
        pad_id = int(bounded.read_json(src / "meta.json")["pad_id"])

        def answers(net: Any) -> TaskScore:
            """``net``'s greedy answers to the held-out prompts, scored."""
            if tokenizer is None:
                return score([], [])
            eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else pad_id
            got = greedy_answers(net, rows, tokenizer=tokenizer, eos_id=eos, pad_id=pad_id, device=device,
                                 amp_dtype=amp_dtype)
            return score(got, rows)

        kept = take_tuned(model.path)  # fused with finetune: the tuned model is still in memory
        if kept is not None and meta["method"] == "lora":
            emit("model_loaded")
            with kept.disable_adapter():  # the frozen base weights, exactly as loaded before training
                base_loss = mean_token_loss(kept, input_ids, labels, batch_size, device, amp_dtype)
                base_task = answers(kept)
            eval_loss = mean_token_loss(kept, input_ids, labels, batch_size, device, amp_dtype)
            tuned_task = answers(kept)
        else:
            base = load_base_model(meta["base_model"]).to(device)
            emit("model_loaded")
            base_loss = mean_token_loss(base, input_ids, labels, batch_size, device, amp_dtype)
            base_task = answers(base)
            if kept is not None:  # full fine-tuning: the tuned weights replaced the base ones in memory
                tuned = kept
            elif meta["method"] == "lora":
                from peft import PeftModel

                with peft_wrapping():  # peft reads transformers' deprecated is_gradient_checkpointing
                    tuned = PeftModel.from_pretrained(base, str(copy / "adapter")).to(device)
            else:
                tuned = load_pretrained(str(copy / "full")).to(device)
            eval_loss = mean_token_loss(tuned, input_ids, labels, batch_size, device, amp_dtype)
            tuned_task = answers(tuned)
    task = task_metrics(base_task, tuned_task) if rows else {"task_rows": 0.0}
    result: dict[str, Any] = {
        "base_eval_loss": base_loss,
        "eval_loss": eval_loss,
        "perplexity": math.exp(eval_loss),
        "base_perplexity": math.exp(base_loss),
        "improvement": base_loss - eval_loss,
        "min_improvement": min_improvement,
        "eval_set": eval_set,  # what promotion compares versions on (components.serving.promotion)
        **task,
        "gate_metric": gate,  # the metric min_improvement applied to
    }
    result["gate_improvement"] = gate_improvement(gate, result)
    result["passed"] = result["gate_improvement"] >= min_improvement  # for people; register recomputes it
    figures, seal = sign_evaluation(result, model=scored, pipeline_run=pipeline_run)
    for name, doc in ((SIGNATURE_FILE, seal), ("metrics.json", figures)):  # never written through a planted link
        bounded.write_atomic(Path(metrics.path) / name, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
    for key in ("base_eval_loss", "eval_loss", "perplexity", "improvement", *task, "gate_improvement"):
        metric(key, result[key])
    metric(f"gated_by_{gate}", 1.0)  # which metric the gate judged, as a metric name every record carries
    if not result["passed"]:
        raise StepFailed(gate_line(gate, result))
