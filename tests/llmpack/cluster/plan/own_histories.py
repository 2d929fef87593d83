"""A second family of gang histories of known truth, for the plan's estimator (issue 49).

Written beside benchmarks/plan_coverage/ (whose generators the estimator's author did not write and
must not tune to) with other shapes, so that the method is chosen by both: per-node provisioning
gamma, Weibull, Burr XII or gamma plus a Pareto capacity stall; pull Weibull or gamma; overhead a
shifted gamma; training ``work / N`` GPU-node-seconds times a gamma noise. Each family has two GPU
types of different pace. :func:`truth` is the Monte-Carlo quantile of overhead + the slowest of N
nodes (the plan's spin-up); :func:`dumps` writes a history as the three kubectl dumps the plan reads,
one node label per node (so a gang's GPU type is its nodes', and a mixed gang can be planted).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

A100, L40S = "nvidia-a100-80gb", "nvidia-l40s"
PRODUCT = {A100: "NVIDIA-A100-SXM4-80GB", L40S: "NVIDIA-L40S"}
FAMILIES = ("gamma", "weibull", "burr", "stall")
LIGHT, HEAVY = ("gamma", "weibull"), ("burr", "stall")
WORK_NODE_S = {A100: 4000.0, L40S: 9000.0}


def _provision(family: str, gpu: str, rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    slow = 1.0 if gpu == A100 else 1.4
    if family == "gamma":
        return 40 * slow + rng.gamma(4.0, 35.0 * slow, size)
    if family == "weibull":  # lighter than lognormal
        return 100 * slow + 120 * slow * rng.weibull(3.0, size)
    if family == "burr":     # Burr XII, tail index c k = 2.5
        c, k = 5.0, 0.5
        return 30 + 180 * slow * ((1 - rng.random(size)) ** (-1 / k) - 1) ** (1 / c)
    if family == "stall":    # gamma body, 10% of nodes wait out a Pareto(2.2) capacity stall
        hit = rng.random(size) < 0.1
        return 60 + rng.gamma(8.0, 15.0 * slow, size) + np.where(hit, 90 * rng.random(size) ** (-1 / 2.2), 0.0)
    raise ValueError(family)


def draw(family: str, gpu: str, rng: np.random.Generator, runs: int, nodes: int) -> dict[str, np.ndarray]:
    """Whole seconds: overhead (runs,), provision and pull (runs, nodes), train (runs,)."""
    provision = np.rint(_provision(family, gpu, rng, (runs, nodes)))
    size = (runs, nodes)
    pull = np.rint(10 + 50 * rng.weibull(2.0, size) if gpu == A100 else 20 + rng.gamma(3.0, 10.0, size))
    overhead = np.rint(8 + rng.gamma(6.0, 2.0, runs))
    train = np.rint(WORK_NODE_S[gpu] / nodes * rng.gamma(200.0, 1 / 200.0, runs))
    return {"overhead": overhead, "provision": provision, "pull": pull, "train": train}


def history(family: str, gpu: str, runs: int, nodes: int, seed: int) -> dict[str, np.ndarray]:
    return draw(family, gpu, np.random.default_rng([4901, FAMILIES.index(family), len(gpu), runs, nodes, seed]),
                runs, nodes)


def spin_up(g: dict[str, np.ndarray]) -> np.ndarray:
    return g["overhead"] + np.max(g["provision"] + g["pull"], axis=1)


def truth(family: str, gpu: str, nodes: int, qs: Sequence[float] = (0.5, 0.9), gangs: int = 200_000) -> np.ndarray:
    """The true quantiles of spin-up at ``nodes`` (Monte Carlo, a seed of its own)."""
    g = draw(family, gpu, np.random.default_rng([7, FAMILIES.index(family), len(gpu), nodes]), gangs, nodes)
    return np.quantile(spin_up(g), qs)


def _t(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(int(t), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def dumps(histories: Sequence[tuple[str, dict[str, np.ndarray]]], out: Path,
          node_gpus: dict[tuple[int, int], str] | None = None) -> dict[str, Path]:
    """pods.json, nodes.json, events.json of MLflow-path runs under ``out``; the runs of each history
    alternate in time. ``node_gpus`` {(run index, node rank): GPU type} overrides a node's label (a
    mixed gang)."""
    pods: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    t, i = 1_900_000_000.0, 0
    for r in range(max(len(g["overhead"]) for _, g in histories)):
        for gpu, g in histories:
            if r >= len(g["overhead"]):
                continue
            run, job = f"mlflow-run-{i:03d}", f"ft-{i:03d}"
            labels = {"llmpack.io/orchestrator": "mlflow", "llmpack.io/pipeline-run": run,
                      "llmpack.io/step": "finetune", "llmpack.io/run-group": "rg-own"}
            pods.append({"metadata": {"name": f"{run}-main", "namespace": "ml", "uid": f"u-{run}",
                                      "creationTimestamp": _t(t), "labels": labels},
                         "spec": {"nodeName": "cpu-0", "containers": [{"name": "main"}]},
                         "status": {"phase": "Succeeded"}})
            created = t + g["overhead"][r]
            ready = g["provision"][r] + g["pull"][r]
            end = created + ready.max() + g["train"][r]
            for k in range(len(ready)):
                node_gpu = (node_gpus or {}).get((i, k), gpu)
                name, node = f"{job}-node-{k}", f"gpu-{i}-{k}"
                pods.append({
                    "metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}", "creationTimestamp": _t(created),
                                 "labels": {**labels, "jobset.sigs.k8s.io/jobset-name": job,
                                            "batch.kubernetes.io/job-completion-index": str(k),
                                            "llmpack.io/gpu-count": "4"}},
                    "spec": {"nodeName": node, "containers": [{"name": "node"}]},
                    "status": {"phase": "Succeeded", "conditions": [
                        {"type": "PodScheduled", "status": "True",
                         "lastTransitionTime": _t(created + g["provision"][r, k])}],
                        "containerStatuses": [{"name": "node", "state": {"terminated": {
                            "startedAt": _t(created + ready[k]), "finishedAt": _t(end), "exitCode": 0}}}]}})
                nodes.append({"metadata": {"name": node, "creationTimestamp": _t(created + 3),
                                           "labels": {"nvidia.com/gpu.product": PRODUCT[node_gpu],
                                                      "karpenter.sh/capacity-type": "on-demand"}},
                              "status": {"conditions": [{"type": "Ready", "status": "True",
                                                         "lastTransitionTime": _t(created + g["provision"][r, k])}]}})
            t, i = end + 60, i + 1
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, items in (("pods", pods), ("nodes", nodes), ("events", events)):
        paths[kind] = out / f"{kind}.json"
        paths[kind].write_text(json.dumps({"kind": "List", "items": items}))
    return paths
