"""What sampling the GPUs costs a GPU step (components.record.gpu_metrics), measured.

    python benchmarks/gpu_sampler.py [--rounds 5] [--seconds 3] [--interval 1.0]

Uses the real source where there is one (NVML, else ``nvidia-smi``); on a machine without a GPU
the stand-in ``nvidia-smi`` of the tests (tests/standins/nvidia_smi.py: a shell script, so its
read cost is a process start, near the real tool's floor) and says so. Printed: the median cost
of one read; the reading time per second of step at ``--interval``; and a
pure-Python CPU loop's rate with the sampler running against without it (rounds alternate), as
the median slowdown. The step never waits on a read: the sampler runs on its own thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from standins import nvidia_smi  # noqa: E402

from components.record import gpu_metrics  # noqa: E402


def loop_rate(seconds: float) -> float:
    """Iterations per second of a CPU-bound Python loop (what competes with the sampler for the GIL)."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    return n / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpu-sampler-"))
    source, what = gpu_metrics.nvml_source(), "NVML"
    if source is None:
        source, what = gpu_metrics.smi_source(), "nvidia-smi"
    if source is None:
        source, what = (gpu_metrics.smi_source(str(nvidia_smi.install(tmp / "bin", gpus=8))),
                        "the stand-in nvidia-smi (no GPU here)")
    assert source is not None
    reads = []
    for _ in range(20):
        t0 = time.perf_counter()
        source()
        reads.append(time.perf_counter() - t0)
    print(f"source: {what}; one read of {len(source())} GPU(s): median {statistics.median(reads) * 1000:.1f} ms")
    bare, sampled, counts = [], [], []
    for n in range(args.rounds):
        bare.append(loop_rate(args.seconds))
        sampler = gpu_metrics.Sampler(source, tmp / f"s{n}.jsonl", interval=args.interval, step="bench").start()
        sampled.append(loop_rate(args.seconds))
        counts.append(len(sampler.stop()))
    slow = statistics.median((b - s) / b for b, s in zip(bare, sampled, strict=True))
    print(f"sampler at {args.interval:g} s: ~{statistics.median(reads) / args.interval * 1000:.1f} ms of reading per "
          f"second of step ({statistics.median(counts):.0f} samples per {args.seconds:g} s round)")
    print(f"CPU loop with the sampler vs without: {slow:+.2%} median slowdown over {args.rounds} rounds "
          "(noise: a quiet machine)")


if __name__ == "__main__":
    main()
