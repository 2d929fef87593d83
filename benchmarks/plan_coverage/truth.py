"""Monte-Carlo truth of every generator: the true p50 and p90 of gang spin-up and total time.

    python benchmarks/plan_coverage/truth.py [--gangs 1000000] [--out benchmarks/plan_coverage/truth.json]

Per family, GPU type and gang size N in :data:`SIZES`: ``--gangs`` gangs drawn by the very sampler the
histories use (:func:`generators.draw_gangs`, phases in whole seconds), in 10 batches of independent
seeds; the quantile of all of them is the truth, and the batches' spread gives its Monte-Carlo
standard error (sd of the 10 batch quantiles / sqrt(10)). Headlines:

- ``spin_up_s``: overhead + the slowest node's provision + pull + start (what ``plan`` calls spin-up;
  also its time to first step, as the generators' load is 0 s);
- ``total_s``: spin-up + training, training = the GPU type's work / N (perfect scaling): a stated
  prior, the only way an 8-node total is defined from 2-node runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from generators import FAMILIES, GPU_TYPES, TAILS, describe, draw_gangs, spin_up

SIZES = (2, 8)
QUANTILES = {"p50": 0.5, "p90": 0.9}
BATCHES = 10
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "truth.json"


def truth_of(tail: str, gpu: str, nodes: int, gangs: int) -> dict[str, dict[str, dict[str, float]]]:
    """{headline: {p50|p90: {"value", "mc_se"}}} of one generator at one gang size."""
    per = gangs // BATCHES
    batches: dict[str, list[np.ndarray]] = {"spin_up_s": [], "total_s": []}
    for b in range(BATCHES):
        rng = np.random.default_rng([4949, TAILS.index(tail), GPU_TYPES.index(gpu), nodes, b])
        g = draw_gangs(FAMILIES[tail][gpu], rng, per, nodes)
        up = spin_up(g)
        batches["spin_up_s"].append(up)
        batches["total_s"].append(up + g["train"])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for head, parts in batches.items():
        allv = np.concatenate(parts)
        out[head] = {}
        for name, q in QUANTILES.items():
            each = [float(np.quantile(p, q)) for p in parts]
            out[head][name] = {"value": round(float(np.quantile(allv, q)), 3),
                               "mc_se": round(float(np.std(each, ddof=1) / np.sqrt(BATCHES)), 3)}
    return out


def compute(gangs: int) -> dict[str, Any]:
    table = {tail: {gpu: {str(n): truth_of(tail, gpu, n, gangs) for n in SIZES} for gpu in GPU_TYPES}
             for tail in TAILS}
    return {"gangs_per_cell": gangs, "batches": BATCHES, "families": describe(), "truth": table}


def load(path: Path = DEFAULT_OUT) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gangs", type=int, default=1_000_000, help="simulated gangs per cell (at least 200000)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    if a.gangs < 200_000:
        print("--gangs: at least 200000", file=sys.stderr)
        return 2
    doc = compute(a.gangs)
    a.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    for tail, by_gpu in doc["truth"].items():
        for gpu, by_n in by_gpu.items():
            for n, heads in by_n.items():
                s, t = heads["spin_up_s"], heads["total_s"]
                print(f"{tail:5} {gpu:16} N={n}: spin-up p50 {s['p50']['value']:7.1f} (se {s['p50']['mc_se']:.2f}) "
                      f"p90 {s['p90']['value']:7.1f} (se {s['p90']['mc_se']:.2f}); total p50 {t['p50']['value']:7.1f} "
                      f"p90 {t['p90']['value']:7.1f}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
