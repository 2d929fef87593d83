"""The pod watcher under load: 50,000 watch events, a 410 Gone every 1,000; no pod lost, memory O(pods).

    python benchmarks/watcher_load.py [--pods 100,1000] [--events 10000,50000] [--expire-every 1000] [--gap 10]
                                      [--timeout 600] [--json]

How to run it, what it prints and why: docs/internals/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
TOKEN = "load-token"
NAMESPACE = "llmpack"
RUN_GROUP = "load"
REWATCH_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------- the stand-in side (child process)


class Player:
    """Plays ``stream`` into the stand-in: a compaction every ``every`` events, ``gap`` events hidden behind it."""

    def __init__(self, api: Any, stream: Iterator[dict[str, Any]], total: int, every: int, gap: int) -> None:
        self.api, self.stream, self.total, self.every, self.gap = api, stream, total, every, gap
        self.played = 0
        self.expiries = 0
        self.last_phase: dict[str, str] = {}
        self.stopped = False
        self._requests_seen = 0

    def _apply(self, state: dict[str, Any]) -> None:
        self.api.apply_pod(state)
        self.played += 1
        self.last_phase[state["metadata"]["name"]] = state["status"]["phase"]

    def run(self) -> None:
        for state in self.stream:
            if self.stopped:
                return
            self._apply(state)
            if self.every and self.played % self.every == 0 and self.total - self.played > self.gap:
                self._expire()

    def _expire(self) -> None:
        # Holding the stand-in's lock, the open watch cannot send the gap's events before its 410:
        # when it wakes it sees the compaction first, and the gap is only in what a re-list returns.
        with self.api._cond:
            self.api.expire()
            compacted = self.api.resource_version
            for state in itertools.islice(self.stream, self.gap):
                self._apply(state)
        self.expiries += 1
        self._wait_for_rewatch(compacted)

    def _wait_for_rewatch(self, compacted: int) -> None:
        """Until the pod watch and the event watch each ask for a resourceVersion at or after the
        compaction (the watcher re-listed both): the next compaction then finds both open."""
        deadline = time.monotonic() + REWATCH_TIMEOUT_S
        waiting = {"/pods", "/events"}
        while not self.stopped:
            new = self.api.requests[self._requests_seen:]
            self._requests_seen += len(new)
            waiting -= {r.path[r.path.rfind("/"):] for r in new
                        if r.is_watch and int(r.query.get("resourceVersion") or 0) >= compacted}
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no watch from resourceVersion >= {compacted} within {REWATCH_TIMEOUT_S:g} s "
                                   f"of expiry {self.expiries} (after {self.played} events)")
            time.sleep(0.002)


def serve(spec: str) -> int:
    """``--serve PODS,EVENTS,EVERY,GAP``: print the URL, play once a watch is open, report when stdin closes."""
    sys.path[:0] = [str(TESTS)]
    from standins.k8s_api import KubeAPIStandIn, synthetic_run_group

    pods, events, every, gap = (int(x) for x in spec.split(","))
    api = KubeAPIStandIn(token=TOKEN, namespaces=("default", NAMESPACE)).start()
    nodes, pulls, stream = synthetic_run_group(pods, events, run_group=RUN_GROUP, namespace=NAMESPACE)
    for node in nodes:
        api.add_node(node)
    for event in pulls:
        api.add_event(event)
    player = Player(api, stream, events, every, gap)
    api.play([player.run], wait_for_watches=2, wait_timeout=60)  # the pod watch and the event watch
    print(api.url, flush=True)
    sys.stdin.read()
    player.stopped = True
    api.close()
    print(json.dumps({"played": player.played, "expiries": player.expiries, "expired_sent": api.expired_sent,
                      "last_phase": dict(player.last_phase), "errors": [repr(e) for e in api.player_errors]}),
          flush=True)
    return 0


# --------------------------------------------------------------------------- the watcher side (this process)


@dataclass
class LoadResult:
    pods: int
    events: int
    expire_every: int
    gap: int
    traced: bool
    seconds: float = 0.0
    events_per_s: float = 0.0  # events played / seconds, end to end (re-lists included)
    stopped_by: str | None = None
    pods_created: int = 0  # by the stand-in
    pods_seen: int = 0  # rows the watcher returned
    pods_lost: int = 0  # created, not in the rows
    pods_stale: int = 0  # in the rows with another phase than the stand-in's last
    pods_kept: int = 0  # objects the watcher holds (one per pod)
    played: int = 0
    watch_events: int = 0  # delivered by watch streams (the rest came through re-lists)
    expiries: int = 0  # compactions played
    expired_sent: int = 0  # 410s the stand-in sent
    expired_handled: int = 0  # 410s the watcher's pod watch handled
    events_expired: int = 0  # 410s its event watch handled (each compaction reaches both)
    relists: int = 0
    peak_mib: float | None = None
    retained_mib: float | None = None
    server_errors: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        where = f"{self.pods} pods x {self.events} events"
        out = [f"{where}: {e}" for e in self.server_errors]
        checks = [
            (self.stopped_by == "condition", f"watch stopped by {self.stopped_by}, not by every pod ending"),
            (self.pods_lost == 0, f"{self.pods_lost} of {self.pods_created} pods lost"),
            (self.pods_stale == 0, f"{self.pods_stale} pods with a stale phase"),
            (self.pods_created == self.pods, f"the stand-in created {self.pods_created} pods, not {self.pods}"),
            (self.played == self.events, f"{self.played} of {self.events} events played"),
            (self.expired_handled == self.events_expired == self.expiries
             and self.expired_sent == self.expired_handled + self.events_expired,
             f"410s: {self.expiries} compactions, {self.expired_sent} sent, {self.expired_handled} handled by the "
             f"pod watch and {self.events_expired} by the event watch"),
            (self.relists == self.expired_handled, f"{self.relists} re-lists for {self.expired_handled} 410s"),
        ]
        return out + [f"{where}: {msg}" for ok, msg in checks if not ok]


def _start_standin(spec: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", spec],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        raise RuntimeError(f"stand-in did not start (got {url!r})")
    return proc, url


def _stop_standin(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Close its stdin; its last line says what it played."""
    out, _ = proc.communicate(timeout=60)
    lines = out.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"errors": [f"stand-in exited {proc.returncode} without a report"]}


