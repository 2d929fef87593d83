"""Held-out gang histories of known distribution, for judging ``llmpack plan``'s intervals.

Written apart from the estimator (issue 49): nothing here imports llmpack; only numpy.

A *run* is one finetune gang of N nodes on one GPU type. Per run: the orchestrator's overhead
(launcher pod created -> the gang's pods created), then per node the node's provisioning (pod
created -> its fresh node Ready: autoscaler, VM boot, kubelet join), the image pull (node Ready ->
image pulled) and the container start (image pulled -> container started). A node is ready at
provision + pull + start after the gang's pods were created; the gang is ready when its slowest node
is (the straggler). Spin-up = overhead + max over the N nodes. Every phase is drawn continuous and
rounded to whole seconds, as the API server stamps them, so the dump holds exactly the drawn
values and the Monte-Carlo truth (:mod:`truth`) is of that same rounded quantity.

More in the comment below the docstring.
"""
# Training (first step -> finished) is W / N seconds (perfect scaling of a fixed amount of work W,
# per GPU type) times a small lognormal noise; model load is 0 s (the dumps cannot carry it: no
# in-container events). Families (:data:`FAMILIES`), each with distinct parameters per GPU type:
#
# - ``light``: every phase lognormal (provision sigma 0.35 / 0.45).
# - ``heavy``: H100 provisioning is a lognormal body plus, with probability 0.20, a capacity-shortage
#   delay from a Lomax (Pareto II, shape 2.0: finite mean, infinite variance); H200 provisioning is a
#   shifted log-logistic of shape 3.0 (tail index 3). Pulls lognormal with sigma 0.45-0.5.

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

H100, H200 = "nvidia-h100-80gb", "nvidia-h200"
GPU_TYPES = (H100, H200)
TAILS = ("light", "heavy")
MIN_PROVISION_S = 10.0   # a fresh GPU node is never Ready sooner (the node object exists from +5 s)


@dataclass(frozen=True)
class Dist:
    """One phase's distribution; ``kind`` and its parameters (seconds)."""

    kind: str                 # lognormal | lognormal+lomax | loglogistic
    median: float = 0.0       # lognormal: median; loglogistic: scale (its median)
    sigma: float = 0.0        # lognormal sigma
    shift: float = 0.0        # added to every draw
    p: float = 0.0            # lognormal+lomax: probability of the extra delay
    alpha: float = 0.0        # lomax or loglogistic shape
    scale: float = 0.0        # lomax scale

    def draw(self, rng: np.random.Generator, size: Any) -> np.ndarray:
        if self.kind == "lognormal":
            x = self.median * np.exp(self.sigma * rng.standard_normal(size))
        elif self.kind == "lognormal+lomax":
            body = self.median * np.exp(self.sigma * rng.standard_normal(size))
            hit = rng.random(size) < self.p
            # Lomax by inversion: scale * (U^(-1/alpha) - 1)
            extra = self.scale * (rng.random(size) ** (-1.0 / self.alpha) - 1.0)
            x = body + np.where(hit, extra, 0.0)
        elif self.kind == "loglogistic":
            u = rng.random(size)
            x = self.median * (u / (1.0 - u)) ** (1.0 / self.alpha)
        else:
            raise ValueError(self.kind)
        return x + self.shift

    def describe(self) -> str:
        if self.kind == "lognormal":
            core = f"lognormal(median {self.median:g} s, sigma {self.sigma:g})"
        elif self.kind == "lognormal+lomax":
            core = (f"lognormal(median {self.median:g} s, sigma {self.sigma:g}) + with p={self.p:g} "
                    f"Lomax(shape {self.alpha:g}, scale {self.scale:g} s)")
        else:
            core = f"log-logistic(scale {self.median:g} s, shape {self.alpha:g})"
        return f"{self.shift:g} s + {core}" if self.shift else core


