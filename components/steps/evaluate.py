"""evaluate: eval loss and perplexity of the base model vs the tuned one, and a quality gate."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from components.dsl import GPU_TOLERATION, Dataset, Execution, Input, Metrics, Model, Output, Resources, step
from components.errors import StepFailed
from components.reporting import emit, metric
from components.serving.promotion import eval_set_fingerprint
from components.training.modeling import MODEL_META, device_and_dtype, load_base_model, load_pretrained, take_tuned


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
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum")
            total += loss.item()
            count += int((target != -100).sum())
    return total / max(1, count)


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
) -> None:
    """Eval loss and perplexity, base vs tuned; fails when the improvement is below the gate."""
    import numpy as np
    import torch

    device, amp_dtype = device_and_dtype()
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True)
    src = Path(tokens.path)
    input_ids = torch.from_numpy(np.load(src / "eval_input_ids.npy"))
    labels = torch.from_numpy(np.load(src / "eval_labels.npy"))
    meta = json.loads((Path(model.path) / MODEL_META).read_text())

    kept = take_tuned(model.path)  # fused with finetune: the tuned model is still in memory
    if kept is not None and meta["method"] == "lora":
        emit("model_loaded")
        with kept.disable_adapter():  # the frozen base weights, exactly as loaded before training
            base_loss = mean_token_loss(kept, input_ids, labels, batch_size, device, amp_dtype)
        eval_loss = mean_token_loss(kept, input_ids, labels, batch_size, device, amp_dtype)
    else:
        base = load_base_model(meta["base_model"]).to(device)
        emit("model_loaded")
        base_loss = mean_token_loss(base, input_ids, labels, batch_size, device, amp_dtype)
        if kept is not None:  # full fine-tuning: the tuned weights replaced the base ones in memory
            tuned = kept
        elif meta["method"] == "lora":
            from peft import PeftModel

            tuned = PeftModel.from_pretrained(base, str(Path(model.path) / "adapter")).to(device)
        else:
            tuned = load_pretrained(str(Path(model.path) / "full")).to(device)
        eval_loss = mean_token_loss(tuned, input_ids, labels, batch_size, device, amp_dtype)
    result = {
        "base_eval_loss": base_loss,
        "eval_loss": eval_loss,
        "perplexity": math.exp(eval_loss),
        "base_perplexity": math.exp(base_loss),
        "improvement": base_loss - eval_loss,
        "min_improvement": min_improvement,
        "passed": base_loss - eval_loss >= min_improvement,
        "eval_set": eval_set_fingerprint(src),  # what promotion compares versions on (components.serving.promotion)
    }
    (Path(metrics.path) / "metrics.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    for key in ("base_eval_loss", "eval_loss", "perplexity", "improvement"):
        metric(key, result[key])
    if not result["passed"]:
        raise StepFailed(
            f"quality gate: eval loss improved by {result['improvement']:.4f} "
            f"(base {base_loss:.4f} -> tuned {eval_loss:.4f}), below min_improvement {min_improvement}"
        )
