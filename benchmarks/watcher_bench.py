"""Pod watcher throughput and memory: one run group of 1,000 pods, 10,000 and 50,000 watch events.

The stand-in Kubernetes API (tests/standins/k8s_api.py) runs in a separate process and streams a
synthetic run group over its watch protocol; this process runs the real kubernetes client and
:class:`llmpack.cluster.k8s.watcher.PodWatcher` until every pod has terminated (list, watch, node reads,
image-pull events and the final analysis all inside the timed window).

How to run it, what it prints and why: docs/internals/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
TOKEN = "bench-token"
NAMESPACE = "llmpack"
RUN_GROUP = "bench"


def _serve(pods: int, events: int, *, live: bool) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "standins.k8s_api", "--synthetic", f"{pods},{events}", "--token", TOKEN,
         "--namespace", NAMESPACE, "--run-group", RUN_GROUP, "--watches", "2", "--pulls-in-stream",
         *(() if live else ("--burst",))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()  # printed once the burst is rendered: the clock starts after
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        raise SystemExit(f"stand-in did not start (got {url!r})")
    return proc, url


def measure(pods: int, events: int, *, trace: bool, live: bool = False) -> dict[str, float]:
    from llmpack.cluster.k8s.api import build_api_client
    from llmpack.cluster.k8s.podphases import all_terminated
    from llmpack.cluster.k8s.watcher import PodWatcher

    proc, url = _serve(pods, events, live=live)
    try:
        client = build_api_client(host=url, token=TOKEN)
        watcher = PodWatcher(client, NAMESPACE, RUN_GROUP, window_s=30)
        if trace:
            tracemalloc.start()
            tracemalloc.reset_peak()
        start, cpu = time.perf_counter(), time.process_time()
        rows = watcher.run(until=all_terminated(min_pods=pods), timeout_s=120)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        retained, peak = tracemalloc.get_traced_memory() if trace else (0, 0)  # watcher + rows still alive
        if trace:
            tracemalloc.stop()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    pulled = sum(1 for r in rows if r["image_pull_s"] is not None)
    if watcher.stopped_by != "condition" or len(rows) != pods or pulled != pods:
        raise SystemExit(f"watch did not complete: {watcher.stopped_by}, {len(rows)} rows, {pulled} pull times, "
                         f"{watcher.stats}")
    done = sum(1 for r in rows if r["phase"] == "Succeeded" and r["start_s"] is not None and r["node"])
    return {
        "events": watcher.stats["events"],
        "seconds": elapsed,
        "events_per_s": watcher.stats["events"] / elapsed,
        "cpu_s": cpu,  # this process's CPU time, all threads: steadier than the wall on a busy machine
        "peak_mib": peak / 2**20,
        "retained_mib": retained / 2**20,
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "pods_kept": watcher.pod_count,
        "complete_rows": done,
        "pull_events": watcher.event_stats["events"],  # by the event watch, beside the pod events
        "event_listings": watcher.event_stats["listings"],
    }


def _in_fresh_process(pods: int, events: int, live: bool) -> dict[str, Any]:
    """One traced measurement in a new interpreter: its peaks owe nothing to an earlier run."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", f"{pods},{events}", *(("--live",) if live else ())]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--events", default="10000,50000", help="comma-separated event counts (same pods)")
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs at the first event count")
    parser.add_argument("--live", action="store_true", help="the stand-in makes events while the watch runs")
    parser.add_argument("--no-memory", action="store_true", help="throughput only")
    parser.add_argument("--marginal", action="store_true",
                        help="after each throughput run, one at the last event count: the rate of the extra events")
    parser.add_argument("--child", metavar="PODS,EVENTS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path[:0] = [str(ROOT)]
    if args.child:
        pods, events = (int(x) for x in args.child.split(","))
        print(json.dumps(measure(pods, events, trace=True, live=args.live)))
        return 0
    counts = [int(x) for x in args.events.split(",")]

    how = "made live by the stand-in" if args.live else "rendered before the clock, sent as one backlog"
    print(f"PodWatcher: 1 run group, {args.pods} pods, real kubernetes client, stand-in API in another process, "
          f"events {how}; load average {os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    rates, per_cpu, marginal = [], [], []
    for _ in range(max(1, args.repeats)):
        fast = measure(args.pods, counts[0], trace=False, live=args.live)
        rates.append(fast["events_per_s"])
        per_cpu.append(fast["events"] / fast["cpu_s"])
        print(f"  throughput  {fast['events']:>6} events in {fast['seconds']:.2f} s = "
              f"{fast['events_per_s']:,.0f} events/s; "
              f"{fast['cpu_s']:.2f} CPU s = {per_cpu[-1]:,.0f} events per CPU s; "
              f"+{fast['pull_events']:,} pull events watched, {fast['event_listings']} listing(s)")
        if args.marginal and len(counts) > 1:
            # the same pods with more events, right after: the difference is what the extra events cost
            more = measure(args.pods, counts[-1], trace=False, live=args.live)
            marginal.append((more["events"] - fast["events"]) / max(1e-9, more["seconds"] - fast["seconds"]))
            print(f"  throughput  {more['events']:>6} events in {more['seconds']:.2f} s = "
                  f"{more['events_per_s']:,.0f} events/s; "
                  f"the {more['events'] - fast['events']:,} more: {marginal[-1]:,.0f} events/s")
    print(f"  throughput  median {statistics.median(rates):,.0f} events/s, best {max(rates):,.0f}; "
          f"median {statistics.median(per_cpu):,.0f} events per CPU s ({len(rates)} runs, end to end, no tracemalloc)")
    if marginal:
        print(f"  per event   median {statistics.median(marginal):,.0f} events/s for the events beyond the first "
              f"{counts[0]:,} (the fixed costs, list, node reads, event listing and analyses, taken out)")
    peaks = []
    for count in [] if args.no_memory else counts:
        result = _in_fresh_process(args.pods, count, args.live)
        peaks.append(result["peak_mib"])
        print(
            f"  memory      {result['events']:>6} events: peak {result['peak_mib']:.1f} MiB "
            f"({result['peak_mib'] * 2**20 / args.pods / 1024:.1f} KiB/pod), "
            f"retained {result['retained_mib']:.1f} MiB, "
            f"maxrss {result['maxrss_mib']:.0f} MiB, {result['pods_kept']} pods kept, "
            f"{result['complete_rows']} complete rows, {result['events_per_s']:,.0f} events/s under tracemalloc"
        )
    if len(peaks) > 1:
        print(
            f"  peak ratio  {counts[-1]:,} vs {counts[0]:,} events: {peaks[-1] / peaks[0]:.2f}x "
            f"(events ratio {counts[-1] / counts[0]:.1f}x): memory follows pods, not events"
        )
    print(f"  total       {time.perf_counter() - t0:.1f} s, load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
