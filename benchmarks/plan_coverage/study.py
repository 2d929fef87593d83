"""Coverage study of ``llmpack plan``'s 95% intervals on held-out histories of known distribution.

    python benchmarks/plan_coverage/study.py [--seeds 12] [--sizes 5,10,30] [--tails light,heavy]
        [--gang-sizes 2,8] [--layout merged|separate] [--out DIR] [--keep-dumps DIR]
    python benchmarks/plan_coverage/study.py --report DIR/coverage.json     # the tables again

Per cell (tail x history gang size x runs x GPU type x planned gang size) and seed: both GPU types'
histories (:mod:`generators`) are written as kubectl dumps (:mod:`kubedump`) into a temporary
directory -- ``merged``: one dump holding both types (the issue's case); ``separate``: one dump per
type -- and :data:`PLAN_COMMAND` is run on them as a subprocess with ``--nodes N --json``, N = the
history's gang size and 8. Each GPU type's on-demand row is read back and its stated 95% intervals
for spin-up p50/p90 (and total p50/p90) checked against the Monte-Carlo truth (:mod:`truth`).

More in the comment below the docstring.
"""
# A refused plan (exit 2, or a row saying "too few") counts as *refused*; a GPU type with no row or a
# row saying "no measurement" as *no measurement* (a failure of "each GPU type planned from its own
# runs"); neither holds. A row estimated from more or fewer runs than its own type's is *pooled*.
# Prints the coverage table (held of seeds per cell, Wilson 95% interval, overall) and, with ``--out``,
# writes ``coverage.json`` there. The plan is run in an empty temporary working directory.

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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import generators
import kubedump
import truth as truth_mod

# The CLI is the interface. If `plan` moves (e.g. under `llmpack cluster plan`), change this one line.
PLAN_COMMAND: tuple[str, ...] = (sys.executable, "-m", "llmpack", "plan")
# Flags the study passes besides the dumps and --nodes: both GPU types asked for (a type absent from
# the history then shows as "no measurement" rather than vanishing), on-demand only.
PLAN_FLAGS: tuple[str, ...] = ("--gpu-type", ",".join(generators.GPU_TYPES), "--capacity", "on-demand", "--json")
STATED = 0.95
HEADLINES = ("spin_up_s", "total_s")
QS = ("p50", "p90")
PLAN_AT = 8                                    # every history is also planned at this gang size
CALL_TIMEOUT_S = 300


# --------------------------------------------------------------------------- reading the plan's JSON

def options_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in doc.get("options") or [] if isinstance(o, dict)]


def row_for(doc: dict[str, Any], gpu: str) -> dict[str, Any] | None:
    """The GPU type's on-demand row (any path: the histories have one, argo)."""
    rows = [o for o in options_of(doc) if o.get("gpu_type") == gpu and o.get("capacity", "on-demand") == "on-demand"]
    return rows[0] if rows else None


def interval_of(row: dict[str, Any], headline: str, q: str) -> tuple[float, float, float] | None:
    """(value, low, high) of a headline's quantile: ``times_s.<headline>.<q>`` with ``ci: [low, high]``
    (or ``low``/``high``); None when the row has none."""
    e = ((row.get("times_s") or {}).get(headline) or {}).get(q)
    if not isinstance(e, dict):
        return None
    ci = e.get("ci")
    low, high = (ci[0], ci[1]) if isinstance(ci, list) and len(ci) == 2 else (e.get("low"), e.get("high"))
    if low is None or high is None:
        return None
    return float(e.get("value", math.nan)), float(low), float(high)


def classify(row: dict[str, Any] | None) -> str:
    """estimated | refused | no_measurement (how the row answered)."""
    if row is None:
        return "no_measurement"
    if row.get("estimated") and row.get("times_s"):
        return "estimated"
    note = str(row.get("note") or "")
    return "no_measurement" if note.startswith("no measurement") or row.get("missing") else "refused"


# --------------------------------------------------------------------------- running it

