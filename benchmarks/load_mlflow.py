"""N pipeline runs, C at a time, logging into one real ``mlflow server``: every record there exactly once.

    python benchmarks/load_mlflow.py [--runs 20] [--concurrency 4] [--max-steps 2] [--param NAME=VALUE ...]
                                     [--workers 1] [--json]

How to run it, what it prints and why: docs/internals/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make ``benchmarks`` importable as a package
    sys.path.insert(0, str(REPO))

from benchmarks.mlflow_server import MlflowServer, clean_env  # noqa: E402
from components.record import telemetry, tracking  # noqa: E402

RUN_TIMEOUT_S = 1800


# --------------------------------------------------------------------------- the runs


@dataclass
class RunResult:
    """One ``llmpack run``: its exit status, wall time and ``--json`` summary (None when it printed none)."""

    index: int
    returncode: int
    wall_s: float
    summary: dict[str, Any] | None
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        s = self.summary or {}
        return self.returncode == 0 and s.get("status") == "succeeded" and s.get("tracking") == "sent"


def run_command(uri: str, run_group: str, out_dir: Path, max_steps: int, params: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "llmpack", "run", "--backend", "direct", "--max-steps", str(max_steps), "--json",
           "--tracking-uri", uri, "--run-group", run_group, "--output-dir", str(out_dir)]
    for param in params:
        cmd += ["--param", param]
    return cmd


def one_run(index: int, cmd: list[str], cwd: Path, env: dict[str, str]) -> RunResult:
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return RunResult(index, -1, time.monotonic() - t0, None, f"timed out after {RUN_TIMEOUT_S} s")
    wall = time.monotonic() - t0
    try:
        summary = json.loads(r.stdout)
    except json.JSONDecodeError:
        summary = None
    return RunResult(index, r.returncode, wall, summary, r.stderr[-2000:])


def run_all(cmd: list[str], runs: int, concurrency: int, cwd: Path, env: dict[str, str],
            progress: bool) -> list[RunResult]:
    """``runs`` copies of ``cmd``, ``concurrency`` at a time; results in start order."""
    def task(i: int) -> RunResult:
        result = one_run(i, cmd, cwd, env)
        if progress:
            status = (result.summary or {}).get("status", f"exit {result.returncode}")
            print(f"  run {i + 1:>3}/{runs}: {result.wall_s:6.1f} s  {status}", file=sys.stderr, flush=True)
        return result

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(task, range(runs)))


# --------------------------------------------------------------------------- the checks


@dataclass
class RecordCheck:
    """What MLflow holds for one run, against its JSONL records and its summary's derived metrics."""

    pipeline_run: str
    expected: int = 0  # JSONL records
    found: int = 0  # of those, present in MLflow
    duplicated: int = 0  # values beyond the first, over every key checked (JSONL and derived)
    wrong_value: int = 0  # present, but not the JSONL's value
    stray: int = 0  # event.*/metric.* keys in MLflow that no JSONL record has
    derived_expected: int = 0
    derived_found: int = 0
    mlflow_records: int = 0  # MLflow records tagged with this pipeline run (must be 1)

    @property
    def problems(self) -> list[str]:
        out = []
        if self.mlflow_records != 1:
            out.append(f"{self.mlflow_records} MLflow records")
        if self.expected == 0:
            out.append("no JSONL records")
        for label, have, want in (("records", self.found, self.expected),
                                  ("derived metrics", self.derived_found, self.derived_expected)):
            if have != want:
                out.append(f"{want - have} of {want} {label} missing")
        for label, n in (("duplicated values", self.duplicated), ("wrong values", self.wrong_value),
                         ("stray keys", self.stray)):
            if n:
                out.append(f"{n} {label}")
        return [f"{self.pipeline_run}: {p}" for p in out]


def jsonl_records(run_dir: Path) -> list[telemetry.Record]:
    """The run's records as ``llmpack sync`` reads them: ``events.jsonl`` and every step's JSONL."""
    return telemetry.read_records([run_dir / "events.jsonl", *telemetry.find_event_files(run_dir)])


def mlflow_records(mc: Any, pipeline_run: str) -> list[Any]:
    exp = mc.get_experiment_by_name(tracking.DEFAULT_EXPERIMENT)
    if exp is None:
        return []
    return list(mc.search_runs([exp.experiment_id], max_results=100, filter_string=(
        f"tags.`llmpack.pipeline_run` = '{pipeline_run}' and tags.`{tracking.RECORD_TAG}` = 'pipeline'")))


def _history(mc: Any, run_ids: list[str], key: str) -> list[float]:
    return [m.value for rid in run_ids for m in mc.get_metric_history(rid, key)]


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9)