def _watch(url: str, pods: int, timeout_s: float,
           traced: bool) -> tuple[Any, list[dict[str, Any]], float, tuple[int, int]]:
    from llmpack.cluster.k8s.api import build_api_client
    from llmpack.cluster.k8s.podphases import all_terminated
    from llmpack.cluster.k8s.watcher import PodWatcher

    watcher = PodWatcher(build_api_client(host=url, token=TOKEN), NAMESPACE, RUN_GROUP, window_s=30)
    if traced:
        tracemalloc.start()
        tracemalloc.reset_peak()
    start = time.perf_counter()
    try:
        rows = watcher.run(until=all_terminated(min_pods=pods), timeout_s=timeout_s)
        seconds = time.perf_counter() - start
        memory = tracemalloc.get_traced_memory() if traced else (0, 0)  # (retained: watcher + rows, peak)
    finally:
        if traced:
            tracemalloc.stop()
    return watcher, rows, seconds, memory


def measure(pods: int, events: int, *, expire_every: int = 1000, gap: int = 10, traced: bool = False,
            timeout_s: float = 600.0) -> LoadResult:
    """One run group of ``pods`` pods and ``events`` events through the watcher, 410s and all."""
    result = LoadResult(pods, events, expire_every, gap, traced)
    proc, url = _start_standin(f"{pods},{events},{expire_every},{gap}")
    try:
        watcher, rows, result.seconds, (retained, peak) = _watch(url, pods, timeout_s, traced)
    finally:
        served = _stop_standin(proc)
    last_phase: dict[str, str] = served.get("last_phase", {})
    phase_seen = {r["pod"]: r["phase"] for r in rows}
    result.stopped_by = watcher.stopped_by
    result.pods_created, result.pods_seen, result.pods_kept = len(last_phase), len(rows), watcher.pod_count
    result.pods_lost = len(set(last_phase) - set(phase_seen))
    result.pods_stale = sum(1 for name, phase in last_phase.items() if name in phase_seen and phase_seen[name] != phase)
    result.played, result.expiries = served.get("played", 0), served.get("expiries", 0)
    result.expired_sent, result.server_errors = served.get("expired_sent", 0), served.get("errors", [])
    result.watch_events, result.relists = watcher.stats["events"], watcher.stats["relists"]
    result.expired_handled, result.events_expired = watcher.stats["expired"], watcher.event_stats["expired"]
    result.events_per_s = result.played / result.seconds if result.seconds else 0.0
    if traced:
        result.peak_mib, result.retained_mib = peak / 2**20, retained / 2**20
    return result


