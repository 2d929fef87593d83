"""What each spin-up cut buys: the default packaging vs ``--fuse gpu`` and ``--fuse all``, measured.

    python benchmarks/spinup.py [--pairs 5] [--backends direct] [--max-steps 60] [--json]

For each path, ``--pairs`` rounds run the default and every fused variant once each, the order
rotated every round (so drift and page-cache warmth spread over all variants), after one
uncounted warm-up round. Per variant it prints medians of: wall time (``total_s``, submit to
the end of the run's record), spin-up, time to first step, model-load time (every step's
``model_loaded - process_started``, summed), step processes (pods on a cluster) per run, and the
projected cost; then the median over rounds of each variant's wall time relative to the
default's in the same round ("paired"). It checks that every variant's adapter and eval metrics
equal the default's, byte for byte, and exits 1 when one does not.

Pods per run on a cluster are what the compiled artifacts create: one per task (KFP adds its
driver pods; MLflow's Kubernetes path is one Job pod whatever the fusion); ``tests/test_fusion.py``
checks the compiled task counts and ``tests/test_fusion_cluster.py`` the pods on the loopback cluster.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from components.fusion import fuse
from components.pipeline import build
from llmpack.runs import RunOptions, run_pipeline

VARIANTS = ("none", "gpu", "all")
LABEL = {"none": "default", "gpu": "fuse-gpu", "all": "fuse-all"}
ADAPTER = Path("adapter") / "adapter_model.safetensors"


def model_load_s(summary: dict[str, Any]) -> float:
    return sum(ev["model_loaded"] - ev["process_started"] for ev in summary["events"].values()
               if "model_loaded" in ev and "process_started" in ev)


def fingerprint(summary: dict[str, Any]) -> tuple[str, str]:
    arts = summary["artifacts"]
    adapter = hashlib.sha256((Path(arts["model_dir"]) / ADAPTER).read_bytes()).hexdigest()
    metrics = (Path(arts["evaluate.metrics_dir"]) / "metrics.json").read_text()
    return adapter, metrics


def run_once(backend: str, mode: str, root: Path, max_steps: int) -> dict[str, Any]:
    s = run_pipeline(RunOptions(backend=backend, fuse=mode, max_steps=max_steps, output_dir=root / "runs",
                                tracking_uri=f"sqlite:///{root / 'mlflow.db'}", run_group="rg-spinup-bench"))
    if s["status"] != "succeeded":
        raise SystemExit(f"{backend} {LABEL[mode]}: {s['error']}")
    return s


def measure(backend: str, pairs: int, max_steps: int, root: Path) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in VARIANTS}
    prints: dict[str, set[tuple[str, str]]] = {m: set() for m in VARIANTS}
    for mode in VARIANTS:  # warm-up round, not counted
        run_once(backend, mode, root, max_steps)
    for i in range(pairs):
        order = VARIANTS[i % len(VARIANTS):] + VARIANTS[: i % len(VARIANTS)]
        for mode in order:
            s = run_once(backend, mode, root, max_steps)
            m = s["metrics"]
            rows[mode].append({"wall_s": m["total_s"], "spinup_s": m["spinup_s"], "ttfs_s": m["time_to_first_step_s"],
                               "model_load_s": model_load_s(s), "cost_usd": m.get("cost_usd")})
            prints[mode].add(fingerprint(s))
            print(f"  {backend} round {i + 1}/{pairs} {LABEL[mode]:<9} wall {m['total_s']:6.2f} s", file=sys.stderr, flush=True)
    out: dict[str, Any] = {}
    for mode in VARIANTS:
        col = rows[mode]
        out[LABEL[mode]] = {
            **{k: statistics.median(r[k] for r in col) for k in ("wall_s", "spinup_s", "ttfs_s", "model_load_s")},
            "cost_usd": statistics.median(r["cost_usd"] for r in col) if all(r["cost_usd"] is not None for r in col) else None,
            "processes_per_run": len(fuse(build(), mode).tasks),
            "wall_vs_default": statistics.median(r["wall_s"] / d["wall_s"] for r, d in zip(col, rows["none"], strict=True)),
            "same_outputs_as_default": prints[mode] == prints["none"] and len(prints["none"]) == 1,
            "n": len(col),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="rounds of (default, fuse-gpu, fuse-all) per path")
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
        print(f"{'path':<8} {'variant':<9} {'wall s':>7} {'vs default':>10} {'spin-up':>7} {'1st step':>8} "
              f"{'load s':>6} {'procs':>5} {'cost $':>9} same")
        for backend, variants in result.items():
            for label, r in variants.items():
                cost = f"{r['cost_usd']:.6f}" if r["cost_usd"] is not None else "-"
                print(f"{backend:<8} {label:<9} {r['wall_s']:7.2f} {(r['wall_vs_default'] - 1) * 100:+9.0f}% "
                      f"{r['spinup_s']:7.2f} {r['ttfs_s']:8.2f} {r['model_load_s']:6.2f} {r['processes_per_run']:5d} "
                      f"{cost:>9} {'yes' if r['same_outputs_as_default'] else 'NO'}")
        print(f"medians of {args.pairs} rounds per variant ({args.max_steps} steps), {time.time() - started:.0f} s in all")
    same = all(r["same_outputs_as_default"] for v in result.values() for r in v.values())
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