def check_run(mc: Any, run_dir: Path) -> RecordCheck:
    """Every JSONL record and derived metric of ``run_dir`` in MLflow exactly once, with its value."""
    summary = json.loads((run_dir / "summary.json").read_text())
    check = RecordCheck(pipeline_run=summary["pipeline_run"])
    found = mlflow_records(mc, check.pipeline_run)
    check.mlflow_records = len(found)
    run_ids = [r.info.run_id for r in found]
    records = jsonl_records(run_dir)
    check.expected = len(records)
    for rec in records:
        values = _history(mc, run_ids, rec.mlflow_key)
        check.found += bool(values)
        check.duplicated += max(0, len(values) - 1)
        check.wrong_value += bool(values) and not all(_same(v, rec.value) for v in values)
    derived = {k: float(v) for k, v in (summary.get("metrics") or {}).items() if v is not None}
    check.derived_expected = len(derived)
    for key in derived:
        values = _history(mc, run_ids, key)
        check.derived_found += bool(values)
        check.duplicated += max(0, len(values) - 1)
    logged = {k for r in found for k in r.data.metrics if k.startswith(("event.", "metric."))}
    check.stray = len(logged - {r.mlflow_key for r in records})
    return check


def jsonl_events(run_dir: Path) -> dict[str, dict[str, float]]:
    """step -> event -> time, as a report rebuilds them (only the contract's events)."""
    events: dict[str, dict[str, float]] = {}
    for rec in jsonl_records(run_dir):
        if rec.kind == "event" and rec.name in telemetry.ALL_EVENTS:
            events.setdefault(rec.step, {})[rec.name] = rec.value
    return events


@dataclass
class ReportCheck:
    returncode: int
    wall_s: float
    runs: int = 0  # runs in report.json
    matching: int = 0  # of the expected runs: present, succeeded, with the JSONL's events
    problems: list[str] = field(default_factory=list)


def _events_match(got: dict[str, dict[str, float]], want: dict[str, dict[str, float]]) -> bool:
    return got.keys() == want.keys() and all(
        got[s].keys() == want[s].keys() and all(_same(got[s][n], want[s][n]) for n in want[s]) for s in want)


def compare_report(report: dict[str, Any], expected: dict[str, dict[str, dict[str, float]]],
                   check: ReportCheck) -> None:
    """``report.json``'s runs against ``expected`` (pipeline run -> its JSONL events)."""
    by_run = {r["pipeline_run"]: r for r in report.get("runs") or ()}
    check.runs = len(report.get("runs") or ())
    for pipeline_run, events in sorted(expected.items()):
        got = by_run.get(pipeline_run)
        if got is None:
            check.problems.append(f"report: {pipeline_run} missing")
        elif got.get("status") != "succeeded" or not _events_match(got.get("events") or {}, events):
            check.problems.append(f"report: {pipeline_run} rebuilt with status {got.get('status')} or other events")
        else:
            check.matching += 1
    extra = sorted(set(by_run) - set(expected))
    if extra or check.runs != len(by_run):
        check.problems.append(f"report: {check.runs} runs, unexpected: {extra[:5]}")


def check_report(uri: str, run_group: str, out: Path, cwd: Path, expected: dict[str, dict[str, dict[str, float]]],
                 env: dict[str, str]) -> ReportCheck:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "llmpack", "report", "--run-group", run_group, "--out", str(out),
                        "--tracking-uri", uri], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    check = ReportCheck(returncode=r.returncode, wall_s=time.monotonic() - t0)
    if r.returncode != 0:
        check.problems.append(f"llmpack report exited {r.returncode}: {r.stderr.strip()[-500:]}")
        return check
    compare_report(json.loads((out / "report.json").read_text()), expected, check)
    return check


# --------------------------------------------------------------------------- figures


