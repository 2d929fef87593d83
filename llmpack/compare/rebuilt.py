"""A compare's result rebuilt from its runs in MLflow (``llmpack report --run-group``): the same keys as the
compare's own report.json, read from what the compare recorded on its runs.

The compare's flags come back from its runs' :data:`~llmpack.compare.command.ARGV_TAG` (else the pipeline and
paths); ``repeats`` and ``warmup`` from those flags, or from the runs themselves (a start-up round's design: a
compare until decided; a cluster compare: one run per path per round, no warm-up); how it ended (its design,
budget, ``plan``, ``elapsed_s``, ``stopped``...) from :data:`~llmpack.compare.outcome.OUTCOME_TAG`, which it
sets on its runs once they are done; the recommendation from the same
:func:`~llmpack.compare.recommend.recommend` as the compare's last word. A value the records cannot tell is
null, and ``not_recorded`` says why, key by key (docs/cli.md#llmpack-report).
"""

from __future__ import annotations

import json
from typing import Any

from components.fusion import path_of
from llmpack.compare.comparison import BUDGET_TAG, MAX_STEPS_TAG

NO_FLAGS = ("the compare's flags were not recorded on its runs (a compare older than the llmpack.compare_argv tag)"
            ": {what} cannot be told from them")


def rebuilt_comparison(run_group: str, names: list[str], runs: list[dict[str, Any]], *,
                       baseline: str | None = None) -> dict[str, Any]:
    """What ``llmpack compare`` wrote for these runs, as far as they tell: its flags, ``repeats``, ``warmup``,
    and until decided its ``rounds``, design, budget, ``--max-steps``, ``plan``, ``elapsed_s`` and ``stopped``
    (:mod:`llmpack.compare.outcome`), and the recommendation, with ``not_recorded`` for what they cannot tell."""
    from llmpack.compare import comparison as cmp
    from llmpack.compare.recommend import recommend

    argv = rebuilt_argv(runs, names)
    shape, unknown = compare_shape(runs, argv)
    design = shape.pop("design", None)
    result = cmp.comparison(run_group, names, runs, argv=argv, margins=cmp.parse_margins(recorded_margin(argv)),
                            design=design, **shape, **({"baseline": baseline} if baseline else {}))
    if unknown:
        result["not_recorded"] = unknown
    result["recommendation"] = recommend(result).as_dict()
    return result


