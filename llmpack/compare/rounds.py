"""A local compare's rounds: every input checked, the run group named, each path run ``repeats`` times
interleaved (warm-up rounds first, in their own group), and ``--inject-start-delay``'s known difference.

The verdicts over the runs are :mod:`llmpack.compare.comparison`'s; running until decided is
:mod:`llmpack.compare.until_decided`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from components import settings
from components.errors import InputError
from components.servers.submission import new_id
from llmpack.compare.comparison import Margin, check_baseline, comparison, default_baseline
from llmpack.compare.plan import ComparePlan, PlannedRun, run_all
from llmpack.run.local import RunOptions, prepare
from llmpack.ui.progress import note


def begin(opts: RunOptions, plan: ComparePlan, baseline: Any, on_start: Any,
          run_one: Any) -> tuple[str | None, str, Any]:
    """Before a local compare's first run: every input checked, the run group named and announced.

    Returns the baseline, the run group and the function that runs one pipeline,
    ``run(opts, label, **kw)`` (:func:`llmpack.run.local.run_pipeline`'s keywords: ``pipe``, ``tags``).
    """
    base = default_baseline(plan.labels) if baseline == "default" else baseline
    check_baseline(base, plan.labels)
    for backend, fuse in plan.paths:
        prepare(replace(opts, backend=backend, fuse=fuse))  # all input checks before the first run starts
    run_group = opts.run_group or new_id("rg")
    if on_start is not None:
        on_start(run_group)
    if run_one is not None:  # the command's own runner (a live status line): a measurement all the same
        return base, run_group, lambda o, label, **kw: run_one(replace(o, register_version=False), label, **kw)
    from llmpack.run.local import run_pipeline

    def run(o: RunOptions, label: str, **kw: Any) -> dict[str, Any]:
        return run_pipeline(replace(o, register_version=False), **kw)  # a measurement: no model version per round

    return base, run_group, run


def compare(
    opts: RunOptions,
    backends: list[str],
    repeats: int,
    *,
    run_one: Any = None,
    baseline: Any = "default",
    on_start: Any = None,
    variants: list[str] | None = None,
    warmup: int | None = None,
    margins: dict[str, Margin] | None = None,
    say: Callable[[str], None] = note,
) -> dict[str, Any]:
    """Every path ``repeats`` times, interleaved (a, b, c, a, b, c...), in one run group; every headline
    judged at one look after the last round. (Without ``--repeats``, the CLI runs
    :func:`llmpack.compare.until_decided.compare_until_decided` instead.)

    A path is a backend, or with ``variants`` (fusion modes) each backend in each packaging
    (``direct``, ``direct+fuse-gpu``...). ``on_start(run_group)`` is called once every input is
    checked, before the first run.

    ``warmup`` full rounds come first and are not counted (default: 1 when ``repeats`` > 1, as
    hyperfine does): the first run on a machine loads torch and transformers from a cold page
    cache. Measured on a quiet 2-core machine: the first run's finetune took 9.3 s from process
    start to a loaded model, the next four 6.0-6.3 s. Warm-up runs go to their own run group
    (``<run group>-warmup``), so ``llmpack report --run-group`` never mixes them in.

    A round (a warm-up one too) in which every path failed in the same step with the same error ends
    the compare: ``say`` gets one line, and the result (``stopped: "failed"``) keeps those failures
    for the report; the rounds left would only repeat them.
    """
    plan = ComparePlan(backends=tuple(backends), variants=tuple(variants or [opts.fuse]), repeats=repeats,
                       warmup=default_warmup(repeats) if warmup is None else warmup)
    base, run_group, run = begin(opts, plan, baseline, on_start, run_one)

    def in_group(group: str) -> Callable[[PlannedRun], dict[str, Any]]:
        def one(r: PlannedRun) -> dict[str, Any]:
            summary = run(replace(opts, backend=r.backend, fuse=r.fuse, run_group=group), r.label)
            return summary if r.warmup else {**summary, "round": r.round}
        return one

    width = len(plan.paths)
    warm, counted = plan.runs(warmup=True), plan.runs()
    warm_group = f"{run_group[:56]}-warmup"
    for start in range(0, len(warm), width):
        done = run_all(warm[start:start + width], in_group(warm_group))
        if (way := failed_alike(done)) is not None:  # the counted rounds would fail the same way: none is run
            say(stopped_line("the warm-up round", way, f"its runs are in run group {warm_group}: llmpack report "
                             f"--run-group {warm_group}"))
            # the report is the warm-up group's, the one that holds these runs (trial 7: it named an empty group)
            return comparison(warm_group, plan.labels, done, baseline=base, margins=margins, repeats=repeats,
                              warmup=plan.warmup, rounds=0, stopped="failed", stopped_why=way)
    runs: list[dict[str, Any]] = []
    for start in range(0, len(counted), width):
        runs += run_all(counted[start:start + width], in_group(run_group))
        if (way := failed_alike(runs[start:]) if start + width < len(counted) else None) is not None:
            rounds = start // width + 1
            say(stopped_line(f"round {rounds} of {repeats}", way, "the report lists the failures"))
            return comparison(run_group, plan.labels, runs, baseline=base, margins=margins, repeats=repeats,
                              warmup=plan.warmup, rounds=rounds, stopped="failed", stopped_why=way)
    return comparison(run_group, plan.labels, runs, baseline=base, margins=margins, repeats=repeats, warmup=plan.warmup)


def failed_alike(runs: list[dict[str, Any]]) -> str | None:
    """The one error of a round whose every run failed, in the same step with the same error; else None.

    A bad input or a bug in a step fails every round the same way: the rounds left would only repeat it."""
    if not runs or any(r.get("status") == "succeeded" for r in runs):
        return None
    ways = {(r.get("failed_step"), r.get("error")) for r in runs}
    if len(ways) != 1:
        return None
    (step, error), = ways
    return str(error or (f"step {step!r} failed" if step else "failed"))


def stopped_line(where: str, way: str, then: str) -> str:
    """``stopped: every path failed the same way in round 1 of 3 (step 'x' failed: ...); ...``: one line."""
    return f"stopped: every path failed the same way in {where} ({way}); no further rounds run; {then}"


def default_warmup(repeats: int) -> int:
    """Warm-up runs per path when not given: one when the runs are repeated (for verdicts), else none."""
    return 1 if repeats > 1 else 0


def parse_start_delays(text: str | None, backends: list[str]) -> dict[str, float]:
    """``--inject-start-delay``: ``2`` (every path) or ``argo=3[,kfp=1]`` (those paths) -> {path: seconds}."""
    if text is None or not text.strip():
        return {}
    out: dict[str, float] = {}
    items = [i.strip() for i in text.split(",") if i.strip()]
    for item in items:
        name, sep, value = item.rpartition("=")
        if sep and name not in backends:
            raise InputError(f"--inject-start-delay {item!r}: {name!r} is not among the compared paths "
                             f"({', '.join(backends)})")
        try:
            seconds = float(value)
        except ValueError:
            raise InputError(f"--inject-start-delay {item!r}: expected SECONDS or PATH=SECONDS, e.g. argo=3") from None
        if not 0 <= seconds < 3600:
            raise InputError(f"--inject-start-delay {item!r}: seconds must be >= 0 and < 3600")
        if not sep and len(items) > 1:
            raise InputError(f"--inject-start-delay {text!r}: give either SECONDS for every path or PATH=SECONDS items")
        for path in ([name] if sep else backends):
            out[path] = seconds
    return {p: s for p, s in out.items() if s > 0}


def start_delay_env(delays: dict[str, float], backend: str) -> dict[str, str] | None:
    """The step environment that delays ``backend``'s finetune process start (None: no injection)."""


    return {settings.INJECT_START_DELAY.name: f"finetune={delays[backend]}"} if backend in delays else None
