"""How long `llmpack project`'s model takes as the measured nodes grow, and how well its intervals cover.

    PYTHONPATH=$PWD python benchmarks/project_bench.py [--samples 100,1000,10000] [--trials 40] \\
        [--coverage-samples 24,100]

Part 1 (speed): one path projected to 1..32 nodes at p50/p90/p99 (2000 bootstrap resamples) from
n synthetic node samples; prints the wall seconds per projection. Part 2 (coverage): for an
exponential and a lognormal node distribution, ``--trials`` seeded sets of n node samples
(``--coverage-samples``: 24 is 12 2-node gangs), the share of 8- and 16-node true gang quantiles
inside the projected 95% interval (closed form for the exponential, a 200 000-gang simulation for
the lognormal). A figure well below 0.95 says the interval is optimistic there (docs/plan.md:
"when not to trust it").
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from llmpack.cluster.plan.project.fit import PathFit
from llmpack.cluster.plan.project.model import project_path

SIZES, QS = [1, 2, 4, 8, 16, 32], [0.5, 0.9, 0.99]


def a_fit(ready: np.ndarray) -> PathFit:
    runs = max(2, len(ready) // 2)
    return PathFit(path="bench", runs=runs, gang_sizes=(2,), ready_s=tuple(float(v) for v in ready),
                   billed_s=(0.0,) * len(ready), overhead_s=(0.0,) * runs, first_step_s=(0.0,) * runs,
                   train_s=3600.0, gpus_per_node=8, price_per_gpu_hour=2.0, phases={})


def speed(samples: list[int]) -> None:
    rng = np.random.default_rng(0)
    for n in samples:
        fit = a_fit(rng.exponential(60.0, size=n))
        start = time.perf_counter()
        project_path(fit, SIZES, QS)
        print(f"speed: {n:>6} node samples -> {len(SIZES)} sizes x {len(QS)} quantiles in "
              f"{time.perf_counter() - start:.2f} s")


def coverage(trials: int, n: int) -> None:
    sim = np.random.default_rng(99)
    lognormal_truth = {(n, q): float(np.quantile(np.max(sim.lognormal(0.0, 0.6, size=(200_000, n)), axis=1), q))
                       for n in (8, 16) for q in (0.5, 0.9)}
    cases = {"exponential": (lambda rng: rng.exponential(1.0, size=n),
                             lambda n, q: -math.log(1.0 - q ** (1.0 / n))),
             "lognormal(0.6)": (lambda rng: rng.lognormal(0.0, 0.6, size=n), lambda n, q: lognormal_truth[(n, q)])}
    for name, (draw, truth) in cases.items():
        inside = total = 0
        for t in range(trials):
            rows = project_path(a_fit(draw(np.random.default_rng(1000 + t))), [8, 16], [0.5, 0.9], resamples=1000)
            for row in rows:
                for label, q in (("p50", 0.5), ("p90", 0.9)):
                    e = row.gang_ready[label]
                    inside += e.low <= truth(row.nodes, q) <= e.high
                    total += 1
        print(f"coverage: {name:<15} {n} node samples, 8/16 nodes, p50/p90: {inside / total:.2f} of {total}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default="100,1000,10000")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--coverage-samples", default="24,100", help="node samples per coverage trial")
    args = parser.parse_args()
    speed([int(v) for v in args.samples.split(",")])
    for n in args.coverage_samples.split(","):
        coverage(args.trials, int(n))


if __name__ == "__main__":
    main()