def figures(results: list[RunResult], checks: list[RecordCheck], report: ReportCheck, wall_s: float,
            args: argparse.Namespace, server_start_s: float) -> dict[str, Any]:
    walls = [r.wall_s for r in results]
    problems = [f"run {r.index + 1}: exit {r.returncode}, status {(r.summary or {}).get('status')}, tracking "
                f"{(r.summary or {}).get('tracking')}: {r.stderr_tail.strip()[-300:]}" for r in results if not r.ok]
    problems += [p for c in checks for p in c.problems] + report.problems
    return {
        "runs": args.runs, "concurrency": args.concurrency, "max_steps": args.max_steps, "params": args.param,
        "server_workers": args.workers, "server_start_s": round(server_start_s, 1),
        "wall_s": round(wall_s, 1),
        "run_wall_s": {"median": round(statistics.median(walls), 1), "min": round(min(walls), 1),
                       "max": round(max(walls), 1)},
        "runs_ok": sum(r.ok for r in results),
        "records_expected": sum(c.expected for c in checks),
        "records_found": sum(c.found for c in checks),
        "derived_expected": sum(c.derived_expected for c in checks),
        "derived_found": sum(c.derived_found for c in checks),
        "duplicated": sum(c.duplicated for c in checks),
        "wrong_values": sum(c.wrong_value for c in checks),
        "stray_keys": sum(c.stray for c in checks),
        "mlflow_records_per_run": sorted({c.mlflow_records for c in checks}),
        "runs_checked": len(checks),
        "report_runs": report.runs, "report_runs_matching": report.matching, "report_s": round(report.wall_s, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "problems": problems,
        "ok": not problems,
    }


def print_table(f: dict[str, Any]) -> None:
    rw = f["run_wall_s"]
    rows = [
        ("runs ok (succeeded, tracking sent)", f"{f['runs_ok']}/{f['runs']}"),
        ("wall time, all runs", f"{f['wall_s']} s ({f['concurrency']} at a time)"),
        ("one run's wall time", f"median {rw['median']} s ({rw['min']}..{rw['max']})"),
        ("JSONL records: expected / in MLflow", f"{f['records_expected']} / {f['records_found']}"),
        ("derived metrics: expected / in MLflow", f"{f['derived_expected']} / {f['derived_found']}"),
        ("values logged twice / wrong / stray keys", f"{f['duplicated']} / {f['wrong_values']} / {f['stray_keys']}"),
        ("MLflow records per run", ", ".join(map(str, f["mlflow_records_per_run"])) or "-"),
        ("llmpack report: runs rebuilt (with their events)",
         f"{f['report_runs']} ({f['report_runs_matching']}/{f['runs']}) in {f['report_s']} s"),
        ("load average after", " ".join(map(str, f["load_average"]))),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    for problem in f["problems"]:
        print(f"  FAIL {problem}")
    print("  OK: every record exactly once; the report rebuilt every run" if f["ok"] else "  FAILED")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="pipeline runs (default 20)")
    parser.add_argument("--concurrency", type=int, default=4, help="runs at a time (default 4)")
    parser.add_argument("--max-steps", type=int, default=2, help="finetune steps per run (default 2: short runs)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="passed to every `llmpack run` (e.g. builtin_size=400)")
    parser.add_argument("--workers", type=int, default=1, help="mlflow server --workers (default 1)")
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP_NUM_THREADS of each run (default 1: C runs share the cores)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object (progress goes to stderr)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.concurrency < 1 or args.workers < 1 or args.threads < 1:
        parser.error("--runs, --concurrency, --workers and --threads must be at least 1")
    return args


def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    run_group = f"load-{uuid.uuid4().hex[:8]}"
    env = clean_env(OMP_NUM_THREADS=str(args.threads))
    srv = MlflowServer(root / "server", workers=args.workers)
    try:
        server_start_s = srv.start()
        print(f"mlflow server {srv.uri} (--workers {args.workers}) up in {server_start_s:.1f} s; {args.runs} runs, "
              f"{args.concurrency} at a time, run group {run_group}; load average {os.getloadavg()}",
              file=sys.stderr, flush=True)
        t0 = time.monotonic()
        cmd = run_command(srv.uri, run_group, root / "runs", args.max_steps, args.param)
        results = run_all(cmd, args.runs, args.concurrency, root, env, progress=True)
        wall_s = time.monotonic() - t0
        mc = MlflowClient(srv.uri)
        run_dirs = [Path(r.summary["artifacts"]["run_dir"]) for r in results if r.summary]
        checks = [check_run(mc, d) for d in run_dirs]
        expected = {json.loads((d / "summary.json").read_text())["pipeline_run"]: jsonl_events(d) for d in run_dirs}
        report = check_report(srv.uri, run_group, root / "report", root, expected, env)
    finally:
        srv.kill()
    return figures(results, checks, report, wall_s, args, server_start_s)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="llmpack-load-"))
    f = measure(args, root)
    if args.json:
        print(json.dumps(f, indent=2))
    else:
        print(f"{args.runs} x `llmpack run --backend direct --max-steps {args.max_steps}` into one mlflow server "
              f"(sqlite, --workers {args.workers}), {args.concurrency} at a time:")
        print_table(f)
    if args.keep:
        print(f"kept {root}", file=sys.stderr)
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0 if f["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
