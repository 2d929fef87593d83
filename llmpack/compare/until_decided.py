"""``llmpack compare`` with no ``--repeats``: rounds until every start-up verdict is decided, within a budget.

Spin-up and time to first step are where orchestrators differ; after finetune's first step every
path runs the same code, so repeating it measures little. So: a warm-up (not counted), round 1 (the
whole pipeline on every path, counted for everything), then start-up rounds (the pipeline through
finetune's first step, :meth:`components.dsl.Pipeline.through`), interleaved. After each round from
:data:`llmpack.compare.sequential.FIRST_LOOK` each path's start-up headlines are judged
(:mod:`llmpack.compare.sequential`); a decided path leaves the rounds, and the compare stops when
none is left, when the next round would overrun ``budget_s``, or after the design's last round.

A pipeline without a ``finetune`` task has no start-up to cut a round at and no first step: every
round runs it whole, and total and spin-up (its first step's start) are what is judged and what
decides; time to first step is not measured, so never a headline (:func:`decisive_headlines`).

The design and why stopping early cannot raise the error rate: docs/internals/comparison.md.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from components.fusion import path_label
from components.record.telemetry import TRAIN_STEP
from llmpack.compare import sequential
from llmpack.compare.comparison import (
    BEFORE_ROUNDS_TAG,
    BUDGET_TAG,
    DESIGN_TAG,
    HEADLINES,
    MAX_STEPS_TAG,
    STARTUP_TAG,
    Headline,
    Margin,
    comparison,
    verdicts,
)
from llmpack.compare.plan import ComparePlan
from llmpack.compare.rounds import begin
from llmpack.run.local import RunOptions

DEFAULT_BUDGET_S = 285.0  # 4 min 45 s of runs: `make compare` ends within 5 minutes on a quiet 2-core machine
MAX_ROUNDS = 30
MAX_ADAPT = 2.0  # a slow machine's budget grows at most to twice the default (never a --budget the user gave)
ROUND_TAG = "llmpack.round"
STARTUP_HEADLINES = tuple(h for h in HEADLINES if h.startup)
WHOLE_RUN_METRICS = ("spinup_s", "total_s")  # what decides a pipeline without finetune (spin-up: its first step's)
# A start-up run goes on for this long after its first step: the 1-step save and the run's record.
AFTER_FIRST_STEP_S = 0.6


@dataclass(frozen=True, kw_only=True)
class Path_:
    """One compared path: its backend, packaging and label."""

    backend: str
    fuse: str

    @property
    def label(self) -> str:
        return path_label(self.backend, self.fuse)


RunOne = Callable[..., dict[str, Any]]
Say = Callable[[str], None]


def parse_budget(text: str | None) -> float:
    """``--budget``: ``270`` / ``270s`` / ``4.5m`` / ``1h`` -> seconds (at least 10 s)."""
    from components.errors import InputError

    if text is None:
        return DEFAULT_BUDGET_S
    raw = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(raw[-1:], None)
    try:
        seconds = float(raw[:-1] if scale else raw) * (scale or 1.0)
    except ValueError:
        raise InputError(f"--budget {text!r}: expected a duration like 270, 270s, 4.5m or 1h") from None
    if not (10 <= seconds <= 7 * 86400 and math.isfinite(seconds)):
        raise InputError(f"--budget {text!r}: must be between 10 seconds and 7 days")
    return seconds


def warm_up(opts: RunOptions, paths: list[Path_], run: RunOne, group: str) -> None:
    """Not counted: every path's client modules loaded here (by compiling it once), then the first path's
    start-up run."""
    import tempfile
    from pathlib import Path

    from llmpack.backends import local_runner
    from llmpack.run.user_pipeline import load_pipeline

    with tempfile.TemporaryDirectory(prefix="llmpack-warmup-") as tmp:
        for p in paths:
            backend = local_runner(p.backend)
            if backend.local_module:
                importlib.import_module(backend.local_module)
            try:
                backend.compile(load_pipeline(opts.pipeline), Path(tmp) / p.label)
            except Exception:  # noqa: BLE001 - warming only
                pass  # a backend that compiles nothing, or fails here, fails in its run
    first = paths[0]
    run(replace(opts, backend=first.backend, fuse=first.fuse, run_group=group, max_steps=1),
        f"{first.label} (warm-up, not counted)", pipe=_startup_pipe(first, opts))


def _startup_pipe(path: Path_, opts: RunOptions) -> Any:
    """The pipeline a start-up round runs for ``path`` (None: the whole one, for a fused packaging, or a
    ``--pipeline`` with no training step)."""
    from llmpack.run.user_pipeline import load_pipeline

    pipe = load_pipeline(opts.pipeline)
    return pipe.through(TRAIN_STEP) if path.fuse == "none" and TRAIN_STEP in pipe.tasks else None


def compare(opts: RunOptions, backends: list[str], *, variants: list[str] | None = None, baseline: Any = "default",
            on_start: Any = None, run_one: RunOne | None = None, **kw: Any) -> dict[str, Any]:
    """``llmpack compare`` without ``--repeats``: inputs checked, then :func:`compare_until_decided` in a new run
    group."""
    plan = ComparePlan(backends=tuple(backends), variants=tuple(variants or [opts.fuse]))
    base, run_group, run = begin(opts, plan, baseline, on_start, run_one)
    return compare_until_decided(opts, [Path_(backend=b, fuse=f) for b, f in plan.paths], run=run,
                                 run_group=run_group, baseline=base, **kw)


def compare_until_decided(opts: RunOptions, paths: list[Path_], *, run: RunOne, run_group: str, baseline: str | None,
                          budget_s: float = DEFAULT_BUDGET_S, margins: dict[str, Margin] | None = None,
                          say: Say = print, clock: Callable[[], float] = time.monotonic, adapt: bool = False,
                          **extra: Any) -> dict[str, Any]:
    """The compare result after round 1 and the start-up rounds that decide (see the module doc).

    ``adapt`` (the budget was not given): when round 1 shows the machine is slow, the budget grows
    to hold the fewest rounds that judge, up to :data:`MAX_ADAPT` times itself, and says so.
    """
    from llmpack.run.user_pipeline import load_pipeline

    started = clock()
    pipe = load_pipeline(opts.pipeline)
    trains = TRAIN_STEP in pipe.tasks  # without finetune every round runs the whole pipeline, judged on total
    decisive = decisive_headlines(trains)
    warm_up(opts, paths, run, f"{run_group[:56]}-warmup")
    runs: list[dict[str, Any]] = []
    labels = [p.label for p in paths]
    plan: dict[str, Any] = {}
    max_steps = opts.max_steps if "max_steps" in pipe.params else None
    recorded: dict[str, str] = {}  # the budget and --max-steps, on start-up runs: a rebuilt report plans alike

    def one(p: Path_, k: int, startup: bool, of: int | None) -> None:
        t0 = clock()
        kind = "startup" if startup and p.fuse == "none" and trains else "full"
        o = replace(opts, backend=p.backend, fuse=p.fuse, run_group=run_group,
                    max_steps=1 if kind == "startup" else opts.max_steps)
        label = f"{p.label} (round {k}{f'/{of}' if of else ''}{', start-up' if kind == 'startup' else ''})"
        tags = {ROUND_TAG: str(k), STARTUP_TAG: kind, **({DESIGN_TAG: str(of)} if of else {}),
                # what warm-up and round 1 took, on the record: a report rebuilt from MLflow plans alike
                **({BEFORE_ROUNDS_TAG: str(plan["before_rounds_s"])} if "before_rounds_s" in plan else {}),
                **(recorded if startup else {})}
        summary = run(o, label, pipe=_startup_pipe(p, opts) if kind == "startup" else None, tags=tags)
        runs.append({**summary, "round": k, "startup": kind == "startup", "wall_s": clock() - t0,
                     "tags": {**(summary.get("tags") or {}), **tags}})

    for p in paths:
        one(p, 1, False, None)
    cost = {p.label: _startup_cost(runs, p.label) for p in paths}
    before_s = clock() - started
    plan.update({"before_rounds_s": round(before_s, 1), "round_s": round(sum(cost.values()), 1),
            "path_round_s": {k: round(v, 1) for k, v in cost.items()},
            "round1_train_s": round(sum(r["metrics"].get("train_s") or 0.0 for r in runs), 1) or None})
    adapted = None
    if adapt:
        adapted = adapt_budget(budget_s, before_s, sum(cost.values()))
        if adapted is not None:
            say(adapted["text"])
            budget_s = adapted["to_s"]
    recorded.update({BUDGET_TAG: str(budget_s), **({MAX_STEPS_TAG: str(max_steps)} if max_steps else {})})
    design = sequential.Design(max_rounds=max(sequential.FIRST_LOOK,
                                              min(MAX_ROUNDS, int(budget_s // max(sum(cost.values()), 1e-9)))))
    base = baseline
    failed = _failed_whole(runs)  # a path whose whole run failed cannot be judged: it takes no start-up rounds
    active = [p for p in paths if p.label != base and p.label not in failed]
    stopped = "decided" if base is None else "max rounds"
    if base in failed or not active and failed:
        active, stopped = [], "failed"
    k = 1
    while base is not None and active and k < design.max_rounds:
        in_round = [p for p in paths if p.label == base or p in active]
        need = sum(cost[p.label] for p in in_round)
        elapsed = clock() - started
        if elapsed + need > budget_s:
            stopped = "budget"
            break
        k += 1
        say(_round_line(k, design.max_rounds, [p.label for p in in_round], elapsed, need, budget_s, trains))
        for p in in_round:
            one(p, k, True, design.max_rounds)
        decided = _decided(runs, labels, base, design, margins, decisive)
        active = [p for p in active if not decided.get(p.label, False)]
    if base is not None and not active and stopped != "failed":
        stopped = "decided"
    return comparison(run_group, labels, runs, baseline=base, design=design, margins=margins, repeats=None,
                      warmup=None, rounds=k, stopped=stopped, budget_s=budget_s, elapsed_s=round(clock() - started, 1),
                      plan=plan, budget_adapted=adapted, max_steps=max_steps, **extra)


def adapt_budget(budget_s: float, before_s: float, round_s: float) -> dict[str, Any] | None:
    """A slow machine's budget: enough for the rounds up to the first look, if at most :data:`MAX_ADAPT` times
    the given one (None: no change needed, or too slow for any: the compare's end says what would decide)."""
    from llmpack.ui.progress import clock

    need = before_s + (sequential.FIRST_LOOK - 1) * round_s * 1.1  # a tenth to spare: rounds vary
    if need <= budget_s:
        return None
    if need > MAX_ADAPT * budget_s:
        return {"from_s": budget_s, "to_s": budget_s, "text": (
            f"this machine is slow: warm-up and round 1 took {clock(before_s)}; {sequential.FIRST_LOOK} rounds "
            f"would need {clock(need)}, over {MAX_ADAPT:g}x the {clock(budget_s)} budget: "
            "the end says what would decide")}
    to = math.ceil(need / 10.0) * 10.0
    return {"from_s": budget_s, "to_s": to, "text": (
        f"this machine is slow: warm-up and round 1 took {clock(before_s)}; budget raised from {clock(budget_s)} "
        f"to {clock(to)} so that {sequential.FIRST_LOOK} rounds, the fewest that judge, fit")}


def _failed_whole(runs: list[dict[str, Any]]) -> set[str]:
    """The paths whose round-1 (whole pipeline) run failed: a bad input fails every repeat the same way."""
    from components.fusion import path_of

    return {path_of(r) for r in runs if r.get("status") != "succeeded"}


def _startup_cost(runs: list[dict[str, Any]], label: str) -> float:
    """Seconds a start-up run of ``label`` should take, from its round-1 run: to its first step and a little after."""
    from components.fusion import path_of

    r = next(r for r in runs if path_of(r) == label)
    ttfs = r["metrics"].get("time_to_first_step_s")
    return ttfs + AFTER_FIRST_STEP_S if ttfs is not None and r.get("fuse", "none") == "none" else r["wall_s"]


def decisive_headlines(trains: bool) -> tuple[Headline, ...]:
    """The headlines whose verdicts end the rounds: spin-up and time to first step for a pipeline with
    finetune; total and spin-up (its first step's) for one without, whose every round runs it whole."""
    return STARTUP_HEADLINES if trains else tuple(h for h in HEADLINES if h.metric in WHOLE_RUN_METRICS)


def _decided(runs: list[dict[str, Any]], labels: list[str], baseline: str, design: sequential.Design,
             margins: dict[str, Margin] | None, decisive: tuple[Headline, ...] = STARTUP_HEADLINES) -> dict[str, bool]:
    """Per path: is every decisive headline it was measured on decided at this look?"""
    judged = verdicts(runs, labels, baseline, design=design, margins=margins)
    return {label: all(judged[h.metric][label]["verdict"] != "undecided" for h in decisive)
            for label in labels if label != baseline}


def _round_line(k: int, last: int, labels: list[str], elapsed: float, need: float, budget: float,
                trains: bool = True) -> str:
    """``round 3 of at most 6 (start-up): direct, kfp · 1:58 elapsed · ETA at most 2:32``."""
    from llmpack.ui.progress import clock

    eta = min(budget - elapsed, need * (last - k + 1))
    return (f"round {k} of at most {last} ({'start-up' if trains else 'whole pipeline'}): {', '.join(labels)} · "
            f"{clock(elapsed)} elapsed · ETA at most {clock(eta)}")
