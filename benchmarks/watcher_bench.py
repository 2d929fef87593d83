"""Pod watcher throughput and memory: one run group of 1,000 pods, 10,000 and 20,000 watch events.

The stand-in Kubernetes API (tests/standins/k8s_api.py) runs in a separate process and streams a
synthetic run group live over its watch protocol; this process runs the real kubernetes client
and :class:`llmpack.k8s.watcher.PodWatcher` until every pod has terminated. It prints events/s
processed and the peak Python memory (tracemalloc) of the watching process, for 10,000 and
20,000 events over the same 1,000 pods: the peaks should be about equal, because the watcher
keeps one (trimmed) object per pod, not per event.

    python benchmarks/watcher_bench.py [--pods 1000] [--events 10000,20000]

Loopback only; finishes in well under a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
TOKEN = "bench-token"
NAMESPACE = "llmpack"
RUN_GROUP = "bench"


def _serve(pods: int, events: int) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "standins.k8s_api", "--synthetic", f"{pods},{events}", "--token", TOKEN,
         "--namespace", NAMESPACE, "--run-group", RUN_GROUP, "--watches", "1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        raise SystemExit(f"stand-in did not start (got {url!r})")
    return proc, url


def measure(pods: int, events: int, *, trace: bool) -> dict[str, float]:
    from llmpack.k8s.api import build_api_client
    from llmpack.k8s.podphases import all_terminated
    from llmpack.k8s.watcher import PodWatcher

    proc, url = _serve(pods, events)
    try:
        client = build_api_client(host=url, token=TOKEN)
        watcher = PodWatcher(client, NAMESPACE, RUN_GROUP, window_s=30)
        if trace:
            tracemalloc.start()
            tracemalloc.reset_peak()
        start = time.perf_counter()
        rows = watcher.run(until=all_terminated(min_pods=pods), timeout_s=120)
        elapsed = time.perf_counter() - start
        retained, peak = tracemalloc.get_traced_memory() if trace else (0, 0)  # watcher + rows still alive
        if trace:
            tracemalloc.stop()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    if watcher.stopped_by != "condition" or len(rows) != pods:
        raise SystemExit(f"watch did not complete: {watcher.stopped_by}, {len(rows)} rows, {watcher.stats}")
    done = sum(1 for r in rows if r["phase"] == "Succeeded" and r["start_s"] is not None and r["node"])
    return {
        "events": watcher.stats["events"],
        "seconds": elapsed,
        "events_per_s": watcher.stats["events"] / elapsed,
        "peak_mib": peak / 2**20,
        "retained_mib": retained / 2**20,
        "pods_kept": watcher.pod_count,
        "complete_rows": done,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--events", default="10000,20000", help="comma-separated event counts (same pods)")
    args = parser.parse_args(argv)
    sys.path[:0] = [str(ROOT)]
    counts = [int(x) for x in args.events.split(",")]

    print(f"PodWatcher: 1 run group, {args.pods} pods, real kubernetes client, stand-in API in another process")
    t0 = time.perf_counter()
    fast = measure(args.pods, counts[0], trace=False)
    print(
        f"  throughput  {fast['events']:>6} events in {fast['seconds']:.2f} s = {fast['events_per_s']:,.0f} events/s "
        "(end to end, no tracemalloc)"
    )
    peaks = []
    for count in counts:
        result = measure(args.pods, count, trace=True)
        peaks.append(result["peak_mib"])
        print(
            f"  memory      {result['events']:>6} events: peak {result['peak_mib']:.1f} MiB "
            f"({result['peak_mib'] * 2**20 / args.pods / 1024:.1f} KiB/pod), retained {result['retained_mib']:.1f} MiB, "
            f"{result['pods_kept']} pods kept, "
            f"{result['complete_rows']} complete rows, {result['events_per_s']:,.0f} events/s under tracemalloc"
        )
    if len(peaks) > 1:
        print(
            f"  peak ratio  {counts[-1]:,} vs {counts[0]:,} events: {peaks[-1] / peaks[0]:.2f}x "
            f"(events ratio {counts[-1] / counts[0]:.1f}x): memory follows pods, not events"
        )
    print(f"  total       {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
