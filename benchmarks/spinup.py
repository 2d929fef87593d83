"""What each spin-up cut buys: the default packaging vs ``--fuse gpu`` and ``--fuse all``, measured.

    python benchmarks/spinup.py [--pairs 5] [--backends direct] [--max-steps 60] [--json]

How to run it, what it prints and why: docs/internals/benchmarks.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from components import settings
from components.finetune_pipeline import build
from components.fusion import fuse
from llmpack.compare.stats import bootstrap_median_ci
from llmpack.run.local import RunOptions, run_pipeline

# label: (--fuse mode, warm-ahead on); the first is the default every other is compared with
VARIANTS = {"default": ("none", True), "fuse-gpu": ("gpu", True), "fuse-all": ("all", True),
            "fuse-all-nowarm": ("all", False)}
ADAPTER = Path("adapter") / "adapter_model.safetensors"


def model_load_s(summary: dict[str, Any]) -> float:
    return sum(ev["model_loaded"] - ev["process_started"] for ev in summary["events"].values()
               if "model_loaded" in ev and "process_started" in ev)


def fingerprint(summary: dict[str, Any]) -> tuple[str, str]:
    arts = summary["artifacts"]
    adapter = hashlib.sha256((Path(arts["model_dir"]) / ADAPTER).read_bytes()).hexdigest()
    metrics = (Path(arts["evaluate.metrics_dir"]) / "metrics.json").read_text()
    return adapter, metrics


def run_once(backend: str, label: str, root: Path, max_steps: int) -> dict[str, Any]:
    mode, warm = VARIANTS[label]
    before = os.environ.get(settings.WARM_AHEAD.name)
    os.environ[settings.WARM_AHEAD.name] = "1" if warm else "0"  # the step processes inherit it
    try:
        s = run_pipeline(RunOptions(backend=backend, fuse=mode, max_steps=max_steps, output_dir=root / "runs",
                                    tracking_uri=f"sqlite:///{root / 'mlflow.db'}", run_group="rg-spinup-bench"))
    finally:
        if before is None:
            os.environ.pop(settings.WARM_AHEAD.name)
        else:
            os.environ[settings.WARM_AHEAD.name] = before
    if s["status"] != "succeeded":
        raise SystemExit(f"{backend} {label}: {s['error']}")
    return s


def measure(backend: str, pairs: int, max_steps: int, root: Path) -> dict[str, Any]:
    labels = list(VARIANTS)
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in labels}
    prints: dict[str, set[tuple[str, str]]] = {v: set() for v in labels}
    for label in labels:  # warm-up round, not counted
        run_once(backend, label, root, max_steps)
    for i in range(pairs):
        for label in labels[i % len(labels):] + labels[: i % len(labels)]:
            s = run_once(backend, label, root, max_steps)
            m = s["metrics"]
            rows[label].append({"wall_s": m["total_s"], "spinup_s": m["spinup_s"], "ttfs_s": m["time_to_first_step_s"],
                                "model_load_s": model_load_s(s), "cost_usd": m.get("cost_usd")})
            prints[label].add(fingerprint(s))
            print(f"  {backend} round {i + 1}/{pairs} {label:<15} wall {m['total_s']:6.2f} s", file=sys.stderr,
                  flush=True)
    out: dict[str, Any] = {}
    default = labels[0]
    # each round's wall time over the default's in the same round: the rounds pair them
    ratios = {label: [r["wall_s"] / d["wall_s"] for r, d in zip(rows[label], rows[default], strict=True)]
              for label in labels}
    for label, (mode, _) in VARIANTS.items():
        col = rows[label]
        out[label] = {
            **{k: statistics.median(r[k] for r in col) for k in ("wall_s", "spinup_s", "ttfs_s", "model_load_s")},
            "cost_usd": (statistics.median(r["cost_usd"] for r in col)
                         if all(r["cost_usd"] is not None for r in col) else None),
            "pods_per_run": len(fuse(build(), mode).tasks),
            "wall_vs_default": statistics.median(ratios[label]),
            "wall_vs_default_ci95": bootstrap_median_ci(ratios[label]),
            "same_outputs_as_default": prints[label] == prints[default] and len(prints[default]) == 1,
            "n": len(col),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="rounds of every variant per path")
    parser.add_argument("--backends", default="direct")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmpack-spinup-"))
    started = time.time()
    result = {b: measure(b, args.pairs, args.max_steps, root) for b in args.backends.split(",")}
    if args.json:
        print(json.dumps({"pairs": args.pairs, "max_steps": args.max_steps, "seconds": time.time() - started,
                          "paths": result}, indent=2))
    else:
        print(f"{'path':<6} {'variant':<15} {'wall s':>6} {'vs dflt':>7} {'spin-up':>7} {'1st step':>8} "
              f"{'load s':>6} {'pods':>4} {'cost $':>8} same")
        for backend, variants in result.items():
            for label, r in variants.items():
                cost = f"{r['cost_usd']:.6f}" if r["cost_usd"] is not None else "-"
                print(f"{backend:<6} {label:<15} {r['wall_s']:6.2f} {(r['wall_vs_default'] - 1) * 100:+6.0f}% "
                      f"{r['spinup_s']:7.2f} {r['ttfs_s']:8.2f} {r['model_load_s']:6.2f} {r['pods_per_run']:4d} "
                      f"{cost:>8} {'yes' if r['same_outputs_as_default'] else 'NO'}")
        print(f"medians of {args.pairs} rounds per variant ({args.max_steps} steps), "
              f"{time.time() - started:.0f} s in all;")
        print("nowarm: warm-ahead off (LLMPACK_WARM_AHEAD=0)")
        for backend, variants in result.items():
            cis = [f"{label} {(ci[0] - 1) * 100:+.0f}% to {(ci[1] - 1) * 100:+.0f}%"
                   for label, r in list(variants.items())[1:] if (ci := r["wall_vs_default_ci95"])]
            if cis:
                print(textwrap.fill(f"{backend} vs dflt, 95% CI (rounds resampled): " + ", ".join(cis), 80))
    same = all(r["same_outputs_as_default"] for v in result.values() for r in v.values())
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
