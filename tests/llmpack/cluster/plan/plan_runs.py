"""Run records of measured finetune gangs, shaped as ``llmpack report`` rebuilds them from MLflow, for the
plan's tests: each node's provision and pull drawn from the given ranges, with a seeded generator."""

from __future__ import annotations

import random
from typing import Any


def gang_run(path: str, gpu_type: str, i: int, rng: random.Random, *, nodes: int = 2, provision: tuple[float, float],
             pull: tuple[float, float] = (5.0, 15.0), overhead: tuple[float, float] = (4.0, 8.0),
             load: tuple[float, float] = (10.0, 14.0), train_s: float = 600.0, post_s: float = 30.0,
             capacity: str = "on-demand", preempted: int = 0, price: float = 2.0,
             planned: dict[str, str] | None = None, max_steps: int | None = None) -> dict[str, Any]:
    """One succeeded gang run; ``actual`` headlines in its metrics as ``compare`` logs them."""
    t0 = 1_800_000_000.0 + 5000 * i
    created = t0 + rng.uniform(*overhead)
    ev: dict[str, float] = {}
    started = []
    for k in range(nodes):
        ready = created + rng.uniform(*provision)
        start = ready + rng.uniform(*pull)
        ev.update({f"pod_created.node{k}": created, f"pod_scheduled.node{k}": created + 0.5,
                   f"node_ready.node{k}": ready, f"container_started.node{k}": start, f"first_step.rank{k}": 0.0})
        started.append(start)
    first = max(started) + rng.uniform(*load)
    ev.update({"first_step": first, "finished": first + train_s})
    total = first + train_s + post_s - t0
    tags = {"llmpack.gpu_type": gpu_type, "llmpack.capacity_type": capacity, "llmpack.price_per_gpu_hour": str(price),
            **(planned or {})}
    if preempted:
        tags["llmpack.preempted_attempts"] = ",".join(f"finetune/gang#{a}:spot" for a in range(1, preempted + 1))
    return {"run_group": "rg-plan", "pipeline_run": f"{path}-{gpu_type}-{i}", "orchestrator": path, "mode": "cluster",
            "status": "succeeded", "submitted_at": t0, "tags": tags, "events": {"finetune": ev},
            "params": {} if max_steps is None else {"max_steps": str(max_steps)},
            "metrics": {"time_to_first_step_s": first - t0, "total_s": total, "gang_ready_s": max(started) - t0,
                        "cost_usd": nodes * (total - (created - t0)) * price / 3600}}


def history(spec: dict[tuple[str, str], dict[str, Any]], runs: int = 10, seed: int = 1) -> list[dict[str, Any]]:
    """``runs`` records per (path, GPU type), interleaved, each drawn with that pair's keywords."""
    rng = random.Random(seed)
    out = []
    for i in range(runs):
        for (path, gpu), kw in spec.items():
            out.append(gang_run(path, gpu, i, rng, **kw))
    return out
