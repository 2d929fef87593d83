"""The orchestrators' own floors, beside our paths: what of a path's cost is theirs, what is ours.

Used by ``python benchmarks/overhead.py --floors``. Two trivial runs stand for what the
orchestrators cost by themselves, measured in the same rounds as our paths.

How to run it, what it prints and why: docs/internals/benchmarks.md.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

TARGETS = {"mlflow_first": 0.5, "mlflow_total": 1.0, "kfp_per_step": 0.5}

MLPROJECT = """name: llmpack-floor
entry_points:
  main:
    command: "python tick.py"
"""
TICK = "import time\n\nprint(f'floor-tick {time.time()!r}', flush=True)\n"

KFP_SCRIPT = """
import sys, time
from kfp import dsl, local

@dsl.component(install_kfp_package=False)
def tick(prev: float) -> float:
    import time
    now = time.time()
    print(f"floor-tick {{now!r}}", flush=True)
    return now

@dsl.pipeline(name="llmpack-floor")
def chain():
    t = tick(prev=0.0)
    for _ in range({n} - 1):
        t = tick(prev=t.output)

local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=sys.argv[1], raise_on_error=True)
chain()
"""


@dataclass(frozen=True, kw_only=True)
class Floor:
    """One trivial run: seconds from its launch to each step's first line, and to its exit."""

    lines: tuple[float, ...]
    total: float


def _venv_env(tracking_uri: str) -> dict[str, str]:
    """This interpreter's bin first on PATH (MLproject commands say ``python``), the store named."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", os.defpath)])
    env["MLFLOW_TRACKING_URI"] = tracking_uri
    return env


def _timed(cmd: list[str], *, env: dict[str, str], cwd: Path, marker: str) -> Floor:
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    total = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"floor {cmd[-2:]} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    # kfp.local indents a task's output and may send it to either stream.
    stamps = [float(line.split(marker, 1)[1].split()[0]) for line in (proc.stdout + proc.stderr).splitlines()
              if marker in line and "print(" not in line]
    if not stamps:
        raise SystemExit(f"floor {cmd[-2:]}: no timestamp line in its output")
    return Floor(lines=tuple(s - t0 for s in stamps), total=total)


class Floors:
    """The two trivial runs, set up once under ``root`` (the MLflow store created beforehand)."""

    def __init__(self, root: Path, *, tracking_uri: str, steps: int) -> None:
        from components.record import tracking
        from mlflow_projects.local import mlflow_command

        self.root, self.steps = root, steps
        self.env = _venv_env(tracking_uri)
        project = root / "floor-project"
        project.mkdir(parents=True, exist_ok=True)
        (project / "MLproject").write_text(MLPROJECT, encoding="utf-8")
        (project / "tick.py").write_text(TICK, encoding="utf-8")
        # The store and the experiment exist before the first round, as they do for our path.
        self.experiment = tracking.experiment_id(tracking.client(tracking_uri))
        self.mlflow_cmd = [*mlflow_command(), "run", str(project), "-e", "main", "--env-manager", "local",
                           "--experiment-id", self.experiment]
        # A file, not ``python -c``: kfp reads a lightweight component's source from its module.
        self.kfp_script = root / "kfp_floor.py"
        self.kfp_script.write_text(textwrap.dedent(KFP_SCRIPT.format(n=steps)), encoding="utf-8")
        self._kfp_runs = 0

    def mlflow(self) -> Floor:
        return _timed(self.mlflow_cmd, env=self.env, cwd=self.root, marker="floor-tick")

    def kfp(self) -> Floor:
        self._kfp_runs += 1
        pipeline_root = self.root / f"kfp-floor-{self._kfp_runs}"
        return _timed([sys.executable, str(self.kfp_script), str(pipeline_root)],
                      env={**self.env, "PYTHONUNBUFFERED": "1"},
                      cwd=self.root, marker="floor-tick")


def first_step_s(summary: dict) -> float:
    """Submit to the first step's process start: both instants from our own record."""
    return min(ev["process_started"] for ev in summary["events"].values()) - summary["submitted_at"]


def paired(rounds: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def report(rounds: list[dict[str, float]], *, steps: int, max_steps: int) -> str:
    """The floors table: per line, our figure, the floor's, what is ours above it, the target."""
    for r in rounds:
        r["mlflow_first_above"] = r["mlflow_first"] - r["floor_mlflow_first"]
        r["mlflow_total_above"] = r["mlflow_total"] - (r["direct_total"] + r["floor_mlflow_total"])
        r["kfp_per_step_above"] = (r["kfp_total"] - (r["direct_total"] + r["floor_kfp_total"])) / steps
        r["floor_kfp_per_step"] = r["floor_kfp_total"] / steps
        r["argo_total_above"] = r["argo_total"] - r["direct_total"]
    m = {k: paired(rounds, k) for k in rounds[0]}
    rows = [
        ("mlflow: submit -> 1st step", m["mlflow_first"], m["floor_mlflow_first"], m["mlflow_first_above"],
         f"<= {TARGETS['mlflow_first']}"),
        ("mlflow: total vs direct+floor", m["mlflow_total"], m["direct_total"] + m["floor_mlflow_total"],
         m["mlflow_total_above"], f"<= {TARGETS['mlflow_total']}"),
        ("kfp: per step vs direct+floor", m["kfp_total"] / steps, (m["direct_total"] + m["floor_kfp_total"]) / steps,
         m["kfp_per_step_above"], f"<= {TARGETS['kfp_per_step']}"),
        ("argo: total vs direct", m["argo_total"], m["direct_total"], m["argo_total_above"], "(today +0)"),
    ]
    out = [f"{'what':<31} {'ours s':>8} {'floor s':>8} {'above s':>8}  target"]
    out += [f"{name:<31} {ours:>8.2f} {floor:>8.2f} {above:>+8.2f}  {target}"
            for name, ours, floor, above, target in rows]
    out += [
        "",
        f"floors: mlflow run (trivial) first line {m['floor_mlflow_first']:.2f} s, "
        f"exit {m['floor_mlflow_total']:.2f} s; "
        f"kfp.local (trivial, {steps} steps) exit {m['floor_kfp_total']:.2f} s ({m['floor_kfp_per_step']:.2f} s/step)",
        f"paths: direct {m['direct_total']:.2f} s (1st step {m['direct_first']:.2f}), kfp {m['kfp_total']:.2f} s "
        f"(1st {m['kfp_first']:.2f}), argo {m['argo_total']:.2f} s (1st {m['argo_first']:.2f}), "
        f"mlflow {m['mlflow_total']:.2f} s (1st {m['mlflow_first']:.2f})",
        f"medians of {len(rounds)} interleaved round(s), differences taken round by round; "
        f"{steps} steps, max_steps={max_steps}; tiny model, built-in data",
    ]
    return "\n".join(out)