@dataclass(frozen=True)
class GpuModel:
    """One GPU type's phases in one family."""

    provision: Dist
    pull: Dist
    start: Dist
    overhead: Dist
    work_node_s: float        # training: work_node_s / N seconds at N nodes (perfect scaling)
    train_sigma: float = 0.06


_START = Dist("lognormal", median=4.0, sigma=0.35)
_OVERHEAD = Dist("lognormal", median=18.0, sigma=0.12)

FAMILIES: dict[str, dict[str, GpuModel]] = {
    "light": {
        H100: GpuModel(provision=Dist("lognormal", median=165.0, sigma=0.35),
                       pull=Dist("lognormal", median=70.0, sigma=0.30),
                       start=_START, overhead=_OVERHEAD, work_node_s=3600.0),
        H200: GpuModel(provision=Dist("lognormal", median=240.0, sigma=0.45),
                       pull=Dist("lognormal", median=55.0, sigma=0.40),
                       start=_START, overhead=_OVERHEAD, work_node_s=2400.0),
    },
    "heavy": {
        H100: GpuModel(provision=Dist("lognormal+lomax", median=150.0, sigma=0.30, p=0.20, alpha=2.0, scale=150.0),
                       pull=Dist("lognormal", median=70.0, sigma=0.45),
                       start=_START, overhead=_OVERHEAD, work_node_s=3600.0),
        H200: GpuModel(provision=Dist("loglogistic", median=170.0, alpha=3.0, shift=60.0),
                       pull=Dist("lognormal", median=55.0, sigma=0.50),
                       start=_START, overhead=_OVERHEAD, work_node_s=2400.0),
    },
}


def _whole(x: np.ndarray, floor: float = 0.0) -> np.ndarray:
    return np.maximum(np.rint(x), floor)


def draw_gangs(model: GpuModel, rng: np.random.Generator, runs: int, nodes: int) -> dict[str, np.ndarray]:
    """``runs`` gangs of ``nodes``: whole seconds per phase. Keys: overhead (runs,), provision, pull,
    start (runs, nodes), train (runs,); the order of draws is fixed, so a seed gives one history."""
    overhead = _whole(model.overhead.draw(rng, runs), 1.0)
    provision = _whole(model.provision.draw(rng, (runs, nodes)), MIN_PROVISION_S)
    pull = _whole(model.pull.draw(rng, (runs, nodes)), 1.0)
    start = _whole(model.start.draw(rng, (runs, nodes)), 1.0)
    train = _whole(model.work_node_s / nodes * np.exp(model.train_sigma * rng.standard_normal(runs)), 1.0)
    return {"overhead": overhead, "provision": provision, "pull": pull, "start": start, "train": train}


def spin_up(g: dict[str, np.ndarray]) -> np.ndarray:
    """Per gang: overhead + the slowest node's provision + pull + start (seconds)."""
    return g["overhead"] + np.max(g["provision"] + g["pull"] + g["start"], axis=1)


def history_rng(tail: str, gpu: str, nodes: int, runs: int, seed: int) -> np.random.Generator:
    """The seeded generator of one history: distinct per tail, GPU type, gang size, size and seed."""
    return np.random.default_rng([49, TAILS.index(tail), GPU_TYPES.index(gpu), nodes, runs, seed])


def history(tail: str, gpu: str, nodes: int, runs: int, seed: int) -> dict[str, np.ndarray]:
    return draw_gangs(FAMILIES[tail][gpu], history_rng(tail, gpu, nodes, runs, seed), runs, nodes)


def describe() -> dict[str, Any]:
    """Every family's parameters, in words (for the JSON and the docs)."""
    return {tail: {gpu: {"provision": m.provision.describe(), "pull": m.pull.describe(), "start": m.start.describe(),
                         "overhead": m.overhead.describe(),
                         "train": f"{m.work_node_s:g} node-s / N x lognormal(1, sigma {m.train_sigma:g})",
                         "load": "0 s (not representable in kubectl dumps)"}
                   for gpu, m in fam.items()} for tail, fam in FAMILIES.items()}
