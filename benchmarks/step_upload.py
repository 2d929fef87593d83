"""What logging its own records costs a run whose steps upload them.

    python benchmarks/step_upload.py [--rounds 3] [--max-steps 10]

How to run it, what it prints and why: docs/internals/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mlflow_server import MlflowServer, clean_env  # noqa: E402

from components.commands import step_args, task_params  # noqa: E402
from components.dsl import OutputRef  # noqa: E402
from components.finetune_pipeline import build  # noqa: E402
from components.fusion import fuse  # noqa: E402
from components.record import tracking  # noqa: E402
from components.record.telemetry import read_records  # noqa: E402

WAYS = {"no upload": {"LLMPACK_MLFLOW_LOGGING": "0"}, "client": {"LLMPACK_TRACKING_REST": "0"}, "REST": {}}
CASES = [(run, way) for run in ("5 steps", "fused") for way in WAYS]


def commands(root: Path, fused: bool, max_steps: int, tag: str) -> list[list[str]]:
    """The run's step command lines in order, outputs under ``root/tag``."""
    pipe = fuse(build(), "all") if fused else build()
    values: dict[str, Any] = {k: p.default for k, p in pipe.all_params.items()}
    values.update(max_steps=max_steps, orchestrator="argo", mode="cluster", pipeline_run=f"bench-{tag}",
                  run_group="bench-step-upload", submitted_at=time.time())
    cmds = []
    for task in pipe.task_order():
        inputs = {name: str(root / tag / ref.task / ref.output) for name, ref in task.arguments.items()
                  if isinstance(ref, OutputRef)}
        outputs = {name: str(root / tag / task.name / name) for name in task.step.outputs}
        cmds.append([sys.executable,
                     *step_args(task, inputs=inputs, outputs=outputs, params=task_params(task, values))])
    return cmds


def run_case(root: Path, fused: bool, way: str, max_steps: int, env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, time to first step s, tag) of one run."""
    tag = f"{'fused' if fused else 'steps'}-{way.replace(' ', '-')}-{uuid.uuid4().hex[:8]}"
    t0 = time.time()
    for cmd in commands(root, fused, max_steps, tag):
        proc = subprocess.run(cmd, env={**env, **WAYS[way]}, capture_output=True, text=True)
        if proc.returncode != 0 or "llmpack: warning" in proc.stderr:
            sys.exit(f"a step failed or warned (rc {proc.returncode}): {cmd[3]}\n{proc.stderr[-2000:]}")
    wall = time.time() - t0
    first = next(r.value for r in read_records((root / tag).rglob("llmpack-events.jsonl"))
                 if r.step == "finetune" and r.name == "first_step")
    return wall, first - t0, tag


def logged_keys(uri: str, pipeline_run: str) -> set[str]:
    """The metric names on the pipeline run's MLflow record (none when there is no record)."""
    mc = tracking.client(uri)
    run_id = tracking.find_pipeline_run(mc, pipeline_run)
    return set(mc.get_run(run_id).data.metrics) if run_id else set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=10)
    args = parser.parse_args()

    started = time.time()
    with tempfile.TemporaryDirectory() as tmp, MlflowServer(Path(tmp) / "server") as srv:
        root = Path(tmp)
        env = clean_env(MLFLOW_TRACKING_URI=srv.uri)
        got: dict[tuple[str, str], list[tuple[float, float]]] = {case: [] for case in CASES}
        logged: dict[tuple[str, str], str] = {}
        for rnd in range(args.rounds + 1):
            for case in CASES[rnd % len(CASES):] + CASES[: rnd % len(CASES)]:
                wall, ttfs, tag = run_case(root, case[0] == "fused", case[1], args.max_steps, env)
                print(f"  round {rnd}/{args.rounds} {case[0]:<7} {case[1]:<10} wall {wall:6.2f} s", file=sys.stderr,
                      flush=True)
                if rnd:
                    got[case].append((wall, ttfs))
                if case[1] != "no upload":
                    logged[case] = tag
        print(f"{'run':<8}{'records':<12}{'wall s':>8}{'1st step s':>11}{'+ wall':>8}{'+ 1st step':>11}")
        med = {case: (statistics.median(w for w, _ in got[case]), statistics.median(t for _, t in got[case]))
               for case in CASES}
        for case in CASES:
            (wall, ttfs), (floor_wall, floor_ttfs) = med[case], med[(case[0], "no upload")]
            extra = "" if case[1] == "no upload" else f"{wall - floor_wall:>+8.2f}{ttfs - floor_ttfs:>+11.2f}"
            print(f"{case[0]:<8}{case[1]:<12}{wall:>8.2f}{ttfs:>11.2f}{extra}")
        print(f"medians of {args.rounds} rounds (finetune: {args.max_steps} steps), "
              f"{time.time() - started:.0f} s in all;")
        print("step processes one after the other, records to a real mlflow server on")
        print("127.0.0.1; '+': over no upload")
        missing = []
        for case, tag in logged.items():
            expected = {r.mlflow_key for r in read_records((root / tag).rglob("llmpack-events.jsonl"))}
            lost = expected - logged_keys(srv.uri, f"bench-{tag}")
            if not expected or lost:
                missing.append(f"{' '.join(case)}: {len(lost)} of {len(expected)} records not on the server")
        print("every record on the server: " + ("yes" if not missing else "NO: " + "; ".join(missing)))
        if missing:
            sys.exit(1)


if __name__ == "__main__":
    main()