def run_plan(dumps: dict[str, Path], nodes: int, cwd: Path) -> tuple[int, dict[str, Any] | None, str, float]:
    """(exit code, the JSON or None, the last stderr line, seconds)."""
    cmd = [*PLAN_COMMAND, "--pods", str(dumps["pods"]), "--nodes-dump", str(dumps["nodes"]),
           "--events", str(dumps["events"]), "--nodes", str(nodes), *PLAN_FLAGS]
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=CALL_TIMEOUT_S,
                           env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{cwd / 'unused.db'}"})
    except subprocess.TimeoutExpired:
        return 124, None, f"timed out after {CALL_TIMEOUT_S} s", time.monotonic() - t
    took = time.monotonic() - t
    last = (p.stderr.strip().splitlines() or [""])[-1]
    if p.returncode != 0:
        return p.returncode, None, last, took
    try:
        return 0, json.loads(p.stdout), last, took
    except json.JSONDecodeError:
        return 0, None, "stdout is not JSON", took


def judge(row: dict[str, Any] | None, rc: int, truth: dict[str, Any], runs: int) -> dict[str, Any]:
    """One GPU type's answer in one plan call, against the truth at the planned gang size."""
    status = classify(row) if rc == 0 else ("refused" if rc == 2 else "error")
    out: dict[str, Any] = {"status": status, "own_runs": None if row is None else row.get("own_runs")}
    out["pooled"] = status == "estimated" and out["own_runs"] is not None and out["own_runs"] != runs
    for h in HEADLINES:
        for q in QS:
            t = truth[h][q]["value"]
            iv = interval_of(row, h, q) if status == "estimated" and row is not None else None
            if iv is None:
                out[f"{h}.{q}"] = {"truth": t, "held": False, "miss": status if status != "estimated" else "missing"}
                continue
            value, low, high = iv
            held = low <= t <= high
            out[f"{h}.{q}"] = {"truth": t, "value": value, "low": low, "high": high, "held": held,
                               "miss": None if held else ("above" if t > high else "below")}
    return out


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    if n == 0:
        return math.nan, math.nan
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def study(seeds: int, sizes: Iterable[int], tails: Iterable[str], gang_sizes: Iterable[int], layout: str,
          truth: dict[str, Any], keep: Path | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every (cell, seed) result, and timing facts."""
    results: list[dict[str, Any]] = []
    calls, spent = 0, 0.0
    for tail in tails:
        for hist_n in gang_sizes:
            for runs in sizes:
                for seed in range(seeds):
                    hists = [(gpu, generators.history(tail, gpu, hist_n, runs, seed)) for gpu in generators.GPU_TYPES]
                    tag = f"{tail}-{hist_n}x{runs}-s{seed}"
                    with tempfile.TemporaryDirectory(prefix="plancov-") as tmp:
                        base = keep / tag if keep else Path(tmp)
                        sets = ({"both": kubedump.write(hists, tag, base)} if layout == "merged" else
                                {gpu: kubedump.write([(gpu, g)], tag, base / kubedump.SHORT[gpu]) for gpu, g in hists})
                        for plan_n in sorted({hist_n, PLAN_AT}):
                            for key, paths in sets.items():
                                rc, doc, last, took = run_plan(paths, plan_n, Path(tmp))
                                calls, spent = calls + 1, spent + took
                                if rc not in (0, 2):
                                    print(f"  {tag} N={plan_n}: exit {rc}: {last}", file=sys.stderr)
                                for gpu in (generators.GPU_TYPES if key == "both" else (key,)):
                                    row = row_for(doc, gpu) if doc else None
                                    t = truth["truth"][tail][gpu][str(plan_n)]
                                    results.append({"tail": tail, "hist_nodes": hist_n, "runs": runs, "gpu": gpu,
                                                    "plan_nodes": plan_n, "seed": seed, "rc": rc,
                                                    "stderr": last if rc else None, **judge(row, rc, t, runs)})
                    print(f"  {tail} {hist_n}-node x {runs} runs: seed {seed} done ({calls} calls, {spent:.0f} s)",
                          file=sys.stderr, flush=True)
    return results, {"calls": calls, "plan_seconds": round(spent, 1),
                     "seconds_per_call": round(spent / calls, 3) if calls else None}


# --------------------------------------------------------------------------- the table

CELL = ("tail", "hist_nodes", "runs", "gpu", "plan_nodes")


def summarize(results: list[dict[str, Any]], headline: str) -> dict[str, Any]:
    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in results:
        cells.setdefault(tuple(r[k] for k in CELL), []).append(r)
    rows = []
    totals = {q: [0, 0] for q in QS}
    for key, rs in cells.items():
        row: dict[str, Any] = dict(zip(CELL, key, strict=True))
        row["seeds"] = len(rs)
        row["refused"] = sum(r["status"] in ("refused", "error") for r in rs)
        row["no_measurement"] = sum(r["status"] == "no_measurement" for r in rs)
        row["pooled"] = sum(bool(r["pooled"]) for r in rs)
        for q in QS:
            k = sum(r[f"{headline}.{q}"]["held"] for r in rs)
            lo, hi = wilson(k, len(rs))
            ratios = [r[f"{headline}.{q}"]["value"] / r[f"{headline}.{q}"]["truth"] for r in rs
                      if "value" in r[f"{headline}.{q}"]]
            widths = [(r[f"{headline}.{q}"]["high"] - r[f"{headline}.{q}"]["low"]) / r[f"{headline}.{q}"]["truth"]
                      for r in rs if "value" in r[f"{headline}.{q}"]]
            row[q] = {"held": k, "of": len(rs), "wilson95": [round(lo, 3), round(hi, 3)],
                      "above": sum(r[f"{headline}.{q}"]["miss"] == "above" for r in rs),
                      "below": sum(r[f"{headline}.{q}"]["miss"] == "below" for r in rs),
                      "median_value_over_truth": round(statistics.median(ratios), 3) if ratios else None,
                      "median_width_over_truth": round(statistics.median(widths), 3) if widths else None,
                      "truth": rs[0][f"{headline}.{q}"]["truth"]}
            totals[q][0] += k
            totals[q][1] += len(rs)
        rows.append(row)
    held = sum(v[0] for v in totals.values())
    n = sum(v[1] for v in totals.values())
    overall = {q: {"held": v[0], "of": v[1], "pct": round(100 * v[0] / v[1], 1) if v[1] else None,
                   "wilson95": [round(x, 3) for x in wilson(*v)]} for q, v in totals.items()}
    overall["all"] = {"held": held, "of": n, "pct": round(100 * held / n, 1) if n else None,
                      "wilson95": [round(x, 3) for x in wilson(held, n)]}
    cells_ok = sum(all(r[q]["held"] >= math.ceil(r["seeds"] * 10 / 12) for q in QS) for r in rows)
    return {"headline": headline, "cells": rows, "overall": overall, "cells_meeting_10_of_12": cells_ok,
            "cells_total": len(rows)}


def table(summary: dict[str, Any], stated: float = STATED) -> str:
    short = {generators.H100: "h100", generators.H200: "h200"}
    lines = [f"{summary['headline']}: stated {stated:.0%} intervals, held of seeds [Wilson 95%]; "
             "miss a/b = truth above/below the interval; ref = refused, nom = no measurement, pool = "
             "estimated from runs not its own",
             f"{'tail':5} {'hist':>4} {'runs':>4} {'gpu':4} {'at':>2} | {'p50 held':>8} {'wilson':>11} {'a/b':>5} | "
             f"{'p90 held':>8} {'wilson':>11} {'a/b':>5} | ref nom pool"]
    for r in summary["cells"]:
        parts = [f"{r['tail']:5} {r['hist_nodes']:>4} {r['runs']:>4} {short[r['gpu']]:4} {r['plan_nodes']:>2}"]
        for q in QS:
            c = r[q]
            parts.append(f"{c['held']:>4}/{c['of']:<3} [{c['wilson95'][0]:.2f}-{c['wilson95'][1]:.2f}] "
                         f"{c['above']:>2}/{c['below']:<2}")
        parts.append(f"{r['refused']:>3} {r['no_measurement']:>3} {r['pooled']:>4}")
        lines.append(" | ".join(parts))
    o = summary["overall"]
    lines.append(f"overall: p50 {o['p50']['held']}/{o['p50']['of']} ({o['p50']['pct']}%), p90 {o['p90']['held']}/"
                 f"{o['p90']['of']} ({o['p90']['pct']}%), all {o['all']['held']}/{o['all']['of']} "
                 f"({o['all']['pct']}%, Wilson {o['all']['wilson95'][0]:.3f}-{o['all']['wilson95'][1]:.3f}); "
                 f"cells with both quantiles >= 10/12: {summary['cells_meeting_10_of_12']} of {summary['cells_total']}")
    return "\n".join(lines)


def by_tail_and_size(results: list[dict[str, Any]], headline: str) -> str:
    """Stated vs held per tail and history size (every GPU type and gang size together)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["tail"], r["runs"]), []).append(r)
    lines = [f"{headline} by tail and history size: stated {STATED:.0%}, held (Wilson 95%)"]
    for (tail, runs), rs in groups.items():
        parts = []
        for q in QS:
            k = sum(r[f"{headline}.{q}"]["held"] for r in rs)
            lo, hi = wilson(k, len(rs))
            parts.append(f"{q} {k}/{len(rs)} = {100 * k / len(rs):.0f}% ({100 * lo:.0f}-{100 * hi:.0f}%)")
        lines.append(f"  {tail:5} {runs:>2} runs: " + "; ".join(parts))
    return "\n".join(lines)