# --------------------------------------------------------------------------- output


def describe(r: LoadResult) -> str:
    memory = (f", peak {r.peak_mib:.1f} MiB ({r.peak_mib * 1024 / r.pods:.1f} KiB/pod), "
              f"retained {r.retained_mib:.1f} MiB"
              if r.peak_mib is not None else "")
    return (f"  {r.pods:>5} pods {r.events:>6} events{' (tracemalloc)' if r.traced else '              '}: "
            f"{r.seconds:6.1f} s, {r.events_per_s:>6,.0f} events/s; pods seen {r.pods_seen}/{r.pods_created}, "
            f"lost {r.pods_lost}, stale {r.pods_stale}; 410s {r.expired_sent} sent / "
            f"{r.expired_handled}+{r.events_expired} "
            f"handled (pods+events), "
            f"{r.relists} re-lists, {r.watch_events} events by watch{memory}")


def memory_lines(traced: list[LoadResult]) -> list[str]:
    """Peak ratios: across pods at the same events, and across events at the same pods."""
    by = {(r.pods, r.events): r.peak_mib for r in traced if r.peak_mib}
    pods = sorted({p for p, _ in by})
    events = sorted({e for _, e in by})
    out = []
    for e in events:
        if (pods[0], e) in by and (pods[-1], e) in by and len(pods) > 1:
            out.append(f"  peak, {pods[-1]} vs {pods[0]} pods at {e:,} events: "
                       f"{by[(pods[-1], e)] / by[(pods[0], e)]:.1f}x (pods {pods[-1] / pods[0]:.0f}x)")
    for p in pods:
        if (p, events[0]) in by and (p, events[-1]) in by and len(events) > 1:
            out.append(f"  peak, {events[-1]:,} vs {events[0]:,} events at {p} pods: "
                       f"{by[(p, events[-1])] / by[(p, events[0])]:.2f}x (events {events[-1] / events[0]:.0f}x)")
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=_ints, default=[100, 1000], help="comma-separated pod counts (default 100,1000)")
    parser.add_argument("--events", type=_ints, default=[10000, 50000],
                        help="comma-separated event counts (default 10000,50000)")
    parser.add_argument("--expire-every", type=int, default=1000, help="a 410 every N events (default 1000; 0: none)")
    parser.add_argument("--gap", type=int, default=10, help="events logged behind each 410, seen only by re-list")
    parser.add_argument("--timeout", type=float, default=600.0, help="per watch, seconds")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", metavar="PODS,EVENTS,EVERY,GAP", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.serve and any(e < 5 * p for p in args.pods for e in args.events):
        parser.error("--events must be at least 5 per pod (each pod has 5 states)")
    if args.expire_every and args.gap >= args.expire_every:
        parser.error("--gap must be smaller than --expire-every")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        return serve(args.serve)
    sys.path[:0] = [str(REPO)]
    t0 = time.perf_counter()
    pairs = [(p, e) for p in args.pods for e in args.events]
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if args.json else (lambda s: print(s, flush=True))
    say(f"PodWatcher under load: a 410 every {args.expire_every:,} events ({args.gap} events behind each), "
        f"real kubernetes client, stand-in API in another process; load average {os.getloadavg()}")
    results: list[LoadResult] = []
    for traced in (False, True)[: 1 if args.no_memory else 2]:
        for pods, events in pairs:
            results.append(measure(pods, events, expire_every=args.expire_every, gap=args.gap, traced=traced,
                                   timeout_s=args.timeout))
            say(describe(results[-1]))
    for line in memory_lines([r for r in results if r.traced]):
        say(line)
    problems = [p for r in results for p in r.problems]
    for problem in problems:
        say(f"  FAIL {problem}")
    say(f"  {'OK: no pod lost, no stale pod, every 410 survived' if not problems else 'FAILED'}; "
        f"total {time.perf_counter() - t0:.0f} s, load average {os.getloadavg()}")
    if args.json:
        print(json.dumps({"results": [asdict(r) for r in results], "problems": problems, "ok": not problems}, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
