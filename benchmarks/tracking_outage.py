"""What a tracking outage costs a run, and what ``llmpack sync`` recovers: a real ``mlflow server``.

    python benchmarks/tracking_outage.py [--repeats N] [--max-steps N] [--max-wait S] [--no-mid-run]

Starts ``mlflow server`` (sqlite backend) on 127.0.0.1, then, interleaved, N runs of
``llmpack run --backend direct`` with the server up and N with it down at the start (it stays down
until the run has ended), and prints the wall times: the difference is the cost of the bounded
wait (``LLMPACK_TRACKING_MAX_WAIT_S``, default 30 s). Then, with the server back, ``llmpack sync``
on every run that could not send, twice, and the counts that matter: records in the JSONL files,
those found in MLflow, duplicated values, and MLflow records per pipeline run. With the
mid-run scenario (default on), one more run whose server is killed as its finetune step starts
and restarted after the run ended. The load average is printed, as the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from components.record import telemetry, tracking


class Server:
    """``mlflow server`` on 127.0.0.1 with a sqlite backend; killed with SIGKILL, restarted on the same port."""

    def __init__(self, root: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.root, self.uri, self.proc = root, f"http://127.0.0.1:{self.port}", None

    def start(self) -> float:
        if self.proc is not None and self.proc.poll() is None:
            return 0.0
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"],
            cwd=self.root, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # no job runner
            stdout=(self.root / "server.log").open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return time.monotonic() - t0
            except OSError:
                if self.proc.poll() is not None or time.monotonic() - t0 > 180:
                    raise SystemExit(f"mlflow server did not start; see {self.root / 'server.log'}") from None
                time.sleep(0.3)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


def env(max_wait: float) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    return {**out, "HF_HUB_OFFLINE": "1", "LLMPACK_TRACKING_MAX_WAIT_S": str(max_wait)}


def run_args(srv: Server, root: Path, max_steps: int) -> list[str]:
    return [sys.executable, "-m", "llmpack", "run", "--backend", "direct", "--max-steps", str(max_steps), "--json",
            "--tracking-uri", srv.uri, "--output-dir", str(root / "runs")]


def one_run(srv: Server, root: Path, max_steps: int, max_wait: float) -> tuple[float, dict[str, Any]]:
    t0 = time.monotonic()
    r = subprocess.run(run_args(srv, root, max_steps), cwd=root, env=env(max_wait), capture_output=True, text=True)
    wall = time.monotonic() - t0
    if not r.stdout.strip():
        raise SystemExit(f"llmpack run printed no summary (exit {r.returncode}): {r.stderr[-2000:]}")
    return wall, json.loads(r.stdout)


def mid_run(srv: Server, root: Path, max_steps: int, max_wait: float) -> tuple[float, dict[str, Any]]:
    """The server is killed as the finetune step starts and comes back only after the run ended."""
    t0 = time.monotonic()
    proc = subprocess.Popen(run_args(srv, root, max_steps), cwd=root, env=env(max_wait), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    while not list((root / "runs").glob(".*.partial/finetune/*/" + telemetry.EVENTS_FILE)):
        if proc.poll() is not None:
            raise SystemExit("the run ended before its finetune step started")
        time.sleep(0.1)
    srv.kill()
    out, _ = proc.communicate()
    return time.monotonic() - t0, json.loads(out)


def sync(srv: Server, run_dir: Path, max_wait: float) -> tuple[float, str]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "llmpack", "sync", str(run_dir), "--tracking-uri", srv.uri],
                       env=env(max_wait), capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"llmpack sync {run_dir}: exit {r.returncode}: {r.stderr}")
    return time.monotonic() - t0, r.stdout.strip()


def counts(srv: Server, run_dir: Path) -> dict[str, int]:
    """Records in the run's JSONL files; those in MLflow; values logged more than once; MLflow records of the run."""
    from mlflow.tracking import MlflowClient

    records = telemetry.read_records([run_dir / "events.jsonl", *telemetry.find_event_files(run_dir)])
    pipeline_run = json.loads((run_dir / "summary.json").read_text())["pipeline_run"]
    mc = MlflowClient(srv.uri)
    exp = mc.get_experiment_by_name(tracking.DEFAULT_EXPERIMENT)
    runs = mc.search_runs([exp.experiment_id], filter_string=f"tags.`llmpack.pipeline_run` = '{pipeline_run}'")
    found = dupes = 0
    for run in runs:
        for rec in records:
            history = mc.get_metric_history(run.info.run_id, rec.mlflow_key)
            found += bool(history)
            dupes += max(0, len(history) - 1)
    return {"jsonl": len(records), "mlflow": found, "duplicates": dupes, "records": len(runs)}


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):6.1f} s ({min(values):.1f}..{max(values):.1f}, n={len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--max-wait", type=float, default=tracking.DEFAULT_MAX_WAIT_S)
    parser.add_argument("--no-mid-run", action="store_true", help="skip the killed-mid-run scenario")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmpack-outage-"))
    srv = Server(root)
    print(f"load average before: {os.getloadavg()}; direct path, --max-steps {args.max_steps}, "
          f"LLMPACK_TRACKING_MAX_WAIT_S={args.max_wait:g}; server {srv.uri} in {root}", flush=True)
    up, down, unsent = [], [], []
    try:
        print(f"mlflow server started in {srv.start():.1f} s", flush=True)
        one_run(srv, root, args.max_steps, args.max_wait)  # warm-up (page cache, the experiment), discarded
        for i in range(args.repeats):
            for state in (("up", "down") if i % 2 == 0 else ("down", "up")):
                if state == "down":
                    srv.kill()
                wall, s = one_run(srv, root, args.max_steps, args.max_wait)
                (up if state == "up" else down).append(wall)
                print(f"server {state:4}: {wall:6.1f} s  status {s['status']}, tracking {s['tracking']}", flush=True)
                if s["tracking"] != "sent":
                    unsent.append(Path(s["artifacts"]["run_dir"]))
                if state == "down":
                    srv.start()
        print(f"\nserver up at start:   {spread(up)}")
        print(f"server down at start: {spread(down)}")
        print(f"cost of the bounded wait (median down - median up): "
              f"{statistics.median(down) - statistics.median(up):+.1f} s", flush=True)
        if not args.no_mid_run:
            wall, s = mid_run(srv, root, args.max_steps, args.max_wait)
            print(f"\nkilled as finetune started, back after the run: {wall:.1f} s, status {s['status']}"
                  f"{' (' + str(s['error'])[:120] + ')' if s['error'] else ''}, tracking {s['tracking']}", flush=True)
            srv.start()
            unsent.append(Path(s["artifacts"]["run_dir"]))
        print("\nrun                                   JSONL  in MLflow after sync  duplicates after 2nd sync  "
              "MLflow records  1st sync s")
        total = {"jsonl": 0, "mlflow": 0, "duplicates": 0}
        for run_dir in unsent:
            t_sync, _ = sync(srv, run_dir, args.max_wait)
            first = counts(srv, run_dir)
            sync(srv, run_dir, args.max_wait)
            second = counts(srv, run_dir)
            for key in total:
                total[key] += (second if key == "duplicates" else first)[key]
            print(f"{run_dir.name:38} {first['jsonl']:5}  {first['mlflow']:20}  {second['duplicates']:25}  "
                  f"{second['records']:14}  {t_sync:10.1f}", flush=True)
        print(f"{'all':38} {total['jsonl']:5}  {total['mlflow']:20}  {total['duplicates']:25}")
        print(f"\nload average after: {os.getloadavg()}")
    finally:
        srv.kill()


if __name__ == "__main__":
    main()
