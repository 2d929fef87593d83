"""Pipeline overhead per path: wall time over the sum of step compute time, and per-step gaps.

    python benchmarks/overhead.py [--repeats N] [--max-steps N] [--backends direct,kfp,argo,mlflow]
    python benchmarks/overhead.py --floors [--repeats 5] [--max-steps N]

Runs the tiny default pipeline through each path sequentially (the same code, data and seed),
then prints, per path (medians over the repeats): wall time, the sum of step compute time
(each step's ``finished - process_started``), their ratio, and the gaps between steps: from
submit to the first step's process start, between one step's finish and the next one's start,
and from the last finish until the client saw the run complete.

``--floors`` runs, in the same interleaved rounds, the orchestrators' own floors beside the four
paths (``mlflow run`` and kfp.local on trivial projects: :mod:`floors`) and prints what of each
path's cost is ours above its orchestrator's (docs/internals/measurements.md's targets beside each line).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floors import Floors, first_step_s, report  # noqa: E402

from llmpack.run.local import RunOptions, run_pipeline  # noqa: E402


def gaps(summary: dict) -> list[float]:
    steps = sorted(summary["events"].values(), key=lambda ev: ev["process_started"])
    out = [steps[0]["process_started"] - summary["submitted_at"]]
    out += [b["process_started"] - a["finished"] for a, b in zip(steps, steps[1:], strict=False)]
    out.append(summary["finished_at"] - steps[-1]["finished"])
    return out


def run_path(backend: str, root: Path, max_steps: int) -> dict:
    s = run_pipeline(RunOptions(backend=backend, max_steps=max_steps, output_dir=root / "runs",
                                tracking_uri=f"sqlite:///{root / 'mlflow.db'}"))
    if s["status"] != "succeeded":
        raise SystemExit(f"{backend}: {s['error']}")
    return s


def floors(root: Path, repeats: int, max_steps: int) -> None:
    """Each round: both floors and the four paths, in an order rotated by one per round."""
    paths = ["direct", "kfp", "argo", "mlflow"]
    first = run_path("direct", root, max_steps)  # creates the store; its figures are not counted
    steps = len(first["events"])
    fl = Floors(root, tracking_uri=f"sqlite:///{root / 'mlflow.db'}", steps=steps)
    kinds = ["floor_mlflow", "floor_kfp", *paths]
    rounds: list[dict[str, float]] = []
    for i in range(repeats):
        r: dict[str, float] = {}
        for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
            if kind.startswith("floor_"):
                f = fl.mlflow() if kind == "floor_mlflow" else fl.kfp()
                r[f"{kind}_first"], r[f"{kind}_total"] = f.lines[0], f.total
            else:
                s = run_path(kind, root, max_steps)
                r[f"{kind}_first"], r[f"{kind}_total"] = first_step_s(s), s["metrics"]["total_s"]
            print(f"round {i + 1}/{repeats} {kind}: {r[f'{kind}_total']:.2f}s (first {r[f'{kind}_first']:.2f}s)",
                  flush=True)
        rounds.append(r)
    print()
    print(report(rounds, steps=steps, max_steps=max_steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 3; 5 with --floors)")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--backends", default="direct,kfp,argo,mlflow")
    parser.add_argument("--floors", action="store_true",
                        help="also the trivial `mlflow run` and kfp.local floors; print ours above them")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmpack-overhead-"))
    if args.floors:
        floors(root, args.repeats or 5, args.max_steps)
        return
    args.repeats = args.repeats or 3
    backends = args.backends.split(",")
    rows: dict[str, list[tuple[float, float, list[float]]]] = {b: [] for b in backends}
    for i in range(args.repeats):
        for backend in backends:
            s = run_path(backend, root, args.max_steps)
            compute = sum(ev["finished"] - ev["process_started"] for ev in s["events"].values())
            rows[backend].append((s["metrics"]["total_s"], compute, gaps(s)))
            print(f"run {i + 1}/{args.repeats} {backend}: wall {s['metrics']['total_s']:.2f}s", flush=True)
    print()
    print(f"{'path':<8} {'wall s':>8} {'steps s':>8} {'wall/steps':>10} {'overhead s':>10} {'submit->1st':>11} "
          f"{'mean gap':>9} {'max gap':>8} {'end gap':>8}")
    for backend, values in rows.items():
        wall = statistics.median(v[0] for v in values)
        comp = statistics.median(v[1] for v in values)
        first = statistics.median(v[2][0] for v in values)
        between = [g for v in values for g in v[2][1:-1]]
        end = statistics.median(v[2][-1] for v in values)
        print(f"{backend:<8} {wall:>8.2f} {comp:>8.2f} {wall / comp:>10.2f} {wall - comp:>10.2f} {first:>11.2f} "
              f"{statistics.mean(between):>9.2f} {max(between):>8.2f} {end:>8.2f}")
    print(f"\n(medians over {args.repeats} run(s) per path; max_steps={args.max_steps}; tiny model, built-in data)")


if __name__ == "__main__":
    main()