def report(doc: dict[str, Any]) -> None:
    results = doc["results"]
    f = doc.get("facts") or {}
    print(f"command: {' '.join(doc['command'])}; layout {doc['layout']}; {doc['seeds']} seeds; "
          f"{f.get('calls')} calls, {f.get('seconds_per_call')} s each")
    for h in HEADLINES:
        print()
        print(table(summarize(results, h)))
        print(by_tail_and_size(results, h))


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--sizes", default="5,10,30", help="runs per GPU type in a history")
    ap.add_argument("--tails", default=",".join(generators.TAILS))
    ap.add_argument("--gang-sizes", default="2,8", help="nodes per gang in the histories")
    ap.add_argument("--layout", choices=("merged", "separate"), default="merged",
                    help="both GPU types in one dump (default), or one dump per type")
    ap.add_argument("--truth", type=Path, default=truth_mod.DEFAULT_OUT)
    ap.add_argument("--out", type=Path, default=None, help="write coverage.json here")
    ap.add_argument("--keep-dumps", type=Path, default=None, help="keep every dump written under this directory")
    ap.add_argument("--report", type=Path, default=None, help="instead: print the tables of a coverage.json")
    a = ap.parse_args(argv)
    if a.report is not None:
        report(json.loads(a.report.read_text(encoding="utf-8")))
        return 0
    tails = [t for t in a.tails.split(",") if t]
    if any(t not in generators.TAILS for t in tails) or a.seeds < 1:
        print(f"--tails: of {', '.join(generators.TAILS)}; --seeds at least 1", file=sys.stderr)
        return 2
    truth = truth_mod.load(a.truth) if a.truth.is_file() else truth_mod.compute(1_000_000)
    t0 = time.monotonic()
    results, facts = study(a.seeds, _ints(a.sizes), tails, _ints(a.gang_sizes), a.layout, truth, a.keep_dumps)
    facts["wall_seconds"] = round(time.monotonic() - t0, 1)
    summaries = {h: summarize(results, h) for h in HEADLINES}
    doc = {"command": [*PLAN_COMMAND[1:], "--pods", "...", "--nodes-dump", "...", "--events", "...", "--nodes", "N",
                       *PLAN_FLAGS],
           "layout": a.layout, "seeds": a.seeds, "stated": STATED, "facts": facts, "families": truth["families"],
           "truth": truth["truth"], "summary": summaries, "results": results}
    report(doc)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "coverage.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"\nwrote {a.out / 'coverage.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
