"""Start-up rounds on this machine: the noise the sequential compare's simulations are drawn from.

    python benchmarks/noise_sample.py --rounds 8 --out tests/fixtures/noise/rounds.json

Runs ``--rounds`` interleaved rounds (plus one warm-up round, kept with ``round`` 0) of every
local path through finetune's first step — what ``llmpack compare`` repeats after its full round
(:mod:`llmpack.compare.until_decided`) — and writes each run's spin-up, time to first step, total and
wall seconds. ``tests/llmpack/compare/test_sequential.py`` resamples them (A/A and planted-delay
simulations); ``benchmarks/sequential_sim.py`` prints how many rounds the default compare needs.
Run it on a quiet machine: the noise of a loaded one is another machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components.finetune_pipeline import build  # noqa: E402
from components.record.telemetry import TRAIN_STEP  # noqa: E402
from llmpack.run.local import RunOptions, run_pipeline  # noqa: E402

PATHS = ("direct", "kfp", "argo", "mlflow")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/noise/rounds.json"))
    args = ap.parse_args()
    probe = build().through(TRAIN_STEP)
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmpack-noise-") as tmp:
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{tmp}/mlflow.db")
        for k in range(args.rounds + 1):
            for path in PATHS:
                t0 = time.monotonic()
                s = run_pipeline(RunOptions(backend=path, max_steps=1, output_dir=Path(tmp) / "runs"), probe)
                m = s["metrics"]
                rows.append({"round": k, "path": path, "status": s["status"], "wall": round(time.monotonic() - t0, 3),
                             **{key: m.get(key) for key in ("spinup_s", "time_to_first_step_s", "total_s")}})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    doc = {"what": "start-up rounds (pipeline through finetune's first step), round 0 = warm-up, not used",
           "command": f"python benchmarks/noise_sample.py --rounds {args.rounds}",
           "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
           "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".partial")
    tmp_out.write_text(json.dumps(doc, indent=1) + "\n")
    tmp_out.replace(args.out)
    print(f"wrote {args.out} ({len(rows)} runs)")


if __name__ == "__main__":
    main()
