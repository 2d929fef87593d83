"""Synthetic run records shaped like ``llmpack run --json`` summaries, for statistics and rendering tests."""

from __future__ import annotations

import random
from typing import Any

PRICE = "6.88"
# evaluate's task metrics as the default tiny run logs them (components.training.generation)
TASK_METRICS = {"base_exact_match": 0.0, "tuned_exact_match": 0.17, "base_normalised_match": 0.0,
                "tuned_normalised_match": 0.17, "tuned_exact_match_reverse": 0.452, "tuned_exact_match_add": 0.0,
                "task_rows": 200.0, "gate_improvement": 0.17, "gated_by_exact_match": 1.0}


def run(orch: str, i: int, *, ttfs: float, spinup: float, total: float, cost: float | None = None,
        mode: str = "local", status: str = "succeeded") -> dict[str, Any]:
    t0 = 1_700_000_000.0 + 1000 * i
    cost = total * 6.88 / 3600 if cost is None else cost
    events = {
        "prepare_data": {"process_started": t0 + 0.3, "finished": t0 + 0.8},
        "tokenize": {"process_started": t0 + 1.0, "finished": t0 + 1.4},
        "finetune": {"process_started": t0 + spinup, "model_loaded": t0 + spinup + 0.5,
                     "first_step": t0 + ttfs, "finished": t0 + total - 1.5},
        "evaluate": {"process_started": t0 + total - 1.3, "model_loaded": t0 + total - 1.0,
                     "finished": t0 + total - 0.4},
        "register": {"process_started": t0 + total - 0.3, "finished": t0 + total - 0.05},
    }
    return {
        "run_group": "rg-synthetic", "pipeline_run": f"{orch}-run-{i:03d}", "orchestrator": orch, "mode": mode,
        "status": status, "error": None if status == "succeeded" else "boom", "submitted_at": t0,
        "metrics": {"time_to_first_step_s": ttfs, "spinup_s": spinup, "total_s": total, "cost_usd": cost,
                    "train_s": total - 2.0 - ttfs + spinup, "pipeline_overhead_s": 1.0, "tokens_per_s": 900.0,
                    "usd_per_1m_tokens": 0.5, "goodput": 0.6, "gpu_hours": total / 3600, "eval_loss": 1.2,
                    **TASK_METRICS},
        "tags": {"llmpack.gpu_count": "1", "llmpack.gpu_type": "nvidia-h100-80gb", "llmpack.price_per_gpu_hour": PRICE,
                 "llmpack.price_source": "shipped@2025-01-01"},
        "events": events,
        "artifacts": {},
    }


def runs(shift: dict[str, float] | None = None, *, n: int = 5,
         paths: tuple[str, ...] = ("direct", "kfp", "argo", "mlflow"),
         seed: int = 1, jitter: float = 0.15) -> list[dict[str, Any]]:
    """``n`` interleaved runs per path; ``shift[path]`` seconds added to that path's start (a planted delay)."""
    rng = random.Random(seed)
    shift = shift or {}
    out = []
    for _ in range(n):
        for orch in paths:
            d = shift.get(orch, 0.0)
            spin = 2.0 + d + rng.gauss(0, jitter)
            ttfs = spin + 3.0 + rng.gauss(0, jitter)
            total = ttfs + 20.0 + rng.gauss(0, jitter)
            out.append(run(orch, len(out), ttfs=ttfs, spinup=spin, total=total))
    return out
