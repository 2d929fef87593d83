"""Per-node paces drawn from distributions, for the fake cluster's TrainJob gangs.

By default :class:`~standins.fake_cluster.FakeCluster` cycles fixed per-node paces
(``Timings.gang_*``), which is what the exact-to-the-second gang tests want. To check a
*projection* (``llmpack project``: from measured small gangs to large ones) the paces must
instead be independent draws from a distribution, as a cloud's are: pass
``node_paces=NodePaces(...)`` and every gang node gets its own seeded draw of node creation,
node Ready, image pull and container start.

Durations are whole virtual seconds (Kubernetes stamps whole seconds); virtual time costs no
wall time, so a heavy tail of minutes is as cheap to play as a light one.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

Draw = Callable[[random.Random], float]


def uniform(low: float, high: float) -> Draw:
    """A light tail: every value between ``low`` and ``high`` equally likely."""
    return lambda rng: rng.uniform(low, high)


def exponential(base: float, mean_excess: float) -> Draw:
    """``base`` plus an exponential excess of mean ``mean_excess``."""
    return lambda rng: base + rng.expovariate(1.0 / mean_excess)


def lognormal(median: float, sigma: float) -> Draw:
    """A heavy (lognormal) tail: ``median`` times ``exp(N(0, sigma))``."""
    return lambda rng: median * math.exp(rng.gauss(0.0, sigma))


def fixed(value: float) -> Draw:
    return lambda rng: value


@dataclass
class NodePaces:
    """Seeded draws of one gang node's (node_create_s, node_ready_s, pull_s, start_s), whole seconds >= 1
    (start >= 0). One generator for the whole cluster, so runs draw in the order they are played."""

    node_create: Draw = field(default_factory=lambda: fixed(1))
    node_ready: Draw = field(default_factory=lambda: uniform(4, 12))
    pull: Draw = field(default_factory=lambda: uniform(3, 9))
    start: Draw = field(default_factory=lambda: fixed(1))
    seed: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()

    def draw(self) -> tuple[int, int, int, int]:
        with self._lock:
            values = [f(self._rng) for f in (self.node_create, self.node_ready, self.pull, self.start)]
        create, ready, pull, start = (max(0, round(v)) for v in values)
        return max(1, create), max(1, ready), max(1, pull), start
