"""Re-measure the published figures and rewrite the sections that hold them.

    python benchmarks/readme_figures.py            # measure (about 6 minutes on 2 cores), rewrite the files
    python benchmarks/readme_figures.py --check    # measure, print, leave the files alone

How to run it, what it prints and why: docs/internals/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MEASUREMENTS = REPO / "docs" / "internals" / "measurements.md"
BIN = Path(sys.executable).parent
SECTIONS = ("compare", "table", "overhead", "spinup", "spinup-quick", "gc", "upload")
# The file each section is written into: the Quickstart's output in the README, the rest with the lab notes.
TARGETS: dict[str, Path] = {name: README if name == "compare" else MEASUREMENTS for name in SECTIONS}
COMPARE_ARGS: list[str] = []  # exactly what `make compare` runs


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    return {**env, "COLUMNS": "80", "HF_HUB_OFFLINE": "1", "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"}


def timed(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc


def measure_script(script: str, *args: str, table_from: str = "") -> str:
    """A benchmark's output as a section: from its first line starting ``table_from`` (all of it by default)."""
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        _, out = timed([sys.executable, str(REPO / "benchmarks" / script), *args], Path(tmp))
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(table_from))
    return ("```\n" + "\n".join(lines[start:]).rstrip() + "\n```\n\n"
            f"(Measured {time.strftime('%Y-%m-%d', time.gmtime())}; 1-minute load average {load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after.)")


def measure() -> dict[str, str]:
    sections: dict[str, str] = {}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _, imports = timed([sys.executable, str(REPO / "benchmarks" / "import_time.py")], work)
        import_line = imports.stdout.splitlines()[0].split(": ", 1)[1]
        heavy = imports.stdout.splitlines()[1].split(": ", 1)[1]

        (work / "run").mkdir()
        run_wall, run = timed([str(BIN / "llmpack"), "run", "--json"], work / "run")
        metrics = json.loads(run.stdout)["metrics"]

        (work / "compare").mkdir()
        compare_wall, compare = timed([str(BIN / "llmpack"), "compare", *COMPARE_ARGS], work / "compare")
        _, overhead = timed([sys.executable, str(REPO / "benchmarks" / "overhead.py"), "--repeats", "3"], work)
    load_after = os.getloadavg()[0]

    table_text = compare.stdout.rstrip("\n")
    sections["compare"] = (
        "What it printed on the 2-core, 24 GiB CPU machine this project is developed on\n"
        f"(`COLUMNS=80 llmpack compare{''.join(' ' + a for a in COMPARE_ARGS)}`, in a new directory;\n"
        f"{compare_wall:.0f} s of wall time from start to report, including creating the MLflow database):\n\n"
        f"```\n{table_text}\n```"
    )
    sections["table"] = "\n".join([
        "| what | command | figure |",
        "|---|---|---|",
        f"| `import components` | `python benchmarks/import_time.py` | {import_line}; "
        f"heavy modules imported: {heavy} |",
        f"| `llmpack run --backend direct` (defaults, 60 steps) | `time llmpack run` | {run_wall:.0f} s wall, "
        f"including creating the MLflow database (goal: under 60 s); eval loss {metrics['eval_loss']:.2f} tuned "
        f"vs {metrics['base_eval_loss']:.2f} base |",
        f"| `llmpack compare` (four paths, until decided) | `time llmpack compare` | {compare_wall:.0f} s wall "
        "for all four paths (goal: under 5 minutes, with every start-up verdict decided) |",
        "",
        f"(Measured {time.strftime('%Y-%m-%d', time.gmtime())}; 1-minute load average {load_before:.1f} before, "
        f"{load_after:.1f} after: the machine is shared, so wall times move with it.)",
    ])
    lines = overhead.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("path "))
    sections["overhead"] = "```\n" + "\n".join(lines[start:]).rstrip() + "\n```"
    return sections


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- figures:{name} -->\n)(?:.*?\n)?(<!-- /figures:{name} -->)", re.S)  # empty too


def rewrite(text: str, sections: dict[str, str], where: str = "README.md") -> str:
    for name, body in sections.items():
        pattern = _pattern(name)
        if not pattern.search(text):
            raise SystemExit(f"{where} has no <!-- figures:{name} --> ... <!-- /figures:{name} --> markers")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


def missing_markers(names: list[str] | tuple[str, ...] = SECTIONS) -> list[str]:
    """The sections whose markers are not in their target file (checked before measuring for minutes)."""
    texts = {path: path.read_text(encoding="utf-8") for path in {TARGETS[n] for n in names}}
    return [f"{n} ({TARGETS[n].relative_to(REPO)})" for n in names if not _pattern(n).search(texts[TARGETS[n]])]


def write(sections: dict[str, str]) -> None:
    """Rewrite each target file's sections, atomically per file."""
    for path in sorted({TARGETS[n] for n in sections}):
        mine = {n: body for n, body in sections.items() if TARGETS[n] == path}
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(rewrite(path.read_text(encoding="utf-8"), mine, str(path.relative_to(REPO))), encoding="utf-8")
        os.replace(tmp, path)
        print(f"rewrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="print the figures; do not rewrite any file")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help="comma-separated sections to measure (default: all)")
    args = parser.parse_args()
    wanted = {s.strip() for s in args.sections.split(",") if s.strip()}
    unknown = wanted - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: unknown {', '.join(sorted(unknown))}")
    if not args.check and (missing := missing_markers(sorted(wanted))):
        parser.error(f"no <!-- figures:NAME --> markers for: {', '.join(missing)}")
    sections = {k: v for k, v in measure().items() if k in wanted} if wanted & {"compare", "table", "overhead"} else {}
    if "spinup" in wanted:
        sections["spinup"] = measure_script("spinup.py", "--pairs", "10", table_from="path ")
    if "spinup-quick" in wanted:
        sections["spinup-quick"] = measure_script("spinup.py", "--pairs", "5", "--max-steps", "10", table_from="path ")
    if "gc" in wanted:
        sections["gc"] = measure_script("gc_startup.py", "--rounds", "5")
    if "upload" in wanted:
        sections["upload"] = measure_script("step_upload.py", "--rounds", "3", table_from="run ")
    for name, body in sections.items():
        print(f"--- {name}\n{body}\n")
    if not args.check:
        write(sections)


if __name__ == "__main__":
    main()
