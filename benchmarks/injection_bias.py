"""Is a planted start delay measured as exactly what was planted? Paired runs with and without it.

    python benchmarks/injection_bias.py [--pairs N] [--delay S] [--max-steps N] [--backends direct,argo]

For each path, one discarded warm-up run, then N back-to-back pairs (baseline, injected; the
order alternates so a drift in machine load does not favour one side). Per pair it prints
Δspinup and Δttfs (injected − baseline) and the finetune step's phases after its process
start (start -> model_loaded, model_loaded -> first_step), then the medians. With an unbiased
injection both Δ equal the planted delay and the phases are the same with and without it.
The load average is printed before and after, as the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from components import settings
from llmpack.run.local import RunOptions, run_pipeline


def one(backend: str, root: Path, delay: float | None, max_steps: int) -> dict[str, float]:
    env = {settings.INJECT_START_DELAY.name: f"finetune={delay}"} if delay else None
    s = run_pipeline(RunOptions(backend=backend, max_steps=max_steps, output_dir=root / "runs",
                                tracking_uri=f"sqlite:///{root / 'mlflow.db'}"), env=env)
    if s["status"] != "succeeded":
        raise SystemExit(f"{backend}: {s['error']}")
    ev = s["events"]["finetune"]
    return {"spin": s["metrics"]["spinup_s"], "ttfs": s["metrics"]["time_to_first_step_s"],
            "load": ev["model_loaded"] - ev["process_started"], "train": ev["first_step"] - ev["model_loaded"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--delay", type=float, default=2.0)
    parser.add_argument("--max-steps", type=int, default=1)
    parser.add_argument("--backends", default="direct,argo")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmpack-injection-"))
    print(f"load average before: {os.getloadavg()}  planted delay {args.delay} s", flush=True)
    for backend in args.backends.split(","):
        one(backend, root, None, args.max_steps)  # warm-up, discarded
        d_spin, d_ttfs, d_work = [], [], []
        print(f"\n{backend}: pair  Δspinup  Δttfs  Δttfs-Δspin | base load/train   injected load/train")
        for i in range(args.pairs):
            order = (None, args.delay) if i % 2 == 0 else (args.delay, None)
            got = {d: one(backend, root, d, args.max_steps) for d in order}
            b, j = got[None], got[args.delay]
            d_spin.append(j["spin"] - b["spin"])
            d_ttfs.append(j["ttfs"] - b["ttfs"])
            d_work.append(d_ttfs[-1] - d_spin[-1])
            print(f"{backend}: {i + 1:>4}  {d_spin[-1]:7.3f}  {d_ttfs[-1]:5.3f}  {d_work[-1]:+11.3f} | "
                  f"{b['load']:.3f}/{b['train']:.3f}        {j['load']:.3f}/{j['train']:.3f}", flush=True)
        print(f"{backend}: median Δspinup {statistics.median(d_spin):.3f}  Δttfs {statistics.median(d_ttfs):.3f}  "
              f"Δttfs-Δspin {statistics.median(d_work):+.3f}  (spread of Δttfs-Δspin: "
              f"{min(d_work):+.3f}..{max(d_work):+.3f})", flush=True)
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