def compare_shape(runs: list[dict[str, Any]], argv: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``repeats`` (fixed rounds per path; null for a compare until decided), ``warmup`` (uncounted full rounds
    per path before them; null until decided, which warms up with one start-up run instead), what the compare
    recorded of how it ended (:data:`~llmpack.compare.outcome.OUTCOME_TAG`), and until decided its ``design``
    (a :class:`~llmpack.compare.sequential.Design`, for the verdicts), ``rounds``, ``budget_s``, ``max_steps``,
    ``budget_adapted``, ``plan``, ``elapsed_s`` and ``stopped``; with the reason for each key left null unknown."""
    from llmpack.compare.command import ARGV_TAG
    from llmpack.compare.comparison import design_of
    from llmpack.compare.outcome import read_outcome
    from llmpack.compare.rounds import default_warmup

    tags = [r.get("tags") or {} for r in runs]
    recorded = any(t.get(ARGV_TAG) for t in tags)
    outcome = read_outcome(runs) or {}
    ended = {k: v for k, v in outcome.items() if k != "design_rounds"}
    per_path: dict[str, int] = {}
    for r in runs:
        per_path[path_of(r)] = per_path.get(path_of(r), 0) + 1
    repeats_flag = _flag(argv, "--repeats")
    if any(r.get("mode") == "cluster" for r in runs):  # cluster compare: N runs per path, no warm-up (refused)
        repeats = _int(repeats_flag) or max(per_path.values(), default=1)
        return {"repeats": repeats, "warmup": 0}, {}
    design = design_of(runs)
    if design is not None or "design_rounds" in outcome or (recorded and repeats_flag is None):
        return until_decided_shape(runs, argv, outcome, design)
    delays = _delays(argv, runs) if "injected_start_delay_s" not in ended else {}
    if repeats_flag is not None:
        repeats = _int(repeats_flag) or max(per_path.values(), default=1)
        warmup = _int(_flag(argv, "--warmup"))
        return {"repeats": repeats, "warmup": default_warmup(repeats) if warmup is None else warmup, **ended,
                **delays}, {}
    # an older compare, its flags unrecorded: N runs per path with no design are --repeats N (one run each may
    # also be a compare until decided that stopped after round 1); its --warmup ran in another run group
    most = max(per_path.values(), default=1)
    unknown = {"warmup": NO_FLAGS.format(what="--warmup (its runs are in the run group <run group>-warmup)")}
    if most > 1:
        return {"repeats": most, "warmup": None}, unknown
    unknown["repeats"] = NO_FLAGS.format(what="--repeats 1 or a compare until decided stopped after round 1")
    return {"repeats": None, "warmup": None}, unknown


NO_OUTCOME = ("not recorded: the compare tags its runs with how it ended (llmpack.compare_outcome) once they are "
              "done, and these runs lack that tag (a compare older than it, or one whose store refused the tag)")
WHY_UNKNOWN = {
    "design": "; without the rounds its budget held, verdicts and `to decide:` are judged as fixed rounds",
    "budget_s": " and no --budget was given (the default, raised on a slow machine)",
    "budget_adapted": " and no --budget was given",
    "max_steps": " and no start-up round carries it",
    "plan": "; `to decide:` plans from the start-up runs' times where there are any",
    "elapsed_s": "", "stopped": "",
}


def until_decided_shape(runs: list[dict[str, Any]], argv: list[str], outcome: dict[str, Any],
                        design: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """A compare until decided's keys: from its recorded outcome; else from its start-up runs' tags (design,
    budget, ``--max-steps``) and its flags (``--budget`` given: that budget, never raised); else null and why."""
    from components.errors import InputError
    from llmpack.compare import sequential
    from llmpack.compare.until_decided import parse_budget

    tags = [r.get("tags") or {} for r in runs]
    shape: dict[str, Any] = {"repeats": None, "warmup": None,
                             "rounds": max((_int(t.get("llmpack.round")) or 1 for t in tags), default=1)}
    shape.update({k: v for k, v in outcome.items() if k != "design_rounds"})
    if outcome.get("design_rounds"):
        design = sequential.Design(max_rounds=outcome["design_rounds"])
    shape["design"] = design
    budget = _flag(argv, "--budget")
    fallback = {"budget_s": _float(_one(tags, BUDGET_TAG)), "max_steps": _int(_one(tags, MAX_STEPS_TAG))}
    if budget is not None:
        try:
            fallback = {"budget_s": parse_budget(budget), **{k: v for k, v in fallback.items() if v is not None},
                        "budget_adapted": None}
        except InputError:
            pass
    if "injected_start_delay_s" not in outcome:
        shape.update(_delays(argv, runs))
    unknown: dict[str, str] = {}
    for key, why in WHY_UNKNOWN.items():
        if key in outcome or (key == "design" and design is not None):
            continue
        if fallback.get(key) is not None or (key in fallback and key == "budget_adapted"):
            shape[key] = fallback[key]
            continue
        shape[key] = None
        unknown[key] = NO_OUTCOME + why
    return shape, unknown


def _delays(argv: list[str], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``injected_start_delay_s`` from the recorded ``--inject-start-delay`` (its paths: the runs' backends)."""
    from llmpack.compare.rounds import parse_start_delays

    text = _flag(argv, "--inject-start-delay")
    if text is None:
        return {}
    try:
        delays = parse_start_delays(text, list(dict.fromkeys(str(r.get("orchestrator")) for r in runs)))
    except Exception:  # noqa: BLE001 - store data: a value the compare would have refused is not shown
        return {}
    return {"injected_start_delay_s": delays} if delays else {}


def rebuilt_argv(runs: list[dict[str, Any]], names: list[str]) -> list[str]:
    """The compare flags a report rebuilt from MLflow can tell from its runs, for its `to decide:` command and its
    margins: the compare's own (its runs' ``llmpack.compare_argv`` tag: trials 9 and 10), else its ``--pipeline``
    (``llmpack.pipeline_ref``) and its ``--backends`` when not the default (runs of an older compare)."""
    from llmpack.compare.command import ARGV_TAG
    from llmpack.compare.comparison import DEFAULT_BACKENDS
    from llmpack.run.local import PIPELINE_REF_TAG

    recorded = {r["tags"].get(ARGV_TAG) for r in runs}  # the compare's own flags, when every run carries the same
    if len(recorded) == 1 and (given := _flags(next(iter(recorded)))) is not None:
        return given
    refs = {r["tags"].get(PIPELINE_REF_TAG) for r in runs}
    argv = ["--pipeline", str(next(iter(refs)))] if len(refs) == 1 and None not in refs else []
    if set(names) != set(DEFAULT_BACKENDS):  # the paths the compare ran: its `to decide:` runs those only
        argv += ["--backends", ",".join(names)]
    return argv


def _flags(text: Any) -> list[str] | None:
    """A run's recorded compare flags (store data: a list of at most 200 short strings, else None)."""
    try:
        flags = json.loads(text) if isinstance(text, str) and len(text) <= 4000 else None
    except (ValueError, RecursionError):
        return None
    ok = isinstance(flags, list) and len(flags) <= 200 and all(isinstance(f, str) and len(f) <= 500 for f in flags)
    return flags if ok else None


def recorded_margin(argv: list[str]) -> str | None:
    """``--margin``'s value among a compare's recorded flags, so that a rebuilt report judges as the compare did."""
    return _flag(argv, "--margin")


def _flag(argv: list[str], name: str) -> str | None:
    """The value of ``name`` among recorded flags (``--name V`` or ``--name=V``; the last one given), else None."""
    found = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(f"{name}="):
            found = arg.split("=", 1)[1]
    return found


def _one(tags: list[dict[str, Any]], key: str) -> Any:
    """The one value of ``key`` the runs that carry it agree on, else None."""
    values = {t[key] for t in tags if t.get(key) is not None}
    return next(iter(values)) if len(values) == 1 else None


def _int(text: Any) -> int | None:
    try:
        value = int(str(text))
    except (TypeError, ValueError):
        return None
    return value if 0 <= value <= 1_000_000 else None


def _float(text: Any) -> float | None:
    try:
        value = float(str(text))
    except (TypeError, ValueError):
        return None
    return value if 0 < value < 1e9 else None
