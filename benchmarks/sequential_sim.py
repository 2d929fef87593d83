"""How often the default compare decides, and how long it takes: its real loop on this machine's noise.

    python benchmarks/sequential_sim.py [--compares 300] [--budget 270] [--margin 25%]

Runs :func:`llmpack.compare.until_decided.compare_until_decided` — the loop ``llmpack compare`` runs,
its design, budget and path dropping included — with each pipeline run replaced by a measured
start-up run resampled from ``tests/fixtures/noise/rounds.json`` (``benchmarks/noise_sample.py``)
and the clock advanced by that run's measured wall time (plus ``--full-extra`` seconds for a
round-1 run of the whole pipeline: 60 steps, evaluate, register). Prints, per path, how often
spin-up and time to first step were decided, and the compare's rounds and seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmpack.compare.comparison import parse_margins  # noqa: E402
from llmpack.compare.until_decided import DEFAULT_BUDGET_S, Path_, compare_until_decided  # noqa: E402
from llmpack.run.local import RunOptions  # noqa: E402

NOISE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "noise" / "rounds.json"


class Simulated:
    """One simulated compare's runs: measured start-up runs resampled by round, and a clock their walls advance."""

    def __init__(self, rng: random.Random, rounds: list[int], by: dict[tuple[int, str], dict[str, Any]],
                 full_extra: float) -> None:
        self.rng, self.rounds, self.by, self.full_extra = rng, rounds, by, full_extra
        self.now, self.round = 0.0, rng.choice(rounds)

    def clock(self) -> float:
        return self.now

    def run(self, opts: RunOptions, label: str, **kw: Any) -> dict[str, Any]:
        if opts.backend == "direct":  # a new round draws a new measured round: its paths share its conditions
            self.round = self.rng.choice(self.rounds)
        r = self.by[(self.round, opts.backend)]
        self.now += r["wall"] + (self.full_extra if kw.get("pipe") is None else 0.0)
        return {"pipeline_run": f"{opts.backend}-{self.now}", "orchestrator": opts.backend, "fuse": "none",
                "status": "succeeded", "error": None, "mode": "local", "tags": dict(kw.get("tags") or {}),
                "metrics": {"spinup_s": r["spinup_s"], "time_to_first_step_s": r["time_to_first_step_s"],
                            "total_s": r["total_s"] + self.full_extra, "cost_usd": 0.03}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compares", type=int, default=300)
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S)
    ap.add_argument("--margin", default=None)
    ap.add_argument("--full-extra", type=float, default=16.0,
                    help="seconds a whole-pipeline run takes beyond a start-up run (60 steps, evaluate, register)")
    args = ap.parse_args()
    rows = [r for r in json.loads(NOISE.read_text())["rows"] if r["round"] > 0 and r["status"] == "succeeded"]
    rounds = sorted({r["round"] for r in rows if sum(x["round"] == r["round"] for x in rows) == 4})
    by = {(r["round"], r["path"]): r for r in rows}
    paths = [Path_(backend=b, fuse="none") for b in ("direct", "kfp", "argo", "mlflow")]
    rng = random.Random(0)
    decided: Counter[str] = Counter()
    n_rounds, seconds, all_decided = [], [], 0
    for _ in range(args.compares):
        sim = Simulated(rng, rounds, by, args.full_extra)
        result = compare_until_decided(RunOptions(), paths, run=sim.run, run_group="rg-sim", baseline="direct",
                                       budget_s=args.budget, margins=parse_margins(args.margin),
                                       say=lambda line: None, clock=sim.clock)
        ok = True
        for p in paths[1:]:
            both = all(result["verdicts"][m][p.label]["verdict"] != "undecided"
                       for m in ("spinup_s", "time_to_first_step_s"))
            decided[p.label] += both
            ok &= both
        all_decided += ok
        n_rounds.append(result["rounds"])
        seconds.append(sim.now)
    print(f"{args.compares} simulated default compares (budget {args.budget:.0f} s, "
          f"margin {args.margin or 'default 25%'}), "
          f"noise from {NOISE.relative_to(Path.cwd()) if NOISE.is_relative_to(Path.cwd()) else NOISE}:")
    for p in paths[1:]:
        print(f"  {p.label:7s} spin-up and time to first step decided: {decided[p.label] / args.compares:.0%}")
    print(f"  every path decided: {all_decided / args.compares:.0%}; rounds median {statistics.median(n_rounds):.0f} "
          f"(max {max(n_rounds)}); seconds of runs median {statistics.median(seconds):.0f} (max {max(seconds):.0f})")


if __name__ == "__main__":
    main()
